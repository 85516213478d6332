"""CPU tests of the harness's pure decision logic: output comparison, the stale-output rule, the median interval
that decides when timing stops. The GPU stages themselves run in test_gpu_verifier.py."""

from __future__ import annotations

import random
import time

import pytest
import torch

from dice_pipeline.verify.gpu_share import GpuShareClient

from dice_pipeline.verify.harness import CandidateJudge, Rejection, compare_outputs, median_interval, timing_stats
from dice_pipeline.verify.verdict import Status


def test_compare_outputs_reports_mismatch_kinds():
    ref = torch.ones(4, 4)
    assert compare_outputs(ref, ref.clone(), (1e-2, 1e-4)).passes == {1e-2: True, 1e-4: True}
    off = ref + 5e-3
    assert compare_outputs(ref, off, (1e-2, 1e-4)).passes == {1e-2: True, 1e-4: False}
    assert compare_outputs(ref, torch.ones(4, 5), (1e-2,)).problem[0] == "shape_mismatch"
    assert compare_outputs(ref, ref.double(), (1e-2,)).problem[0] == "dtype_mismatch"
    assert compare_outputs((ref, ref), ref, (1e-2,)).problem[0] == "output_structure_mismatch"
    assert compare_outputs(ref, ref.to("meta"), (1e-2,)).problem[0] == "device_mismatch"
    poisoned = ref.clone()
    poisoned[0, :2] = float("nan")
    result = compare_outputs(ref, poisoned, (1e-2,))
    assert result.unwritten_elements == 2 and not result.passes[1e-2]


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


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_median_interval_brackets_the_median_and_narrows(n):
    rng = random.Random(n)
    values = [1.0 + rng.gauss(0, 0.05) for _ in range(n)]
    low, high = median_interval(values)
    median = sorted(values)[n // 2]
    assert low <= median <= high


def test_median_interval_covers_the_true_median_about_95_percent():
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        values = [rng.expovariate(1.0) for _ in range(100)]  # skewed, true median ln 2
        low, high = median_interval(values)
        covered += low <= 0.6931 <= high
    assert 0.90 <= covered / 400 <= 0.99


def test_median_interval_width_shrinks_with_samples():
    rng = random.Random(1)
    pool = [rng.gauss(1.0, 0.05) for _ in range(4000)]
    widths = [(lambda lo_hi: lo_hi[1] - lo_hi[0])(median_interval(pool[:n])) for n in (100, 400, 1600)]
    assert widths[0] > widths[1] > widths[2]


def test_timing_stats_fields():
    stats = timing_stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats.median_ms == 3.0 and stats.n == 5 and stats.iqr_ms > 0 and stats.cv > 0


@pytest.mark.parametrize("candidate", [torch.ones(4, 5), torch.ones(4, 4).double(), (torch.ones(4, 4),) * 2, 3.0])
def test_structural_mismatch_fails_every_tolerance(candidate):
    # The timed re-check looks at `passes` only: a wrong shape must never pass there.
    assert compare_outputs(torch.ones(4, 4), candidate, (1e-2, 1e-4)).passes == {1e-2: False, 1e-4: False}


def test_runtime_guard_catches_a_patched_harness_function():
    import sys

    from dice_pipeline.verify import harness

    guard = harness.RuntimeGuard()
    original = harness.compare_outputs
    sys.modules["dice_pipeline.verify.harness"].compare_outputs = lambda *a, **k: None
    try:
        with pytest.raises(Rejection) as caught:
            guard.check("in the test")
        assert caught.value.reason.code == "runtime_monkeypatch" and "compare_outputs" in str(caught.value)
    finally:
        harness.compare_outputs = original
    guard.check("after restoring")  # and an untouched state passes


def test_the_output_checks_linear_algebra_is_guarded_and_taken_before_any_candidate():
    from dice_pipeline.verify import harness

    guard = harness.RuntimeGuard()
    original = torch.linalg.vector_norm
    torch.linalg.vector_norm = lambda *a, **k: torch.zeros(())  # would make every timed output "close"
    try:
        ref = torch.zeros(8)
        assert not compare_outputs(ref, ref + 1.0, (1e-2,), stats=False).passes[1e-2]  # the harness's own copy
        with pytest.raises(Rejection) as caught:
            guard.check("in the test")
        assert caught.value.reason.code == "runtime_monkeypatch" and "vector_norm" in str(caught.value)
    finally:
        torch.linalg.vector_norm = original
    guard.check("after restoring")


def test_runtime_guard_catches_a_patched_harness_method_and_builtin():
    import builtins

    from dice_pipeline.verify import harness

    for owner, name in ((harness.CandidateJudge, "_timed_gpu"), (builtins, "max")):
        guard = harness.RuntimeGuard()
        original = getattr(owner, name)
        setattr(owner, name, lambda *a, **k: None)
        try:
            with pytest.raises(Rejection):
                guard.check("in the test")
        finally:
            setattr(owner, name, original)


def test_degenerate_means_one_fixed_answer_passes_every_trial():
    from dice_pipeline.verify.harness import _constant_outputs_pass

    def every_trial(outputs):
        constants: list[float] = []
        results = [_constant_outputs_pass(out, constants, 1e-2) for out in outputs]
        return all(z for z, _ in results), all(c for _, c in results)

    # A scalar that moves with the inputs (a sum): not degenerate, although each output is "constant" on its own.
    assert every_trial([torch.tensor(12.5), torch.tensor(-3.0), torch.tensor(40.0)]) == (False, False)
    # A scalar that barely moves (the MSE of large random tensors): a fixed answer passes.
    assert every_trial([torch.tensor(2.0001), torch.tensor(1.9998), torch.tensor(2.0003)]) == (False, True)
    # Tiny outputs: zeros pass.
    assert every_trial([torch.full((4,), 1e-4), torch.full((4,), -2e-4)])[0]
    # Outputs that vary within a trial are not degenerate.
    assert every_trial([torch.randn(64), torch.randn(64)]) == (False, False)


def test_fresh_inputs_are_new_draws_of_the_same_shapes():
    from dice_pipeline.verify.harness import fresh_inputs_on_device

    like = [torch.randn(8, 4), 3, torch.randint(0, 5, (8,))]

    def get_inputs():
        return [torch.randn(8, 4), 3, torch.randint(0, 5, (8,))]

    first = fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=1)
    second = fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=2)
    assert first is not None and second is not None and first[1] == 3
    assert not torch.equal(first[0], second[0]) and first[0].shape == like[0].shape
    assert torch.equal(first[0], fresh_inputs_on_device(get_inputs, like, torch.device("cpu"), seed=1)[0])


