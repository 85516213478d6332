"""Degenerate tasks: where zeros or a constant pass the tolerance, a candidate must also pass a test a null output
fails (its relative error well below the null output's: judge.compare.NullOutputCheck). CPU judge, the same
correctness path as on the GPU; the GPU re-judgement of KernelBench's degenerate tasks is
benchmarks/verify_degenerate_tasks.py."""

from __future__ import annotations

import math

import pytest
import torch
from cpu_judge import cpu_judge, timing_judge

from dice_pipeline.verify.judge.compare import NullOutputCheck, honest_error_floor, null_outputs, relative_error_of
from dice_pipeline.verify.verdict import Status, Verdict

# A softmax over very wide rows: every output is about 1/393216 (2.5e-6), so zeros pass atol=rtol=1e-2 and 1e-4.
WIDE_SOFTMAX = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
def get_inputs():
    return [torch.randn(2, 393216)]
def get_init_inputs():
    return []
"""

ZEROS = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""

UNIFORM = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.full_like(x, 1.0 / x.shape[1])
"""

HONEST_SOFTMAX = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.max(dim=1, keepdim=True).values)
        return e / e.sum(dim=1, keepdim=True)
"""

# The mean of each layer-normalised row: exactly 0, so the reference returns rounding noise (about 1e-8) that an
# honest kernel cannot reproduce; zeros pass, and no relative test can tell them apart.
MEAN_AFTER_NORM = """
import torch
import torch.nn.functional as F
class Model(torch.nn.Module):
    def forward(self, x):
        return F.layer_norm(x, (x.shape[1],)).mean(dim=1)
def get_inputs():
    return [torch.randn(16, 4096)]
def get_init_inputs():
    return []
"""

HONEST_MEAN_AFTER_NORM = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        mu = x.mean(dim=1, keepdim=True)
        var = x.var(dim=1, unbiased=False, keepdim=True)
        return ((x - mu) / torch.sqrt(var + 1e-5)).mean(dim=1)
"""


@pytest.mark.parametrize("candidate", [ZEROS, UNIFORM], ids=["zeros", "constant"])
def test_a_null_kernel_on_a_degenerate_task_is_rejected(candidate):
    judgement = cpu_judge(candidate, WIDE_SOFTMAX).run(with_timing=False)
    assert judgement.status == Status.INCORRECT, judgement.reasons
    assert judgement.reasons[-1].code == "no_better_than_null_output"
    # allclose passed (the task is degenerate), and both results are in the verdict
    assert judgement.fields["correct_at_1e2"] and judgement.fields["trials_passed"] == judgement.fields["trials_run"]
    assert "degenerate_task" in judgement.flags
    check = judgement.fields["null_output_check"]
    assert check["conclusive"] and not check["passed"] and check["relative_error"] > check["bound"]
    assert set(check["null_outputs"]) == {"zeros", "constant"}


def test_the_reference_against_itself_and_an_honest_kernel_pass_a_degenerate_task():
    for judge in (cpu_judge(None, WIDE_SOFTMAX, control=True), cpu_judge(HONEST_SOFTMAX, WIDE_SOFTMAX)):
        judgement = judge.run(with_timing=False)
        assert judgement.status == Status.CORRECT, judgement.reasons
        assert "degenerate_task" in judgement.flags and "null_output_check_inconclusive" not in judgement.flags
        check = judgement.fields["null_output_check"]
        assert check["conclusive"] and check["passed"]
        assert check["relative_error"] < 1e-5 < check["bound"]  # far inside: rounding only
    assert judge.null_output_bound == pytest.approx(check["bound"])


def test_a_task_whose_answer_is_rounding_noise_is_inconclusive_not_a_false_rejection():
    judgement = cpu_judge(HONEST_MEAN_AFTER_NORM, MEAN_AFTER_NORM).run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons
    check = judgement.fields["null_output_check"]
    # the honest kernel is as far from the reference as zeros are: only the reference's own sensitivity says why
    assert check["relative_error"] > 0.5 and check["reference_sensitivity"] > 0.1
    assert not check["conclusive"] and check["floor"] > check["bound"]
    assert {"degenerate_task", "null_output_check_inconclusive"} <= set(judgement.flags)


