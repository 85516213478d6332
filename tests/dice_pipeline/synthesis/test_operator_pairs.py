"""Synthetic operator pairs downstream of the generator: verdicts joined on (held-out rows say why they were not
judged), per-family counts where a failing family is reported rather than dropped, CuKe and the RL pool taking
them with source and family and keeping held-out families out, and the shipped verdict archive read in place of
judging."""

from __future__ import annotations

import polars as pl
import pytest

from dice_pipeline.cuke.rl_pool import pool_from_references, without_families
from dice_pipeline.cuke.samples import build_sft_samples
from dice_pipeline.synthesis.operator_pairs import candidates_frame, family_report, pairs_frame
from dice_pipeline.synthesis.operators import HELD_OUT_FAMILIES, generate_operator_instances
from dice_pipeline.verify import Status, Verdict, VerifyConfig, VerifyJob, verify_batch
from dice_pipeline.verify.store import VerdictStore, pack_verdict_store
from dice_pipeline.verify.verdict import Reason

COUNTS = {"activation": 6, "softmax": 4, "row_norm": 3, "pooling": 3, "loss": 2}


@pytest.fixture(scope="module")
def candidates():
    return candidates_frame(generate_operator_instances(0, families=list(COUNTS), counts=COUNTS))


def measured(speedup: float, *, flags=()) -> Verdict:
    return Verdict(status=Status.CORRECT, speedup=speedup, speedup_gpu=speedup, speedup_host=speedup * 0.9,
                   speedup_convention="gpu", trials_run=5, trials_passed=5, correct_at_1e2=True, correct_at_1e4=True,
                   flags=list(flags), provenance={"gpu": "NVIDIA H100 80GB HBM3", "verifier_version": "0.3.1"})


def failed(status: Status, code: str) -> Verdict:
    return Verdict(status=status, reasons=[Reason(code, "it failed", "compile")], trials_run=None,
                   provenance={"gpu": "NVIDIA H100 80GB HBM3"})


def verdicts_for(candidates: pl.DataFrame) -> dict[str, Verdict]:
    """activation: fast, slow, launch-bound, wrong; softmax: all fail to compile; row_norm: not executed."""
    verdicts = {}
    for task_id, family, index in candidates.select("task_id", "family", "instance_index").iter_rows():
        if family == "activation":
            verdicts[task_id] = [measured(3.0), measured(1.5), measured(4.0, flags=["overhead_dominated"]),
                                 failed(Status.INCORRECT, "output_mismatch")][index % 4]
        elif family == "softmax":
            verdicts[task_id] = failed(Status.COMPILE_ERROR, "nvcc_error")
        elif family == "row_norm":
            verdicts[task_id] = Verdict(status=Status.NOT_EXECUTED, reasons=[Reason("no_gpu", "no GPU", "correctness")])
    return verdicts


def test_every_candidate_is_a_row_and_held_out_rows_say_why_they_were_not_judged(candidates):
    pairs = pairs_frame(candidates, verdicts_for(candidates))
    assert pairs.height == candidates.height and pairs["task_id"].to_list() == candidates["task_id"].to_list()
    held = pairs.filter(pl.col("split") == "held_out")
    assert set(held["family"]) == {"pooling", "loss"}
    assert set(held["verification"]) == {"held_out_not_judged"} and held["status"].null_count() == held.height
    judged = pairs.filter(pl.col("split") == "train")
    assert set(judged["verification"]) == {"judged"} and judged["status"].null_count() == 0


def test_a_training_candidate_without_a_verdict_is_an_error_not_a_silent_drop(candidates):
    verdicts = verdicts_for(candidates)
    verdicts.pop(candidates.filter(pl.col("family") == "softmax")["task_id"][0])
    with pytest.raises(ValueError, match="training-split candidates have no verdict"):
        pairs_frame(candidates, verdicts)


