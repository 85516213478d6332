"""DuckDB connection helpers: one file, one writer at a time, tables created from declared schemas.

DuckDB allows one writing process per file, and even a read-only connection blocks writers in other processes, so
every connection (read or write) is taken under an exclusive lock file next to the database and held briefly.
Each write replaces a table (or one partition) and records where its rows came from (`lineage.builds`) in one
transaction: a process killed mid-write leaves the previous rows and their provenance, never half of either.
"""

from __future__ import annotations

import fcntl
import json
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from dice_pipeline.schemas import TableSpec, conform, empty_frame

_DUCKDB_TYPES = {
    pl.String: "VARCHAR",
    pl.Float64: "DOUBLE",
    pl.Float32: "FLOAT",
    pl.Int64: "BIGINT",
    pl.Int32: "INTEGER",
    pl.Boolean: "BOOLEAN",
}


def duckdb_type(dtype: pl.DataType) -> str:
    if isinstance(dtype, pl.List):
        return f"{duckdb_type(dtype.inner)}[]"
    for polars_type, sql_type in _DUCKDB_TYPES.items():
        if dtype == polars_type:
            return sql_type
    raise TypeError(f"no DuckDB type declared for polars dtype {dtype}")


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


# One row per table (and partition: "" for an unpartitioned table): the source its current rows were built from.
BUILDS_TABLE = "lineage.builds"
_BUILDS_DDL = f"""CREATE TABLE IF NOT EXISTS {BUILDS_TABLE} (
    table_name VARCHAR NOT NULL,
    partition_key VARCHAR NOT NULL,
    source_name VARCHAR,
    source_sha256 VARCHAR,
    derived_from VARCHAR,
    run_id VARCHAR,
    written_at TIMESTAMPTZ,
    PRIMARY KEY (table_name, partition_key)
)"""


class _InterruptWatch:
    """The connection a SIGINT should stop (set once it is open) and the interrupt the handler raised, if any."""

    def __init__(self) -> None:
        self.connection: duckdb.DuckDBPyConnection | None = None
        self.pending: list[BaseException] = []


@contextmanager
def _interrupts_reach_the_caller() -> Iterator[_InterruptWatch]:
    """Ctrl-C while DuckDB works (opening, querying, closing) stops it and reaches the caller as the interrupt it was.

    Left alone, DuckDB turns the KeyboardInterrupt (or Dagster's interrupt error, inside a step) raised while it
    works into `RuntimeError('Query interrupted')`, which Dagster reports as an ordinary step failure before going
    on with the steps that do not depend on it; and at times DuckDB drops the interrupt (while opening the file, or
    mid-query) and runs on to the query's end, seconds to minutes later. So from before the connection is opened
    until it is closed, on the main thread, the SIGINT handler in force (Python's, or Dagster's) is wrapped: when it
    raises, the open connection's query is stopped (`interrupt()`, which makes DuckDB raise at once; the
    connection's next statement, a ROLLBACK say, runs normally), the exception is kept and, on leaving the block,
    that same exception is raised, whatever DuckDB made of it. A handler that only records the signal (Dagster
    outside a step) is left to do so. Signal handlers belong to the main thread: elsewhere nothing is wrapped.
    """
    watch = _InterruptWatch()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield watch
        return

    def on_sigint(signum, frame) -> None:
        try:
            previous(signum, frame)
        except BaseException as interrupt:
            watch.pending.append(interrupt)
            if watch.connection is not None:
                watch.connection.interrupt()
            raise

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield watch
    except BaseException as error:
        if watch.pending and error is not watch.pending[0]:
            raise watch.pending[0] from error
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if watch.pending:  # DuckDB dropped it
        raise watch.pending[0]


@dataclass(frozen=True)
class Provenance:
    """Where a table's rows came from: the source (e.g. "embedded", "parquet:/data/x.parquet") and the hash of its
    content as read. `derived_from` names the table whose source this one inherits (None for a source table itself):
    the lineage views mark a build stale when that table has since been rebuilt from another source or content."""

    source_name: str | None
    source_sha256: str | None
    derived_from: str | None = None
    run_id: str | None = None


