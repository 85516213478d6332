"""The DuckDB warehouse: empty tables, partition replacement, schema growth, serialized writers."""

import subprocess
import sys

import polars as pl
import pytest

from dice_pipeline.schemas import TableSpec
from warehouse import TABLES, Warehouse, install_lineage_views

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
    for view in ("pair_verification", "filter_lineage", "threshold_summary", "rejections"):
        assert wh.query(f"SELECT count(*) AS n FROM lineage.{view}")["n"][0] == 0
    assert set(TABLES) >= {"concur_pairs", "verified_pairs", "speedup_filtered_pairs"}