def test_fresh_inputs_fall_back_when_get_inputs_does_not_fit():
    from dice_pipeline.verify.harness import fresh_inputs_on_device

    like = [torch.randn(8, 4)]
    cpu = torch.device("cpu")

    def raises():
        raise RuntimeError("needs numpy")

    assert fresh_inputs_on_device(raises, like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 5)], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4).double()], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4), torch.randn(1)], like, cpu, seed=0) is None
    assert fresh_inputs_on_device(lambda: [torch.randn(8, 4, device="meta")], like, cpu, seed=0) is None


def _judge_without_gpu(model, baselines, timed_ms: float) -> CandidateJudge:
    """A CandidateJudge with only what run_extra_baselines touches, on the CPU, its timer replaced by a fixed one."""
    from dice_pipeline.verify.config import VerifyConfig
    from dice_pipeline.verify.harness import Judgement

    judge = CandidateJudge.__new__(CandidateJudge)
    judge.ref_model, judge.device = model, torch.device("cpu")
    judge.config = VerifyConfig(extra_baselines=baselines, timing_samples=5, l2_flush_mb=1)
    judge.judgement = Judgement(fields={"candidate_timing": timing_stats([2.0] * 5)})
    judge._synchronize = lambda: None
    judge._event = lambda enable_timing: None
    judge._perf_counter, judge.phase_seconds = time.perf_counter, {}
    judge._inputs = lambda seed: [torch.randn(8, 8)]
    judge.outputs = []
    judge.gpu_share = GpuShareClient(None)  # one lane: the modes are still tracked
    judge.gpu_share.start()
    judge.timed_modes = []

    def timed(fn, flush, start, end):
        judge.timed_modes.append(judge.gpu_share.mode)
        judge.outputs.append(fn())
        return None, timed_ms

    judge._timed_gpu = timed
    return judge


@pytest.mark.slow
def test_extra_baselines_record_a_speedup_or_the_error_and_nothing_else(refuse_nested_phases):
    # On this CPU machine torch.compile works (inductor's C++ backend) and a CUDA graph cannot be captured.
    judge = refuse_nested_phases(_judge_without_gpu(torch.nn.ReLU(), ("compile", "cuda_graph"), timed_ms=1.0))
    judge.run_extra_baselines()
    # set-up and the timed section apart, each counted once
    assert set(judge.phase_seconds) == {"extra_baselines_prepare", "gpu_wait_for_extra_baselines_timing",
                                        "extra_baselines_timing"}
    results = judge.judgement.fields["baseline_speedups"]
    # 1.0 ms baseline / 2.0 ms candidate, timed in the verifier's convention (gpu by default)
    assert results["compile"] == {"median_ms": 1.0, "n": 5, "convention": "gpu", "speedup": 0.5}
    assert set(results["cuda_graph"]) == {"error"} and results["cuda_graph"]["error"]
    # The compiled reference really ran and computed the reference's result.
    assert all(torch.equal(out, torch.relu(out)) for out in judge.outputs)
    assert judge.judgement.status == Status.CORRECT and not judge.judgement.reasons
    # Timed with the GPU to itself (other lanes wait), compiled and warmed while sharing it.
    assert judge.timed_modes == ["exclusive"] * 5 and judge.gpu_share.mode == "shared"


def test_generated_kernel_names_are_the_compilers_not_aten_cublas_or_the_candidates():
    from dice_pipeline.verify.verdict import generated_kernel_names

    seen = ["triton_poi_fused_mul_relu_0", "triton_red_fused_sum_1", "triton_tem_fused_addmm_2",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int, ...)",
            "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "relu2_kernel(float const*, float*, long)",
            "nvfuser_pointwise_f0_c1_r0_g0", "triton_poi_mine(float*)"]
    assert generated_kernel_names(seen, own_kernel_names=["relu2_kernel", "triton_poi_mine"]) == [
        "nvfuser_pointwise_f0_c1_r0_g0", "triton_poi_fused_mul_relu_0", "triton_red_fused_sum_1",
        "triton_tem_fused_addmm_2"]