def test_a_family_whose_instances_all_fail_is_reported_with_counts(candidates):
    report = family_report(pairs_frame(candidates, verdicts_for(candidates)), threshold=2.0)
    rows = {row["family"]: row for row in report.iter_rows(named=True)}
    assert set(rows) == set(COUNTS)
    assert rows["softmax"] | {} == {**rows["softmax"], "instances": 4, "judged": 4, "correct": 0, "failed_to_run": 4,
                                     "at_or_above_threshold": 0}
    assert rows["activation"]["correct"] == 5 and rows["activation"]["at_or_above_threshold"] == 2
    assert rows["activation"]["incorrect_or_deceptive"] == 1
    assert rows["row_norm"]["not_executed"] == 3 and rows["pooling"]["judged"] == 0


def test_cuke_takes_synthetic_pairs_at_the_threshold_with_source_and_family(candidates):
    pairs = pairs_frame(candidates, verdicts_for(candidates))
    build = build_sft_samples(None, None, 2.0, synthetic_pairs=pairs, held_out_families=HELD_OUT_FAMILIES)
    samples, rejects = build.samples, build.rejects
    assert samples.height + rejects.height == candidates.height
    assert set(samples["source"]) == {"synthetic"} and set(samples["family"]) == {"activation"}
    assert (samples["speedup_used"] >= 2.0).all() and samples["op_family"].to_list() == ["activation"] * 2
    reasons = dict(rejects.group_by("reason_code").len().iter_rows())
    assert reasons == {"below_threshold": 2, "overhead_dominated": 1, "failed_verification": 4 + 1,
                       "not_executed": 3, "held_out_family": 5}
    assert build.counts["samples_by_family"] == {"activation": 2}
    # a lower threshold takes the 1.5x pair too
    assert build_sft_samples(None, None, 1.5, synthetic_pairs=pairs).samples.height == 4


def test_held_out_families_stay_out_of_cuke_whatever_the_source(pair_factory):
    cumsum = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x * 2.0, dim=1)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""
    from dice_pipeline.cuke.samples import SFT_CANDIDATES  # noqa: F401 - the schema the rows are mapped to

    pairs = pl.DataFrame([pair_factory(0, 3.0), pair_factory(1, 3.0, pytorch_code=cumsum)])
    filtered = pairs.with_columns(pl.lit(2.0).alias("threshold"), pl.lit("2.0").alias("threshold_key"),
                                  pl.col("speedup_over_eager").alias("speedup_used"),
                                  pl.lit("recorded").alias("speedup_source"), pl.lit("gpu").alias("speedup_convention"),
                                  pl.lit("correct").alias("verification_status"), pl.lit(None, pl.String).alias("verdict_id"),
                                  pl.lit("test").alias("source_name"), pl.int_range(2).cast(pl.Int64).alias("source_row"))
    kept = build_sft_samples(filtered, None, 2.0, held_out_families=("cumulative",))
    assert kept.samples.height == 1
    assert kept.rejects["reason_code"].to_list() == ["held_out_family"]
    assert build_sft_samples(filtered, None, 2.0).samples.height == 2  # nothing held out: both


def test_the_rl_pool_carries_source_and_family_and_loses_held_out_tasks(candidates):
    references = candidates.select("task_id", "pytorch_code", pl.lit("synthetic").alias("source"), "family")
    pool = pool_from_references(references, "unused")
    assert set(pool["source"]) == {"synthetic"} and pool["family"].null_count() == 0
    kept, removed = without_families(pool, HELD_OUT_FAMILIES)
    assert removed == {"pooling": 3, "loss": 2}
    assert kept["schedule_position"].to_list() == list(range(kept.height))
    assert not set(kept["family"]) & set(HELD_OUT_FAMILIES)


