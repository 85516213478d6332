"""One threshold type and one keep/reject rule at it: canonical keys, and the decision every stage takes."""

import pytest

from dice_pipeline.thresholds import (
    THRESHOLD_REASONS,
    SpeedupThreshold,
    ThresholdError,
    decide_at_threshold,
)

TWO = SpeedupThreshold.parse("2.0")


@pytest.mark.parametrize("raw,key", [("2", "2.0"), ("2.00", "2.0"), (2.0, "2.0"), ("1.5", "1.5"), ("0.75", "0.75"),
                                     ("10", "10.0"), ("1.25000", "1.25"), (" 3 ", "3.0")])
def test_threshold_keys_are_canonical(raw, key):
    assert SpeedupThreshold.parse(raw).key == key
    assert SpeedupThreshold.parse(raw).value == float(key)


@pytest.mark.parametrize("bad", ["fast", "-1", "0", "nan", "inf", "", "abc"])
def test_bad_thresholds_are_refused_in_one_line(bad):
    with pytest.raises(ThresholdError) as raised:
        SpeedupThreshold.parse(bad)
    assert "\n" not in str(raised.value) and raised.value.canonical is None


def test_non_canonical_partition_key_names_the_canonical_one():
    with pytest.raises(ThresholdError, match="'2.0'") as raised:
        SpeedupThreshold.from_partition_key("2.00")
    assert raised.value.canonical == "2.0"
    assert SpeedupThreshold.from_partition_key("2.0") == TWO


def test_an_invalid_partition_key_has_no_canonical_spelling():
    with pytest.raises(ThresholdError, match="not valid") as raised:
        SpeedupThreshold.from_partition_key("-1")
    assert raised.value.canonical is None


@pytest.mark.parametrize("status,speedup,measured,flags,reason", [
    ("correct", 2.0, True, [], "kept"),  # inclusive
    ("correct", 1.99, True, [], "below_threshold"),
    ("not_executed", 2.5, False, [], "kept"),  # a recorded speedup stands where nothing was found wrong
    ("incorrect", 9.0, False, [], "failed_verification"),
    ("deceptive", None, True, [], "failed_verification"),
    ("not_executed", None, False, [], "not_executed"),
    (None, None, False, [], "not_executed"),  # no verdict at all
    ("infrastructure_error", 3.0, False, [], "not_executed"),  # no judgement was made: never kept on trust
    ("correct", None, True, [], "no_speedup"),
    ("correct", float("nan"), True, [], "no_speedup"),
    ("correct", 3.0, True, ["overhead_dominated"], "overhead_dominated"),
    ("correct", 3.0, False, ["overhead_dominated"], "kept"),  # the flag is about our timing, not a recorded figure
])
def test_one_decision_rule_and_its_reason(status, speedup, measured, flags, reason):
    decision = decide_at_threshold(TWO, status=status, speedup=speedup, measured=measured, flags=flags)
    assert decision.reason_code == reason and decision.kept == (reason == "kept")
    assert decision.reason_code in THRESHOLD_REASONS and decision.message


def test_the_three_stages_share_the_vocabulary():
    from dice_pipeline.cuke.samples import SFT_REJECT_REASONS

    # CuKe's own reasons extend the threshold vocabulary; they never redefine one of its codes.
    for code in set(THRESHOLD_REASONS) - {"kept"}:
        assert SFT_REJECT_REASONS[code] == THRESHOLD_REASONS[code]
