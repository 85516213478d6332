"""Launchpad config that cannot go wrong quietly: a bad threshold key, a missing source path or an unknown source
format fails the run with one clear line in its log, and every table already in the warehouse is left as it was;
a bad threshold key leaves the partition list (replaced by its canonical spelling where it has one)."""

import json

import dagster as dg
import pytest

from assets import keys
from dice_pipeline import definitions
from warehouse import Warehouse

UPSTREAM = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]
FILTER = [keys.SPEEDUP_FILTERED_PAIRS, keys.SPEEDUP_FILTER_DECISIONS]


@pytest.fixture
def materialized(tmp_path, pair_factory, cpu_resources):
    """A warehouse with ingestion, verification and the 2.0 filter materialized from a small JSONL source."""
    instance = dg.DagsterInstance.ephemeral()
    warehouse_file = str(tmp_path / "w.duckdb")
    resources = cpu_resources(warehouse_file)
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(pair_factory(i, speedup=s)) + "\n" for i, s in enumerate([0.8, 1.6, 2.4])))
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["2.0"])

    def materialize(selection, source_spec=None, partition=None):
        run_config = {"ops": {"concur_ingestion": {"config": {"source": source_spec}}}} if source_spec else None
        return dg.materialize(definitions.ALL_ASSETS, selection=selection, instance=instance, resources=resources,
                              partition_key=partition, run_config=run_config, raise_on_error=False)

    assert materialize(UPSTREAM, source_spec=str(source)).success
    assert materialize(FILTER, partition="2.0").success
    return instance, materialize, Warehouse(warehouse_file)


def _snapshot(wh: Warehouse) -> dict:
    """Every table's full content, order-independent, so "unchanged" means unchanged row for row."""
    tables = wh.query("SELECT table_schema, table_name FROM information_schema.tables "
                      "WHERE table_type = 'BASE TABLE' ORDER BY 1, 2").rows()
    snapshot = {}
    for schema_name, table_name in tables:
        frame = wh.query(f'SELECT * FROM "{schema_name}"."{table_name}"')
        snapshot[f"{schema_name}.{table_name}"] = sorted(map(repr, frame.rows()))
    return snapshot


def _the_failure(result) -> str:
    """The one step failure of the run, as the run's log shows it: its error message."""
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1, [e.message for e in failures]
    error = failures[0].step_failure_data.error
    message = error.message.strip()
    # One clear line: the user's error itself, not a wrapper naming the framework or a traceback chain.
    assert "\n" not in message, message
    assert error.cause is None, error.cause
    assert "DagsterExecutionStepExecutionError" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("bad_key, named, listed_after, what_now", [
    ("2", "'2.0'", ["2.0"], "launch that one"), ("2.00", "'2.0'", ["2.0"], "launch that one"),
    ("3", "'3.0'", ["2.0", "3.0"], "launch that one"),
    ("fast", "not a number", ["2.0"], "was deleted"), ("-1.0", "positive", ["2.0"], "was deleted"),
])
def test_bad_threshold_key_is_one_clear_error_and_changes_nothing(materialized, bad_key, named, listed_after,
                                                                   what_now):
    instance, materialize, wh = materialized
    before = _snapshot(wh)
    assert before["filter.speedup_filtered_pairs"]  # the 2.0 partition is there to lose
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, [bad_key])  # what "Add partition" in the UI does
    message = _the_failure(materialize(FILTER, partition=bad_key))
    assert repr(bad_key) in message and named in message, message
    assert _snapshot(wh) == before
    # The bad key does not stay listed as a failed partition: replaced by its canonical spelling, or deleted.
    assert sorted(instance.get_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name)) == listed_after
    assert what_now in message


@pytest.mark.parametrize("spec, named", [
    ("jsonl:{tmp}/no_such_file.jsonl", "does not exist"),
    ("{tmp}/no_such_dir/pairs.parquet", "does not exist"),
    ("{tmp}/pairs.csv", "cannot tell what kind of source"),
    ("csv:{tmp}/pairs.csv", "cannot tell what kind of source"),
])
def test_bad_source_is_one_clear_error_and_changes_nothing(materialized, tmp_path, spec, named):
    _, materialize, wh = materialized
    (tmp_path / "pairs.csv").write_text("uuid,problem_name\n1,x\n")
    before = _snapshot(wh)
    message = _the_failure(materialize(UPSTREAM, source_spec=spec.format(tmp=tmp_path)))
    assert named in message, message
    assert _snapshot(wh) == before
