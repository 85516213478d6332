"""The judge's correctness path on the CPU (judge/flow.py, judge/inputs.py): where inputs are drawn, out-of-memory
attribution and the low-memory retry, run-to-run consistency, the stale-output rule, fresh draws, and the trusted
set-up released and prepared again. The GPU side runs in test_gpu_verifier.py."""

from __future__ import annotations

import sys

import pytest
import torch
from cpu_judge import (HONEST_DOUBLING, cpu_judge, module)

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.judge import CandidateJudge, Rejection, RuntimeGuard
from dice_pipeline.verify.verdict import Status


def test_a_slow_host_draw_moves_input_draws_to_the_device_and_says_so():
    judge = cpu_judge(None, slow_draw_seconds=0.05)
    judge.reference.SLOW = 0.1
    judge.prepare_reference()
    assert judge.draw_on_gpu
    draw = judge.judgement.fields["provenance"]["input_draw"]
    assert "under a CUDA device context" in draw and "host draw took" in draw

def test_by_default_inputs_of_a_few_tens_of_megabytes_are_drawn_on_the_device_and_small_ones_on_the_host():
    # A judgement draws about ten times while its lane holds the GPU; a 128 MB host draw took 0.3-0.5 s on a loaded
    # GPU host (RESULTS.md, 2026-12-06 late night), so the defaults move such draws to the device.
    config = VerifyConfig()
    assert config.gpu_draw_bytes == 32 * 2**20 and config.slow_draw_seconds == 0.05
    judge = cpu_judge(None)
    judge.reference.get_inputs = lambda: [torch.rand(4096, 4096)]  # 64 MB: chosen from the meta dry run's size
    judge._choose_input_draw()
    assert judge.draw_on_gpu and "inputs of 64 MB" in judge.judgement.fields["provenance"]["input_draw"]
    small = cpu_judge(None)  # 64 x 32: 8 KB, a host draw of microseconds
    small._choose_input_draw()
    assert not small.draw_on_gpu

def test_large_inputs_are_drawn_on_the_device_without_a_host_draw():
    judge = cpu_judge(None, gpu_draw_bytes=1024)  # the 64x32 fp32 input is 8 KB
    host_draws = []
    real_get_inputs = judge.reference.get_inputs

    def get_inputs():
        values = real_get_inputs()
        if values[0].device.type == "cpu":
            host_draws.append(1)
        return values

    judge.reference.get_inputs = get_inputs
    judge.prepare_reference()
    assert judge.draw_on_gpu and "inputs of 0 MB" in judge.judgement.fields["provenance"]["input_draw"]
    assert judge.judgement.fields["provenance"]["input_bytes"] == 64 * 32 * 4
    # On this CPU test the "device" is the CPU too, so count the draws instead: the dry run was on the meta
    # device, and the size alone chose the device draw (no timed host draw came first).
    assert host_draws and judge.draw_on_gpu

def test_a_fast_small_draw_stays_on_the_host():
    judge = cpu_judge(None)
    judge.prepare_reference()
    assert not judge.draw_on_gpu and judge.judgement.fields["provenance"]["input_draw"] == "get_inputs() on the host"

def test_fresh_inputs_are_new_draws_of_the_same_shapes():
    from dice_pipeline.verify.judge.inputs import fresh_inputs_on_device

    like = [torch.randn(8, 4), 3, torch.randint(0, 5, (8,))]

    def get_inputs():
        return [torch.randn(8, 4), 3, torch.randint(0, 5, (8,))]

    first = fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=1)
    second = fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=2)
    assert first is not None and second is not None and first[1] == 3
    assert not torch.equal(first[0], second[0]) and first[0].shape == like[0].shape
    assert torch.equal(first[0], fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=1)[0])

def test_fresh_inputs_fall_back_when_get_inputs_does_not_fit():
    from dice_pipeline.verify.judge.inputs import fresh_inputs_on_device

    like = [torch.randn(8, 4)]
    cpu = torch.device("cpu")

    def raises():
        raise RuntimeError("needs numpy")

    assert fresh_inputs_on_device(raises, like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 5)], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4).double()], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4), torch.randn(1)], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4, device="meta")], like, cpu, seed=0) is None

CANDIDATE_OOM = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
"""

RACY = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        type(self).calls += 1
        return x * 2.0 + (1e-3 if type(self).calls % 2 else 0.0)  # inside 1e-2, but two runs disagree
"""

ATOMIC_LIKE = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        type(self).calls += 1
        return x * 2.0 * (1 + (1e-7 if type(self).calls % 2 else 0.0))  # summation-order noise
