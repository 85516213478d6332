"""The CuKe chain on the embedded seed corpus, as CI runs it without a GPU: ingest -> (no verification) -> filter at
2.0 -> SFT samples (decontaminated) -> infilling split -> stage-1 tasks -> export. Samples must say not_executed."""

from __future__ import annotations

import datasets
import polars as pl
import pytest

from dice_pipeline.paths import kernelbench_tasks_path
from dice_pipeline.cuke.decontaminate import KernelBenchIndex, decontamination_summary
from dice_pipeline.cuke.export import build_lineage, export_cuke
from dice_pipeline.cuke.infilling import build_infilling_split, build_stage1_tasks
from dice_pipeline.cuke.samples import build_sft_samples
from dice_pipeline.schemas import SPEEDUP_FILTERED_PAIRS, VERIFIED_PAIRS

KERNELBENCH_TASKS = kernelbench_tasks_path()


@pytest.fixture(scope="module")
def embedded_pairs() -> pl.DataFrame:
    try:
        from dice_pipeline.concur import ConcurSource, ingest

        accepted, _, _ = ingest(ConcurSource("embedded"))
    except ImportError as error:  # the seed corpus lands with issue 2
        pytest.skip(f"embedded seed corpus not importable yet: {error}")
    return accepted


@pytest.fixture(scope="module")
def index() -> KernelBenchIndex | None:
    return KernelBenchIndex.from_path(KERNELBENCH_TASKS) if KERNELBENCH_TASKS is not None else None


def _export_and_reload(build, index, out_dir) -> int:
    decontamination = None
    if index is not None:
        checked = build.samples.height + build.counts["decontaminated"]
        decontamination = decontamination_summary(build.decontamination_drops, checked, index.config)
    export = export_cuke(build.samples, out_dir, build_lineage(build.samples, build.counts, decontamination))
    return datasets.load_from_disk(str(export.hf_dataset_dir)).num_rows


def test_filtered_chain_runs_without_gpu_and_exports_even_when_empty(embedded_pairs, index, tmp_path):
    from dice_pipeline.filtering import filter_by_speedup

    # What verification gives on a machine without a GPU: nothing executed, the sources' speedups are used.
    given = {"uuid", "status", "executed", "verdict_id"}
    verified = pl.DataFrame(
        [
            {"uuid": u, "status": "not_executed", "executed": False, "verdict_id": f"cpu-{u}"}
            for u in embedded_pairs["uuid"]
        ]
    ).with_columns(
        [pl.lit(None, dtype=dtype).alias(name) for name, dtype in VERIFIED_PAIRS.items() if name not in given]
    )
    kept, _ = filter_by_speedup(embedded_pairs, verified, "2.0")
    build = build_sft_samples(kept, None, threshold=2.0, kernelbench_index=index)
    assert build.samples.height + build.rejects.height == kept.height
    assert set(build.samples["verification_status"]) <= {"not_executed"}
    assert _export_and_reload(build, index, tmp_path / "cuke") == build.samples.height


def test_every_seed_pair_becomes_a_sample_or_a_reason_and_splits_exactly(embedded_pairs, index, tmp_path):
    # All seed pairs as if kept: exercises prompts, decontamination and the infilling split on the real seed files.
    as_filtered = embedded_pairs.with_columns(
        pl.lit("2.0").alias("threshold_key"),
        pl.lit(2.0).alias("threshold"),
        pl.col("speedup_over_eager").alias("speedup_used"),
        pl.lit("recorded").alias("speedup_source"),
        pl.lit("gpu").alias("speedup_convention"),
        pl.lit("not_executed").alias("verification_status"),
        pl.lit(None, dtype=pl.String).alias("verdict_id"),
    ).select(SPEEDUP_FILTERED_PAIRS.names())
    build = build_sft_samples(as_filtered, None, threshold=2.0, kernelbench_index=index)
    assert build.samples.height > 0 and build.samples.height + build.rejects.height == embedded_pairs.height
    assert set(build.samples["verification_status"]) == {"not_executed"}

    splits, rejects = build_infilling_split(build.samples)
    assert splits.height > 0 and splits.height + rejects.height == build.samples.height
    for row in splits.iter_rows(named=True):
        assert row["prefix"] + row["middle"] + row["suffix"] == row["generated_code"]
    assert build_stage1_tasks(splits).height == splits.height
    assert _export_and_reload(build, index, tmp_path / "cuke") == build.samples.height
