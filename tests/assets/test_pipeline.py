"""The asset graph end to end on small data: ingestion, verification (not executed: no GPU), two thresholds side by
side, staleness after a threshold's result changes, and the rejection paths surfacing as data."""

import json

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from assets import keys
from dice_pipeline import definitions
from dice_pipeline.resources import KernelVerifier
from warehouse import Warehouse, table_for


@dg.asset(ins={"speedup_filtered_pairs": dg.AssetIn(key=keys.SPEEDUP_FILTERED_PAIRS)},
          partitions_def=keys.THRESHOLD_PARTITIONS, io_manager_key="mem")
def downstream_of_filter(speedup_filtered_pairs: pl.DataFrame) -> int:
    return speedup_filtered_pairs.height


def _write_source(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def env(tmp_path, cpu_resources):
    instance = dg.DagsterInstance.ephemeral()
    warehouse_file = str(tmp_path / "w.duckdb")
    resources = cpu_resources(warehouse_file, mem=dg.InMemoryIOManager())
    return instance, resources, Warehouse(warehouse_file)


def _materialize(instance, resources, selection, source=None, partition=None):
    run_config = {"ops": {"concur_ingestion": {"config": {"source": source}}}} if source else None
    return dg.materialize(
        definitions.ALL_ASSETS + [downstream_of_filter],
        selection=selection,
        instance=instance,
        resources=resources,
        partition_key=partition,
        run_config=run_config,
    )


UPSTREAM = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]
FILTER = [keys.SPEEDUP_FILTERED_PAIRS, keys.SPEEDUP_FILTER_DECISIONS]


def test_two_thresholds_live_side_by_side(env, tmp_path, pair_factory):
    instance, resources, wh = env
    bad = pair_factory(9)
    bad["generated_code"] = "import torch\n"  # no ModelNew: rejected at ingestion
    source = _write_source(tmp_path / "p.jsonl", [pair_factory(i, speedup=s) for i, s in enumerate([0.8, 1.6, 2.4])]
                           + [bad])
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["1.5", "2.0"])
    assert _materialize(instance, resources, UPSTREAM, source=source).success
    for key in ("1.5", "2.0"):
        assert _materialize(instance, resources, FILTER, partition=key).success

    kept = wh.read(table_for("speedup_filtered_pairs"))
    assert sorted(kept.select("threshold_key", "uuid").rows()) == [
        ("1.5", "pair-1"), ("1.5", "pair-2"), ("2.0", "pair-2")]
    assert wh.read(table_for("speedup_filter_decisions")).height == 6  # 3 ingested pairs x 2 thresholds
    assert wh.read(table_for("concur_rejects"))["reason_code"].to_list() == ["no_model_new"]
    verified = wh.read(table_for("verified_pairs"))
    assert set(verified["status"]) == {"not_executed"} and not verified["executed"].any()
    # The lineage view answers "which source rows survived at 2.0, with what speedup".
    lineage = wh.query("SELECT uuid, source_row, speedup_used, speedup_source FROM lineage.filter_lineage "
                       "WHERE threshold_key = '2.0' AND kept")
    assert lineage.rows() == [("pair-2", 2, 2.4, "recorded")]
    summary = wh.query("SELECT threshold_key, reason_code, pairs FROM lineage.threshold_summary")
    assert ("1.5", "below_threshold", 1) in summary.rows()


def test_downstream_goes_stale_only_when_the_thresholds_result_changes(env, tmp_path, pair_factory):
    instance, resources, _ = env
    rows = [pair_factory(i, speedup=s) for i, s in enumerate([1.0, 3.0])]
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["2.0"])
    everything = definitions.ALL_ASSETS + [downstream_of_filter]

    def run_all(source_rows, name):
        source = _write_source(tmp_path / name, source_rows)
        assert _materialize(instance, resources, UPSTREAM, source=source).success
        assert _materialize(instance, resources, FILTER + [downstream_of_filter.key], partition="2.0").success

    def status_after_refilter(source_rows, name):
        source = _write_source(tmp_path / name, source_rows)
        assert _materialize(instance, resources, UPSTREAM, source=source).success
        assert _materialize(instance, resources, FILTER, partition="2.0").success
        resolver = get_stale_status_resolver(instance, everything)
        return resolver.get_status(downstream_of_filter.key, "2.0")

    run_all(rows, "a.jsonl")
    assert get_stale_status_resolver(instance, everything).get_status(downstream_of_filter.key, "2.0") == \
        StaleStatus.FRESH
    # The same source with new content (another source would be refused without allow_source_change).
    # Same kept set (pair-0 now has a new, still-too-low speedup): the 2.0 result is unchanged, nothing is stale.
    assert status_after_refilter([pair_factory(0, speedup=1.1), rows[1]], "a.jsonl") == StaleStatus.FRESH
    # pair-0 now passes 2.0: the result changed, so what was built from it is stale.
    assert status_after_refilter([pair_factory(0, speedup=2.5), rows[1]], "a.jsonl") == StaleStatus.STALE


def test_non_canonical_threshold_partition_fails_with_the_canonical_key(env, tmp_path, pair_factory):
    instance, resources, _ = env
    source = _write_source(tmp_path / "p.jsonl", [pair_factory(0)])
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["2"])
    assert _materialize(instance, resources, UPSTREAM, source=source).success
    with pytest.raises(dg.Failure, match="'2.0'"):  # one clear line in the run log (test_bad_config.py)
        _materialize(instance, resources, FILTER, partition="2")


def test_empty_filter_result_is_still_a_table_and_warns(env, tmp_path, pair_factory):
    instance, resources, wh = env
    source = _write_source(tmp_path / "p.jsonl", [pair_factory(0, speedup=1.0)])
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["5.0"])
    assert _materialize(instance, resources, UPSTREAM, source=source).success
    result = _materialize(instance, resources, FILTER, partition="5.0")
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks["non_empty"].passed and checks["threshold_respected"].passed
    assert wh.read(table_for("speedup_filtered_pairs"), ["5.0"]).height == 0


@pytest.mark.nvcc
def test_compile_without_gpu_reaches_a_compile_verdict(env, tmp_path, pair_factory):
    # The compile-only stage on a GPU-less host: a candidate whose CUDA does not build is rejected as compile_error.
    instance, resources, wh = env
    broken = pair_factory(0)
    broken["generated_code"] = broken["generated_code"].replace("fmaxf(x[i], 0.f)", "fmaxf(x[i], undeclared_name)")
    source = _write_source(tmp_path / "p.jsonl", [broken])
    resources["verifier"] = KernelVerifier(execute="never", overrides={
        "build_without_gpu": True, "build_cache_dir": str(tmp_path / "builds")})
    assert _materialize(instance, resources, UPSTREAM, source=source).success
    verdict = wh.read(table_for("verified_pairs")).row(0, named=True)
    assert verdict["status"] == "compile_error" and not verdict["executed"]
    assert "undeclared_name" in verdict["verdict_json"]
