"""Turn verifier verdicts into the `verified_pairs` table (one row per ingested pair)."""

from __future__ import annotations

import hashlib

import polars as pl

from dice_pipeline.schemas import VERIFIED_PAIRS
from dice_pipeline.verify.verdict import Status, Verdict


def verdict_id(job_id: str, verdict_json: str) -> str:
    """Stable id of one verdict on one job: the first 16 hex digits of sha256(job id, verdict JSON)."""
    return hashlib.sha256(f"{job_id}\0{verdict_json}".encode()).hexdigest()[:16]


def verdicts_frame(pairs: pl.DataFrame, verdicts: list[Verdict]) -> pl.DataFrame:
    """One row per pair, in the order of `pairs`; `verdicts[i]` judges `pairs[i]`."""
    if len(verdicts) != pairs.height:
        raise ValueError(f"{len(verdicts)} verdicts for {pairs.height} pairs")
    rows = []
    for pair, verdict in zip(pairs.iter_rows(named=True), verdicts):
        executed = verdict.status != Status.NOT_EXECUTED and verdict.trials_run is not None
        rows.append(
            {
                "uuid": pair["uuid"],
                "problem_name": pair["problem_name"],
                "status": verdict.status.value,
                "executed": executed,
                "reason_codes": verdict.reason_codes(),
                "flags": list(verdict.flags),
                "measured_speedup": verdict.speedup if executed else None,
                "measured_speedup_gpu": verdict.speedup_gpu if executed else None,
                "measured_speedup_host": verdict.speedup_host if executed else None,
                "speedup_convention": verdict.speedup_convention if executed else None,
                "reference_median_ms": verdict.reference_timing.median_ms if verdict.reference_timing else None,
                "candidate_median_ms": verdict.candidate_timing.median_ms if verdict.candidate_timing else None,
                "max_abs_diff": verdict.max_abs_diff,
                "correct_at_1e2": verdict.correct_at_1e2,
                "correct_at_1e4": verdict.correct_at_1e4,
                "verifier_version": verdict.provenance.get("verifier_version"),
                "gpu_name": verdict.provenance.get("gpu"),
                "verdict_id": verdict_id(pair["uuid"], verdict.to_json()),
                "verdict_json": verdict.to_json(),
            }
        )
    return pl.DataFrame(rows, schema=VERIFIED_PAIRS)
