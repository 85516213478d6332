"""Runs that never replace data by worse without asking: an all-rejected source and a source switch are refused
(then allowed on request), failed blocking checks stop everything downstream, and every table records its source."""

import json

import dagster as dg
import pytest

from assets import keys
from dice_pipeline import definitions
from warehouse import Warehouse, table_for

UPSTREAM = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]
FILTER = [keys.SPEEDUP_FILTERED_PAIRS, keys.SPEEDUP_FILTER_DECISIONS]
GARBAGE = '{"uuid": "a", "pytorch_code": \n{"uuid": "b", "generated_code": "x"}\n'


@pytest.fixture
def env(tmp_path, cpu_resources):
    instance = dg.DagsterInstance.ephemeral()
    warehouse_file = str(tmp_path / "w.duckdb")
    resources = cpu_resources(warehouse_file)
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["1.5", "2.0"])
    return instance, resources, Warehouse(warehouse_file)


def _source(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(rows if isinstance(rows, str) else "\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _run(env, selection, source=None, partition="2.0", **ingestion):
    """Run the main job (as `dice run` and the UI do) on `selection` at one threshold partition."""
    instance, resources, _ = env
    job = dg.Definitions(assets=definitions.ALL_ASSETS, jobs=[definitions.main_job],
                         resources=resources).resolve_job_def(definitions.main_job.name)
    run_config = {"ops": {"concur_ingestion": {"config": {"source": source, **ingestion}}}} if source else {}
    return job.execute_in_process(run_config=run_config, instance=instance, partition_key=partition,
                                  asset_selection=selection, raise_on_error=False)


def _failure(result, step):
    (event,) = [e for e in result.get_step_failure_events() if e.step_key == step]
    return event.step_failure_data.user_failure_data


def _materialized(result):
    return {e.asset_key for e in result.get_asset_materialization_events()}


@pytest.fixture
def built_from_a(env, tmp_path, pair_factory):
    """Source A ingested, verified and filtered at 1.5 and 2.0."""
    source = _source(tmp_path, "a.jsonl", [pair_factory(i, speedup=s) for i, s in enumerate([1.0, 1.6, 2.4])])
    assert _run(env, UPSTREAM, source=source, partition="2.0").success
    for key in ("1.5", "2.0"):
        assert _run(env, FILTER, partition=key).success
    return source


def _state(wh):
    return (wh.read(table_for("concur_pairs"))["uuid"].to_list(),
            sorted(wh.read(table_for("speedup_filtered_pairs")).select("threshold_key", "uuid").rows()))


def test_all_rejected_source_is_refused_and_nothing_is_replaced(env, tmp_path, built_from_a):
    wh = env[2]
    before = _state(wh)
    result = _run(env, UPSTREAM + FILTER, source=_source(tmp_path, "a.jsonl", GARBAGE), partition="2.0")
    assert not result.success
    failure = _failure(result, "concur_ingestion")
    assert failure.description.startswith("refused to overwrite: source jsonl:")
    assert "no accepted rows (2 rows read" in failure.description
    assert failure.metadata["accepted"].value == 0
    assert failure.metadata["rejected_by_reason"].value == {"missing_required_column": 1, "unparseable_row": 1}
    assert _materialized(result) == set()
    assert _state(wh) == before


def test_forced_empty_source_is_written_but_its_blocking_check_stops_downstream(env, tmp_path, built_from_a):
    wh = env[2]
    _, filtered_before = _state(wh)
    garbage = _source(tmp_path, "g.jsonl", GARBAGE)
    result = _run(env, UPSTREAM + FILTER, source=garbage, partition="2.0", allow_empty=True,
                  allow_source_change=True)
    assert not result.success
    failed = [(c.asset_key, c.check_name, c.blocking) for c in result.get_asset_check_evaluations() if not c.passed]
    assert failed == [(keys.CONCUR_PAIRS, "non_empty", True)]
    # The ingested tables are replaced as asked; nothing downstream of the failed check ran or was overwritten.
    assert _materialized(result) == {keys.CONCUR_PAIRS, keys.CONCUR_REJECTS}
    assert _state(wh) == ([], filtered_before)
    # The partitions built from A now sit beside an ingestion from another source: the lineage views say so.
    stale = wh.query("SELECT table_name, partition_key, source_name FROM lineage.table_sources WHERE stale "
                     "AND table_name = 'speedup_filtered_pairs' ORDER BY 2").rows()
    assert stale == [("speedup_filtered_pairs", k, f"jsonl:{built_from_a}") for k in ("1.5", "2.0")]
    assert set(wh.query("SELECT partition_stale FROM lineage.filter_lineage")["partition_stale"]) == {True}
    # Filtering that partition on its own later refuses to replace it by nothing.
    alone = _run(env, FILTER, partition="2.0")
    assert not alone.success and "concur_pairs is empty" in _failure(alone, "speedup_filtering").description
    assert _state(wh) == ([], filtered_before)


def test_source_switch_is_refused_then_forced(env, tmp_path, pair_factory, built_from_a):
    wh = env[2]
    before = _state(wh)
    other = _source(tmp_path, "b.jsonl", [pair_factory(7, speedup=3.0), pair_factory(8, speedup=1.2)])
    refused = _run(env, UPSTREAM + FILTER, source=other, partition="2.0")
    assert not refused.success
    description = _failure(refused, "concur_ingestion").description
    assert f"from jsonl:{built_from_a}, not jsonl:{other}" in description
    assert _state(wh) == before

    forced = _run(env, UPSTREAM + FILTER, source=other, partition="2.0", allow_source_change=True)
    assert forced.success
    pairs, filtered = _state(wh)
    assert pairs == ["pair-7", "pair-8"]
    assert ("2.0", "pair-7") in filtered and ("1.5", "pair-1") in filtered  # 1.5 was not rebuilt
    sources = {(t, p): (s, stale) for t, p, s, stale in wh.query(
        "SELECT table_name, partition_key, source_name, stale FROM lineage.table_sources").rows()}
    assert sources[("concur_pairs", "")] == (f"jsonl:{other}", False)
    assert sources[("verified_pairs", "")] == (f"jsonl:{other}", False)
    assert sources[("speedup_filtered_pairs", "2.0")] == (f"jsonl:{other}", False)
    assert sources[("speedup_filtered_pairs", "1.5")] == (f"jsonl:{built_from_a}", True)
    summary = dict(((k, r), (s, st)) for k, r, s, st in wh.query(
        "SELECT DISTINCT threshold_key, reason_code, partition_source_name, partition_stale "
        "FROM lineage.threshold_summary").rows())
    assert summary[("1.5", "kept")] == (f"jsonl:{built_from_a}", True)
    assert summary[("2.0", "kept")] == (f"jsonl:{other}", False)


def test_same_source_with_new_content_is_not_a_switch(env, tmp_path, pair_factory, built_from_a):
    wh = env[2]
    hash_before = wh.provenance("concur_pairs").source_sha256
    _source(tmp_path, "a.jsonl", [pair_factory(i, speedup=2.5) for i in range(4)])
    assert _run(env, UPSTREAM, source=built_from_a, partition="2.0").success
    assert wh.read(table_for("concur_pairs")).height == 4
    assert wh.provenance("concur_pairs").source_sha256 != hash_before


def test_missing_source_fails_the_step_with_one_clear_reason(env, tmp_path):
    result = _run(env, UPSTREAM, source=str(tmp_path / "missing.parquet"), partition="2.0")
    assert not result.success
    failure = _failure(result, "concur_ingestion")
    assert failure.description == f"source error: parquet source {tmp_path / 'missing.parquet'} does not exist"