def test_a_task_no_null_output_passes_gets_no_null_output_check():
    judgement = cpu_judge("""
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x + x
""").run(with_timing=False)
    assert judgement.status == Status.CORRECT and "degenerate_task" not in judgement.flags
    assert "null_output_check" not in judgement.fields and judgement.fields["relative_error"] == 0.0


# Right while the correctness trials run, zeros once timed: on a degenerate task zeros pass the timed calls'
# allclose too, so the timed calls are held to the relative bound as well.
ZEROS_WHEN_TIMED = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 12:
            return torch.zeros_like(x)
        e = torch.exp(x - x.max(dim=1, keepdim=True).values)
        return e / e.sum(dim=1, keepdim=True)
"""


def test_timed_calls_on_a_degenerate_task_are_held_to_the_relative_bound():
    judgement = timing_judge(ZEROS_WHEN_TIMED, WIDE_SOFTMAX).run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[-1].code == "timed_output_mismatch", \
        judgement.reasons
    honest = timing_judge(HONEST_SOFTMAX, WIDE_SOFTMAX).run()
    assert honest.status == Status.CORRECT, honest.reasons


def test_null_outputs_report_their_relative_errors():
    reference = torch.full((4, 8), 1e-4) * torch.arange(1, 33, dtype=torch.float32).reshape(4, 8)
    constants: list[float] = []
    nulls = null_outputs(reference, constants, 1e-2)
    assert nulls.zeros_pass and nulls.constant_pass and nulls.zeros_error == 1.0
    expected = float(torch.linalg.vector_norm(reference.double() - constants[0]) / torch.linalg.vector_norm(reference.double()))
    assert nulls.constant_error == pytest.approx(expected)
    assert relative_error_of(reference, torch.zeros_like(reference)) == pytest.approx(1.0)
    assert relative_error_of(reference, reference.clone()) == 0.0
    assert relative_error_of((reference,), (reference, reference)) == math.inf


def test_the_check_decides_only_where_the_bound_is_above_what_rounding_reaches():
    def check(null_error, error, dtype="float32", sensitivity=0.0):
        return NullOutputCheck(["zeros"], null_error, error, 0.1, honest_error_floor([dtype], sensitivity), sensitivity)

    assert check(1.0, 1e-6).passed and check(1.0, 1e-6).conclusive
    assert not check(1.0, 0.2).passed  # no closer than a fifth of zeros' distance: rejected
    assert check(1.0, 0.2, dtype="bfloat16").conclusive and not check(1.0, 0.2, dtype="bfloat16").passed
    # a constant only 5e-4 away in fp32: a bound of 5e-5 is below what another summation order may reach
    assert not check(5e-4, 1e-3).conclusive and check(5e-4, 1e-3).passed
    assert not check(1.0, 1.0, sensitivity=0.5).conclusive  # the reference is rounding noise itself
    assert not check(0.0, 0.0).conclusive  # an all-zero reference: nothing to beat


def test_old_verdicts_without_the_new_fields_still_read():
    verdict = Verdict.from_dict({"status": "correct", "flags": ["degenerate_task"]})
    assert verdict.null_output_check is None and verdict.relative_error is None
    again = Verdict.from_json(Verdict(status=Status.INCORRECT, relative_error=1.0,
                                      null_output_check={"passed": False}).to_json())
    assert again.null_output_check == {"passed": False} and again.relative_error == 1.0


def test_the_gpu_rejudgement_script_builds_a_null_kernel_the_static_checks_pass():
    # benchmarks/verify_degenerate_tasks.py judges such a kernel on the GPU: it must reach the runtime checks.
    from benchmarks.verify_degenerate_tasks import output_signature, zeros_candidate

    from dice_pipeline.verify import check_candidate_source

    assert output_signature(WIDE_SOFTMAX) == ((2, 393216), "float32")
    source = zeros_candidate(*output_signature(WIDE_SOFTMAX))
    report = check_candidate_source(WIDE_SOFTMAX, source)
    assert report.status is None and "zero_fill_kernel" in report.kernel_names, report.reasons


def test_a_candidate_allclose_rejects_on_a_degenerate_task_keeps_that_rejection():
    judgement = cpu_judge("""
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
""", WIDE_SOFTMAX).run(with_timing=False)
    assert judgement.status == Status.INCORRECT and judgement.reasons[-1].code == "output_mismatch"
    assert "degenerate_task" in judgement.flags and "null_output_check" not in judgement.fields
