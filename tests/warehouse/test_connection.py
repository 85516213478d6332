"""The DuckDB warehouse: empty tables, partition replacement, schema growth, serialized writers."""

import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from dice_pipeline.schemas import TableSpec
from warehouse import TABLES, Provenance, Warehouse, install_lineage_views

SPEC = TableSpec("demo", "scores", pl.Schema({"threshold_key": pl.String, "uuid": pl.String,
                                               "score": pl.Float64, "tags": pl.List(pl.String)}), "threshold_key")
PLAIN = TableSpec("demo", "plain", pl.Schema({"uuid": pl.String, "n": pl.Int64}))


def _frame(key, n):
    return pl.DataFrame({"threshold_key": [key] * n, "uuid": [f"u{i}" for i in range(n)],
                         "score": [float(i) for i in range(n)], "tags": [["a"]] * n}, schema=SPEC.schema)


def test_empty_result_is_still_a_table(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    assert wh.write(PLAIN, pl.DataFrame(schema=PLAIN.schema)) == 0
    assert wh.query("SELECT count(*) AS n FROM demo.plain")["n"][0] == 0
    assert wh.read(PLAIN).schema == PLAIN.schema


def test_partitions_are_replaced_independently(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.write(SPEC, _frame("2.0", 3), partition_key="2.0")
    wh.write(SPEC, _frame("1.5", 5), partition_key="1.5")
    wh.write(SPEC, _frame("2.0", 1), partition_key="2.0")  # rerun at 2.0 replaces only 2.0
    assert wh.read(SPEC, ["2.0"]).height == 1
    assert wh.read(SPEC, ["1.5"]).height == 5
    assert wh.read(SPEC).height == 6
    assert wh.read(SPEC, ["2.0"])["tags"].to_list() == [["a"]]


def test_rows_of_another_partition_are_refused(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    with pytest.raises(ValueError, match="another partition"):
        wh.write(SPEC, _frame("1.5", 2), partition_key="2.0")


def test_declared_column_added_later_is_migrated(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.write(PLAIN, pl.DataFrame({"uuid": ["a"], "n": [1]}, schema=PLAIN.schema))
    grown = TableSpec("demo", "plain", pl.Schema({"uuid": pl.String, "n": pl.Int64, "note": pl.String}))
    wh.write(grown, pl.DataFrame({"uuid": ["b"], "n": [2], "note": ["new"]}, schema=grown.schema))
    assert wh.read(grown).to_dicts() == [{"uuid": "b", "n": 2, "note": "new"}]


WRITER_SCRIPT = """
import sys, polars as pl
from dice_pipeline.schemas import TableSpec
from warehouse import Warehouse
schema = pl.Schema({"uuid": pl.String, "n": pl.Int64})
wh = Warehouse(sys.argv[1])
spec = TableSpec("demo", "w" + sys.argv[2], schema)
for i in range(15):
    wh.write(spec, pl.DataFrame({"uuid": [str(i)], "n": [i]}, schema=schema))
"""


def test_concurrent_writers_in_separate_processes_are_serialized(tmp_path):
    # Without the lock, DuckDB refuses a second process's connection ("Could not set lock on file").
    path = tmp_path / "w.duckdb"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path), str(w)]) for w in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    wh = Warehouse(path)
    assert [wh.query(f"SELECT n FROM demo.w{w}")["n"].to_list() for w in range(3)] == [[14]] * 3


def test_lineage_views_install_on_an_empty_warehouse(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    install_lineage_views(wh)
    for view in ("pair_verification", "filter_lineage", "threshold_summary", "rejections", "table_sources"):
        assert wh.query(f"SELECT count(*) AS n FROM lineage.{view}")["n"][0] == 0
    assert set(TABLES) >= {"concur_pairs", "verified_pairs", "speedup_filtered_pairs"}


def test_each_write_records_its_source_and_the_views_mark_stale_builds(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    upstream = TableSpec("demo", "concur_pairs", PLAIN.schema)
    wh.write(upstream, pl.DataFrame({"uuid": ["a"], "n": [1]}, schema=PLAIN.schema),
             provenance=Provenance("jsonl:a.jsonl", "aaa"))
    for key in ("1.5", "2.0"):
        wh.write(SPEC, _frame(key, 1), key, provenance=Provenance("jsonl:a.jsonl", "aaa", "concur_pairs"))
    assert wh.provenance("concur_pairs") == Provenance("jsonl:a.jsonl", "aaa")
    assert wh.provenance("scores", "2.0").derived_from == "concur_pairs"
    # The source changes and only 2.0 is rebuilt: 1.5 is now from another source than the pairs, and says so.
    wh.write(upstream, pl.DataFrame({"uuid": ["b"], "n": [2]}, schema=PLAIN.schema),
             provenance=Provenance("parquet:b.parquet", "bbb"))
    wh.write(SPEC, _frame("2.0", 1), "2.0", provenance=Provenance("parquet:b.parquet", "bbb", "concur_pairs"))
    install_lineage_views(wh)
    rows = wh.query("SELECT table_name, partition_key, source_name, stale FROM lineage.table_sources "
                    "WHERE table_name IN ('concur_pairs', 'scores') ORDER BY 1, 2").rows()
    assert rows == [("concur_pairs", "", "parquet:b.parquet", False),
                    ("scores", "1.5", "jsonl:a.jsonl", True),
                    ("scores", "2.0", "parquet:b.parquet", False)]


KILLED_WRITER_SCRIPT = r"""
import sys, time
from contextlib import contextmanager
import polars as pl
from warehouse import Provenance, Warehouse
from warehouse.connection import Warehouse as Base

class CommitsSlowly(Warehouse):
    # Stops right before COMMIT, after the old rows were deleted and the new ones inserted, so the test can kill it.
    @contextmanager
    def connect(self):
        with Base.connect(self) as con:
            class Proxy:
                def __getattr__(self, name):
                    return getattr(con, name)
                def execute(self, sql, *args):
                    if sql == "COMMIT":
                        print("before commit", flush=True)
                        time.sleep(120)
                    return con.execute(sql, *args)
            yield Proxy()

schema = pl.Schema({"uuid": pl.String, "n": pl.Int64})
from dice_pipeline.schemas import TableSpec
spec = TableSpec("demo", "plain", schema)
CommitsSlowly(sys.argv[1]).write(spec, pl.DataFrame({"uuid": [f"new{i}" for i in range(1000)], "n": range(1000)},
                                                   schema=schema), provenance=Provenance("new", "n"))
"""


def test_a_writer_killed_before_commit_leaves_the_previous_table_and_source(tmp_path):
    import os
    import signal

    path = tmp_path / "w.duckdb"
    wh = Warehouse(path)
    wh.write(PLAIN, pl.DataFrame({"uuid": ["old"], "n": [1]}, schema=PLAIN.schema), provenance=Provenance("old", "o"))
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER_SCRIPT, str(path)], stdout=subprocess.PIPE,
                              text=True)
    assert writer.stdout.readline().strip() == "before commit"
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    assert wh.read(PLAIN).rows() == [("old", 1)]
    assert wh.provenance("plain") == Provenance("old", "o")
    # The file is usable afterwards: the lock went with the process, the next write commits.
    wh.write(PLAIN, pl.DataFrame({"uuid": ["next"], "n": [2]}, schema=PLAIN.schema))
    assert wh.read(PLAIN)["uuid"].to_list() == ["next"]


# Ctrl-C while DuckDB works, in a child process, so a handler that failed to catch the signal stops the child, not
# the test session. The child says "ready" before each query to be interrupted, and the test sends SIGINT from
# outside a moment later, as a terminal does; each scenario then prints one line: what reached the caller.
_INTERRUPT_SCENARIOS = r"""
import signal, sys, threading, time
from warehouse import Warehouse

class StepInterrupted(BaseException):  # what Dagster's handler raises inside a step
    pass

def dagster_like(signum, frame):
    raise StepInterrupted()

def outcome(action):
    start = time.monotonic()
    try:
        action()
        return "finished"
    except BaseException as error:
        took = time.monotonic() - start
        return f"{type(error).__name__} after {'<5s' if took < 5 else f'{took:.0f}s'}"

# As in a terminal: a process started in the background by a shell without job control inherits SIGINT ignored,
# and Python then installs no handler of its own.
signal.signal(signal.SIGINT, signal.default_int_handler)
wh = Warehouse(sys.argv[1])
long_query = "SELECT sum(hash(a.range) % 7) FROM range(?) a"  # a minute or more, unless interrupted
wh.query(long_query, [1000])  # DuckDB 1.5 does not look for signals during the first query a process runs

def interrupted_query():
    print("ready", flush=True)
    wh.query(long_query, [4_000_000_000])

print("python handler:", outcome(interrupted_query), flush=True)
signal.signal(signal.SIGINT, dagster_like)
print("dagster handler:", outcome(interrupted_query), flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)

def dropped_inside_the_block():  # a library that swallows the interrupt, as DuckDB at times does
    with wh.connect() as con:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            pass
        print("next statement:", con.execute("SELECT 1").fetchall())

print("dropped:", outcome(dropped_inside_the_block))
print("handler restored:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
result = []
worker = threading.Thread(target=lambda: result.append(wh.query("SELECT 42 AS n")["n"][0]))
worker.start(); worker.join()
print("off the main thread:", result)
"""


def test_ctrl_c_during_a_query_reaches_the_caller_as_the_interrupt_it_was(tmp_path):
    """DuckDB turns a KeyboardInterrupt raised mid-query into RuntimeError('Query interrupted') (Dagster then fails
    one step and runs the others) or drops it; the warehouse hands the caller the interrupt itself."""
    child = subprocess.Popen([sys.executable, "-c", _INTERRUPT_SCENARIOS, str(tmp_path / "w.duckdb")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in child.stdout:
            if line.strip() == "ready":
                time.sleep(0.3)  # into the query
                child.send_signal(signal.SIGINT)
            elif ": " in line:  # not DuckDB's progress bar, were a query to run long
                lines.append(line.rstrip("\n"))
        assert child.wait(timeout=300) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
    assert lines == [
        "python handler: KeyboardInterrupt after <5s",
        "dagster handler: StepInterrupted after <5s",
        "next statement: [(1,)]",
        "dropped: KeyboardInterrupt after <5s",
        "handler restored: True",
        "off the main thread: [42]",
    ]
