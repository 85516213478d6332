"""verdicts_frame: one verified_pairs row per pair, with the verdict's own facts (status, timing, GPU, versions)."""

from __future__ import annotations

import polars as pl
import pytest

from dice_pipeline.verified import verdict_id, verdicts_frame
from dice_pipeline.verify import Reason, Status, TimingStats, Verdict


def _pairs(n: int) -> pl.DataFrame:
    return pl.DataFrame({"uuid": [f"u{i}" for i in range(n)], "problem_name": [f"p{i}" for i in range(n)]})


def test_rows_carry_the_verdicts_facts():
    measured = Verdict(status=Status.CORRECT, speedup=2.5, trials_run=5,
                       reference_timing=TimingStats(1.0, 0.1, 1.0, 100, 0.01),
                       candidate_timing=TimingStats(0.4, 0.1, 0.4, 100, 0.01),
                       provenance={"gpu": "NVIDIA H200", "verifier_version": "9.9"})
    unexecuted = Verdict(status=Status.NOT_EXECUTED, reasons=[Reason("no_gpu", "no GPU here", "correctness")],
                         provenance={"gpu": None, "verifier_version": "9.9"})
    frame = verdicts_frame(_pairs(2), [measured, unexecuted])
    first, second = frame.row(0, named=True), frame.row(1, named=True)
    assert first["executed"] and first["measured_speedup"] == 2.5 and first["gpu_name"] == "NVIDIA H200"
    assert first["reference_median_ms"] == 1.0 and first["verifier_version"] == "9.9"
    assert first["verdict_id"] == verdict_id("u0", measured.to_json())
    assert not second["executed"] and second["measured_speedup"] is None and second["gpu_name"] is None
    assert second["reason_codes"] == ["no_gpu"]


def test_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 verdicts for 3 pairs"):
        verdicts_frame(_pairs(3), [Verdict(status=Status.CORRECT)] * 2)
