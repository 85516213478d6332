"""Speedup filtering: which speedup is used, and the decision for every pair (threshold keys and the decision
rule itself: test_thresholds.py)."""

import polars as pl
import pytest

from dice_pipeline.concur import SourceRow, validate_concur_rows
from dice_pipeline.filtering import filter_by_speedup
from dice_pipeline.schemas import VERIFIED_PAIRS


def _pairs(pair_factory, speedups):
    rows = [SourceRow(i, pair_factory(i, speedup=s)) for i, s in enumerate(speedups)]
    accepted, rejects = validate_concur_rows(rows, "test")
    assert rejects.height == 0
    return accepted


def _verdicts(pairs, statuses, measured, flags=None):
    return pl.DataFrame(
        {
            "uuid": pairs["uuid"],
            "problem_name": pairs["problem_name"],
            "status": statuses,
            "executed": [m is not None for m in measured],
            "reason_codes": [[] for _ in statuses],
            "flags": flags or [[] for _ in statuses],
            "measured_speedup": measured,
            "verdict_id": [f"v{i}" for i in range(len(statuses))],
        }
    ).with_columns(
        [pl.lit(None, dtype=t).alias(c) for c, t in VERIFIED_PAIRS.items()
         if c not in ("uuid", "problem_name", "status", "executed", "reason_codes", "flags", "measured_speedup",
                      "verdict_id")]
    ).select(VERIFIED_PAIRS.names())


def test_filter_keeps_rows_at_exact_threshold_and_prefers_measured_speedup(pair_factory):
    pairs = _pairs(pair_factory, [2.0, 1.99, 5.0, 3.0, None, 4.0])
    verdicts = _verdicts(
        pairs,
        ["not_executed", "not_executed", "correct", "incorrect", "not_executed", "deceptive"],
        [None, None, 1.2, None, None, None],
    )
    kept, decisions = filter_by_speedup(pairs, verdicts, "2.0")
    by_uuid = {r["uuid"]: r for r in decisions.iter_rows(named=True)}
    assert by_uuid["pair-0"]["reason_code"] == "kept"  # exactly at the threshold
    assert by_uuid["pair-0"]["speedup_source"] == "recorded"
    assert by_uuid["pair-1"]["reason_code"] == "below_threshold"
    # Recorded 5.0 but our GPU measured 1.2: the measurement wins.
    assert by_uuid["pair-2"]["reason_code"] == "below_threshold"
    assert by_uuid["pair-2"]["speedup_used"] == 1.2 and by_uuid["pair-2"]["speedup_source"] == "measured"
    assert by_uuid["pair-3"]["reason_code"] == "failed_verification"
    assert by_uuid["pair-4"]["reason_code"] == "not_executed"  # no GPU ran it and no speedup was recorded
    assert by_uuid["pair-5"]["reason_code"] == "failed_verification"
    assert kept["uuid"].to_list() == ["pair-0"]
    assert decisions.height == pairs.height
    assert (kept["threshold_key"] == "2.0").all()


def test_overhead_dominated_measurements_are_never_rewarded(pair_factory):
    pairs = _pairs(pair_factory, [1.0, 1.0])
    verdicts = _verdicts(pairs, ["correct", "correct"], [3.0, 3.0], flags=[["overhead_dominated"], []])
    kept, decisions = filter_by_speedup(pairs, verdicts, "2.0")
    assert decisions["reason_code"].to_list() == ["overhead_dominated", "kept"]
    assert kept["uuid"].to_list() == ["pair-1"]


def test_filter_refuses_pairs_without_verdicts(pair_factory):
    pairs = _pairs(pair_factory, [3.0, 3.0])
    verdicts = _verdicts(pairs.head(1), ["correct"], [3.0])
    with pytest.raises(ValueError, match="no verification verdict"):
        filter_by_speedup(pairs, verdicts, "2.0")