"""

def test_the_honest_cpu_candidate_is_correct(refuse_nested_phases):
    judgement = refuse_nested_phases(cpu_judge(HONEST_DOUBLING)).run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons
    # where the time went, stage by stage
    phases = judgement.fields["provenance"]["phase_seconds"]
    assert {"prepare_reference", "build_model", "correctness"} <= set(phases) and "timing" not in phases
    assert all(seconds >= 0 for seconds in phases.values())

def test_a_candidates_own_out_of_memory_is_its_runtime_error_retried_once_with_less_state():
    first = cpu_judge(CANDIDATE_OOM).run(with_timing=False)
    assert first.status == Status.RUNTIME_ERROR and first.reasons[-1].code == "candidate_out_of_memory"
    assert first.fields["retry_low_memory"] is True
    second = cpu_judge(CANDIDATE_OOM, low_memory=True).run(with_timing=False)
    assert second.status == Status.RUNTIME_ERROR and "retry_low_memory" not in second.fields

def test_an_out_of_memory_in_the_harness_is_an_infrastructure_error(monkeypatch):
    def compare_runs_out(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")

    # Patched before the judge (and its runtime guard's snapshot) exists: the guard would call a later patch a cheat.
    monkeypatch.setattr(sys.modules[CandidateJudge.__module__], "null_outputs", compare_runs_out)
    judgement = cpu_judge(HONEST_DOUBLING).run(with_timing=False)
    assert judgement.status == Status.INFRASTRUCTURE_ERROR
    assert judgement.reasons[-1].code == "harness_out_of_memory" and judgement.fields["retry_low_memory"]

def test_two_runs_that_disagree_beyond_rounding_are_nondeterministic_output():
    judgement = cpu_judge(RACY).run(with_timing=False)
    assert judgement.status == Status.INCORRECT and judgement.reasons[-1].code == "nondeterministic_output"

def test_atomics_order_noise_passes_the_consistency_check():
    judgement = cpu_judge(ATOMIC_LIKE).run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons

def test_stale_output_equal_to_an_earlier_trial_is_deceptive():
    earlier = [torch.randn(64), torch.randn(64)]
    current = torch.randn(64)
    with pytest.raises(Rejection) as caught:
        CandidateJudge._reject_stale_output(earlier[0].clone(), current, earlier, trial=2)
    assert caught.value.status == Status.DECEPTIVE and caught.value.reason.code == "stale_output_reuse"
    assert "2 trial(s) back" in str(caught.value)

def test_plainly_wrong_output_is_not_called_stale():
    earlier = [torch.randn(64)]
    CandidateJudge._reject_stale_output(torch.randn(64), torch.randn(64), earlier, trial=1)  # no rejection
    CandidateJudge._reject_stale_output(torch.zeros(3), torch.randn(64), earlier, trial=1)  # wrong shape: no rejection

def test_input_independent_task_gives_no_stale_evidence():
    # The earlier result equals the current one: returning it is no evidence of a cache.
    constant = torch.full((8,), 3.0)
    CandidateJudge._reject_stale_output(constant.clone() + 1e-3, constant, [constant.clone()], trial=1)

def test_released_set_up_is_prepared_again_with_the_same_inputs_and_probe():
    """Before waiting for the whole GPU a worker gives back what the trusted set-up holds (worker.py); preparing
    again afterwards must see the very same seeded inputs and reference output."""
    judge = cpu_judge(None)
    judge.prepare_reference()
    probe = judge.probe.clone()
    judge.release_prepared()
    assert not judge.prepared and judge.probe is None and judge.ref_model is None
    judge.prepare_reference()
    assert judge.prepared and torch.equal(judge.probe, probe)

def test_preparing_again_for_the_whole_gpu_is_its_own_phase_not_a_nested_one(refuse_nested_phases):
    from dice_pipeline.verify import worker

    judge = refuse_nested_phases(cpu_judge(None))
    worker._prepare_reference(judge, judge.config, send_limit=False)
    judge.release_prepared()
    worker._prepare_reference(judge, judge.config, send_limit=False, phase="prepare_reference_whole_gpu")
    assert judge.prepared and set(judge.phase_seconds) == {"prepare_reference", "prepare_reference_whole_gpu"}

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; run on the GPU host")
def test_the_probe_call_measures_the_reference_s_workspace_on_the_gpu():
    """cumsum_reverse-style: flip, cumsum, flip. The call holds its input clone and two temporaries beside the
    output; the measured workspace feeds the whole-GPU rule (worker.needs_whole_gpu)."""
    source = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x.flip(0), 0).flip(0)
def get_inputs():
    return [torch.rand(4096, 4096)]
def get_init_inputs():
    return []
"""
    reference = module("reference_workspace_module", source)
    judge = CandidateJudge(reference, None, VerifyConfig(), RuntimeGuard(), [], device=torch.device("cuda"))
    judge.prepare_reference()
    mb64 = 4096 * 4096 * 4
    assert judge.reference_workspace_bytes >= 2 * mb64
    assert judge.judgement.fields["provenance"]["reference_workspace_bytes"] == judge.reference_workspace_bytes
