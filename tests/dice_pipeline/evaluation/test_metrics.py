"""KernelBench metric arithmetic on hand-built verdicts: fast_p strict ">" p over all tasks, geomean, tolerances."""

from __future__ import annotations

import math

import pytest

from dice_pipeline.evaluation.metrics import TaskOutcome, correct_at, evaluation_metrics, level_metrics, pass_at_k
from dice_pipeline.evaluation.report import comparison_markdown
from dice_pipeline.verify.verdict import Reason, Status, Verdict


def correct(speedup, strict=True):
    v = Verdict(Status.CORRECT, correct_at_1e2=True, correct_at_1e4=strict, speedup=speedup, compile_seconds=1.0)
    v.speedup_gpu, v.speedup_host = speedup, None if speedup is None else speedup * 0.5
    return v


def outcome(i, verdict, issues=()):
    return TaskOutcome(f"L1/{i}_t", [verdict], list(issues))


def test_fast_p_is_strictly_greater_than_p_and_over_all_tasks():
    outcomes = [outcome(0, correct(1.0)), outcome(1, correct(2.0)), outcome(2, correct(2.5)), outcome(3, correct(0.5)),
                outcome(4, Verdict(Status.INCORRECT, reasons=[Reason("output_mismatch", "")], compile_seconds=1.0)),
                outcome(5, Verdict(Status.COMPILE_ERROR)), outcome(6, None)]
    row = level_metrics(outcomes, "1e-2")
    assert row["n_tasks"] == 7 and row["n_correct"] == 4 and row["exec_rate"] == pytest.approx(4 / 7)
    assert row["fast_1"] == pytest.approx(2 / 7)  # 1.0 is not > 1
    assert row["fast_2"] == pytest.approx(1 / 7)  # 2.0 is not > 2
    assert row["fast_0.5"] == pytest.approx(3 / 7)  # 0.5 is not > 0.5
    assert row["fast_0"] == pytest.approx(4 / 7)
    assert row["fast_1_host"] == pytest.approx(1 / 7)  # host speedups are half: only 2.5 -> 1.25 > 1
    assert row["geomean_speedup_gpu"] == pytest.approx(math.exp((math.log(1) + math.log(2) + math.log(2.5) + math.log(0.5)) / 4))
    assert row["compile_rate"] == pytest.approx(5 / 7) and row["n_missing"] == 1


def test_tolerances_count_separately():
    loose_only = correct(3.0, strict=False)
    strict_policy_fail = Verdict(Status.INCORRECT, reasons=[Reason("output_mismatch", "")], correct_at_1e2=True,
                                 correct_at_1e4=False)
    rows = evaluation_metrics([outcome(0, loose_only), outcome(1, strict_policy_fail), outcome(2, correct(1.5))])
    loose, strict = rows
    assert (loose["tolerance"], strict["tolerance"]) == ("1e-2", "1e-4")
    assert loose["n_correct"] == 3 and strict["n_correct"] == 1
    assert loose["fast_1"] == pytest.approx(2 / 3)  # the 1e-2-only incorrect verdict has no speedup
    assert strict["fast_1"] == pytest.approx(1 / 3)


def test_deceptive_reasons_and_non_tolerance_rejections():
    deceptive = Verdict(Status.DECEPTIVE, reasons=[Reason("reference_access", ""), Reason("no_cuda_extension", "")])
    mutated = Verdict(Status.INCORRECT, reasons=[Reason("input_mutated", "")], correct_at_1e2=True)
    assert not correct_at(mutated, "1e-2") and not correct_at(deceptive, "1e-2")
    row = level_metrics([outcome(0, deceptive), outcome(1, mutated)], "1e-2")
    assert row["deceptive_rate"] == 0.5 and row["deceptive_by_reason"] == {"no_cuda_extension": 0.5,
                                                                            "reference_access": 0.5}
    assert row["geomean_speedup_gpu"] is None and row["exec_rate"] == 0


def test_not_executed_counts_as_a_failure_and_is_counted():
    row = level_metrics([outcome(0, Verdict(Status.NOT_EXECUTED)), outcome(1, correct(2.0), ["zeros_pass_at_1e2"])],
                        "1e-2")
    assert row["n_not_executed"] == 1 and row["exec_rate"] == 0.5 and row["n_compile_unknown"] == 1
    assert row["n_known_issue_tasks"] == 1 and row["n_correct_on_known_issue_tasks"] == 1


def test_pass_at_k():
    assert pass_at_k(4, 0, 1) == 0 and pass_at_k(4, 4, 2) == 1 and pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - (3 * 2) / (5 * 4))
    task = TaskOutcome("L1/1_t", [Verdict(Status.INCORRECT), correct(1.2)])
    assert level_metrics([task], "1e-2", pass_k=[1, 2])["pass_at_k"] == {"1": 0.5, "2": 1.0}


def test_report_puts_ours_beside_the_paper():
    rows = [{"checkpoint": "sft", "level": 1, **r} for r in evaluation_metrics([outcome(0, correct(2.5))])]
    text = comparison_markdown(rows)
    assert "| sft | measured here | 100 / 100 / 100 | – | – |" in text
    assert "| DICE-8B | paper | 40 / 9 / 5 | 39 / 14 / 0 | 16 / 8 / 4 |" in text
    assert "speedup_gpu" in text and "1e-4" in text
    stopped = [{**rows[0], "complete": False, "executed": False}]
    assert "| sft | measured here | 100 / 100 / 100 * † | – | – |" in comparison_markdown(stopped)