def test_a_packed_verdict_archive_answers_in_place_of_judging(tmp_path, candidates):
    row = candidates.filter(pl.col("family") == "activation").row(0, named=True)
    job = VerifyJob(row["task_id"], row["pytorch_code"], row["generated_code"])
    config = VerifyConfig(execute=False, build_without_gpu=False, build_cache_dir=str(tmp_path / "builds"))
    assert VerdictStore(tmp_path / "store").put(job, config, measured(2.7))
    assert pack_verdict_store(tmp_path / "store", tmp_path / "verdicts.jsonl.gz") == 1
    archived = VerifyConfig(execute=False, build_without_gpu=False, build_cache_dir=str(tmp_path / "builds"),
                            verdict_archives=(str(tmp_path / "verdicts.jsonl.gz"),))
    [verdict] = verify_batch([job], archived)
    assert verdict.status == Status.CORRECT and verdict.speedup == 2.7
    assert verdict.provenance["from_verdict_store"] is True
    # the archive is not part of the verdict's key: the same job without it is judged (here: not executed)
    [unarchived] = verify_batch([job], config)
    assert unarchived.status == Status.NOT_EXECUTED
    # packing is deterministic and an archive is read-only: nothing is written without a store directory
    first = (tmp_path / "verdicts.jsonl.gz").read_bytes()
    pack_verdict_store(tmp_path / "store", tmp_path / "again.jsonl.gz")
    assert (tmp_path / "again.jsonl.gz").read_bytes() == first
    assert not VerdictStore(None, (str(tmp_path / "verdicts.jsonl.gz"),)).put(job, config, measured(9.0))


def test_infilling_tasks_carry_source_and_family(candidates):
    from dice_pipeline.cuke.infilling import build_infilling_split, build_stage1_tasks

    pairs = pairs_frame(candidates, verdicts_for(candidates))
    samples = build_sft_samples(None, None, 2.0, synthetic_pairs=pairs).samples
    splits, rejects = build_infilling_split(samples, id_column="sample_id", code_column="generated_code")
    assert rejects.height == 0
    tasks = build_stage1_tasks(splits)
    assert set(tasks["source"]) == {"synthetic"} and set(tasks["family"]) == {"activation"}


def test_the_asset_and_the_gpu_script_look_verdicts_up_under_the_same_keys(candidates, tmp_path):
    """The asset judges through the KernelVerifier resource, the GPU script through its own VerifyConfig: the keys
    must agree, or the shipped archive would never be read."""
    from dice_pipeline.resources import KernelVerifier
    from dice_pipeline.synthesis.operators.verification import synthetic_verify_config
    from dice_pipeline.verify.store import verdict_key

    from benchmarks.synthetic_verify_gpu import parse_args, verify_config_for

    row = candidates.row(0, named=True)
    job = VerifyJob(row["task_id"], row["pytorch_code"], row["generated_code"])
    asset_side = synthetic_verify_config(KernelVerifier(execute="never").verify_config())
    script_side = verify_config_for(parse_args(["out", "--lanes", "14"]), tmp_path)
    assert verdict_key(job, asset_side) == verdict_key(job, script_side)
    assert verdict_key(job, asset_side) != verdict_key(job, VerifyConfig())  # the timing settings are in the key


def test_the_gpu_script_judges_families_in_turns_and_a_design_at_a_time():
    from benchmarks.synthetic_verify_gpu import judging_order
    from dice_pipeline.synthesis.operators import generate_operator_instances
    from dice_pipeline.synthesis.operators.verification import verification_jobs

    instances = generate_operator_instances(0, scale=0.2)
    jobs = sorted((VerifyJob(*job) for job in verification_jobs(instances)), key=judging_order(instances))
    of = {i.task_id: (i.family, i.design_id) for i in instances}
    order = [of[job.job_id] for job in jobs]
    assert len(order) == len({i.task_id for i in instances if i.split == "train"})
    # Every training family is reached before any family's second design ...
    families = {family for family, _ in order}
    seen_at = {}
    for position, key in enumerate(order):
        seen_at.setdefault(key[0], position)
    second_design_at = min(p for p, key in enumerate(order) if key != order[seen_at[key[0]]])
    assert max(seen_at.values()) < second_design_at or len(families) == 1
    # ... and a design's instances are judged one after another.
    runs = [key for p, key in enumerate(order) if p == 0 or key != order[p - 1]]
    assert len(runs) == len(set(order))