class Warehouse:
    """The project's DuckDB warehouse at `path`. Every method opens and closes its own locked connection."""

    def __init__(self, path: str | Path, lock_timeout_s: float = 600.0):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock_file:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"warehouse {self.path} stayed locked for {self.lock_timeout_s:.0f}s "
                            "(another process is writing or holds a connection)"
                        ) from None
                    time.sleep(0.05)
            try:
                with _interrupts_reach_the_caller() as watch:
                    con = watch.connection = duckdb.connect(str(self.path))
                    try:
                        yield con
                    finally:
                        con.close()
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    # --- tables -------------------------------------------------------------------------------------------
    @staticmethod
    def _ensure_table(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> None:
        """Create the table from its declared schema, or add declared columns an older version lacked."""
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(spec.schema_name)}")
        columns = ", ".join(f"{_quote(n)} {duckdb_type(t)}" for n, t in spec.schema.items())
        con.execute(f"CREATE TABLE IF NOT EXISTS {spec.qualified_name} ({columns})")
        existing = {
            row[0]
            for row in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
                [spec.schema_name, spec.table_name],
            ).fetchall()
        }
        for name, dtype in spec.schema.items():
            if name not in existing:
                con.execute(f"ALTER TABLE {spec.qualified_name} ADD COLUMN {_quote(name)} {duckdb_type(dtype)}")

    @staticmethod
    def _ensure_builds_table(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("CREATE SCHEMA IF NOT EXISTS lineage")
        con.execute(_BUILDS_DDL)

    def write(
        self,
        spec: TableSpec,
        frame: pl.DataFrame,
        partition_key: str | None = None,
        provenance: Provenance | None = None,
    ) -> int:
        """Replace the table (or, for a partitioned table, the rows of `partition_key`) with `frame`, and record
        `provenance` for it, in one transaction.

        An empty frame still creates the table, so downstream readers always find it. Returns rows written.
        """
        frame = conform(frame, spec.schema)
        if spec.partition_column is not None:
            if partition_key is None:
                raise ValueError(f"{spec.qualified_name} is partitioned by {spec.partition_column}: give a key")
            stray = frame.filter(pl.col(spec.partition_column) != partition_key)
            if stray.height:
                raise ValueError(
                    f"{stray.height} rows of {spec.qualified_name} carry another partition than {partition_key!r}"
                )
        column_list = ", ".join(_quote(n) for n in spec.schema.names())
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                self._ensure_table(con, spec)
                if spec.partition_column is None:
                    con.execute(f"DELETE FROM {spec.qualified_name}")
                else:
                    con.execute(
                        f"DELETE FROM {spec.qualified_name} WHERE {_quote(spec.partition_column)} = ?",
                        [partition_key],
                    )
                if frame.height:
                    con.register("incoming_frame", frame.to_arrow())
                    con.execute(
                        f"INSERT INTO {spec.qualified_name} ({column_list}) SELECT {column_list} FROM incoming_frame"
                    )
                    con.unregister("incoming_frame")
                if provenance is not None:
                    self._ensure_builds_table(con)
                    con.execute(
                        f"INSERT OR REPLACE INTO {BUILDS_TABLE} VALUES (?, ?, ?, ?, ?, ?, now())",
                        [spec.table_name, partition_key if spec.partition_column else "", provenance.source_name,
                         provenance.source_sha256, provenance.derived_from, provenance.run_id],
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return frame.height

    def read(self, spec: TableSpec, partition_keys: Sequence[str] | None = None) -> pl.DataFrame:
        """Read a table as a frame of its declared schema; an absent table reads as an empty frame."""
        column_list = ", ".join(_quote(n) for n in spec.schema.names())
        with self.connect() as con:
            if not self._table_exists(con, spec):
                return empty_frame(spec.schema)
            sql = f"SELECT {column_list} FROM {spec.qualified_name}"
            params: list = []
            if spec.partition_column is not None and partition_keys is not None:
                sql += f" WHERE {_quote(spec.partition_column)} IN (SELECT unnest(?))"
                params.append(list(partition_keys))
            frame = con.execute(sql, params).pl()
        if frame.height == 0:
            return empty_frame(spec.schema)
        return conform(frame, spec.schema)

    def provenance(self, table_name: str, partition_key: str | None = None) -> Provenance | None:
        """The recorded provenance of a table (or partition), or None where nothing was recorded."""
        with self.connect() as con:
            self._ensure_builds_table(con)
            row = con.execute(
                f"SELECT source_name, source_sha256, derived_from, run_id FROM {BUILDS_TABLE} "
                "WHERE table_name = ? AND partition_key = ?",
                [table_name, partition_key or ""],
            ).fetchone()
        return None if row is None else Provenance(*row)

    @staticmethod
    def _table_exists(con: duckdb.DuckDBPyConnection, spec: TableSpec) -> bool:
        return bool(
            con.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                [spec.schema_name, spec.table_name],
            ).fetchone()[0]
        )

    def query(self, sql: str, params: Sequence | None = None) -> pl.DataFrame:
        with self.connect() as con:
            return con.execute(sql, list(params or [])).pl()

    def install_views(self, sql_text: str, specs: Sequence[TableSpec]) -> None:
        """(Re)create the lineage views; the tables they read are created empty first if absent."""
        with self.connect() as con:
            for spec in specs:
                self._ensure_table(con, spec)
            self._ensure_builds_table(con)
            con.execute(sql_text)

    def describe(self) -> str:
        """A JSON summary of every table and its row count, for `dice` and the docs."""
        with self.connect() as con:
            rows = con.execute(
                "SELECT table_schema, table_name, table_type FROM information_schema.tables "
                "WHERE table_schema NOT IN ('information_schema', 'pg_catalog') ORDER BY 1, 2"
            ).fetchall()
            summary = []
            for schema_name, table_name, table_type in rows:
                count = con.execute(f"SELECT count(*) FROM {_quote(schema_name)}.{_quote(table_name)}").fetchone()[0]
                summary.append({"table": f"{schema_name}.{table_name}", "type": table_type, "rows": count})
        return json.dumps(summary, indent=2)
