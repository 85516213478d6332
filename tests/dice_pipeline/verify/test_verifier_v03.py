"""CPU tests of verifier 0.3: chunked comparison, the input-draw choice, out-of-memory attribution and the
low-memory retry, run-to-run consistency, the baseline-kernel rule, the task-sized run limit, both timing
conventions in the verdict, and reading 0.2 verdicts only on request. The GPU side runs in test_gpu_verifier.py."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from dice_pipeline.verify import api
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.harness import (
    CandidateJudge,
    RuntimeGuard,
    _constant_outputs_pass,
    baseline_kernel_finding,
    compare_outputs,
    consistency_tolerance,
    kernel_family,
    warm_up,
)
from dice_pipeline.verify.sandbox import run_isolated
from dice_pipeline.verify.static_checks import StaticReport
from dice_pipeline.verify.store import VerdictStore, verdict_key
from dice_pipeline.verify.verdict import Reason, Status, Verdict

CPU = torch.device("cpu")


# --- chunked comparison ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_comparison_equals_the_whole_tensor_one(chunk):
    torch.manual_seed(0)
    ref = torch.randn(33, 17)
    cand = ref + torch.randn(33, 17) * 3e-3
    cand[3, 4] = float("nan")  # one unwritten element
    ref[5, 6] = cand[5, 6] = float("nan")  # NaN in both is equal
    ref[7, 1], cand[7, 1] = float("inf"), float("inf")
    whole = compare_outputs((ref, ref[:, :5].t()), (cand, cand[:, :5].t()), (1e-2, 1e-4), chunk=10**9)
    chunked = compare_outputs((ref, ref[:, :5].t()), (cand, cand[:, :5].t()), (1e-2, 1e-4), chunk=chunk)
    assert chunked.passes == whole.passes
    assert chunked.max_abs_diff == whole.max_abs_diff and chunked.unwritten_elements == whole.unwritten_elements == 2
    assert chunked.mean_abs_diff == pytest.approx(whole.mean_abs_diff)


def test_chunked_comparison_passes_exactly_where_allclose_does():
    torch.manual_seed(1)
    ref = torch.randn(1000)
    for scale in (1e-5, 5e-3, 2e-2):
        cand = ref + torch.randn(1000) * scale
        expected = bool(torch.allclose(cand.double(), ref.double(), atol=1e-2, rtol=1e-2))
        assert compare_outputs(ref, cand, (1e-2,), chunk=13).passes[1e-2] == expected


@pytest.mark.parametrize("chunk", [1, 13, 10**6])
def test_the_timed_calls_pass_fail_check_decides_as_the_full_comparison_does(chunk):
    # stats=False (the check on every timed call) must pass and fail exactly where the full comparison does.
    torch.manual_seed(2)
    ref = torch.randn(40, 25)
    cases = []
    for scale in (0.0, 1e-5, 5e-3, 9e-3, 2e-2, 1.0):
        cases.append(ref + torch.randn(40, 25) * scale)
    nan_unwritten = ref.clone()
    nan_unwritten[3, 3] = float("nan")
    both_nan = ref.clone()
    ref_with_nan = ref.clone()
    ref_with_nan[1, 2] = both_nan[1, 2] = float("nan")
    inf_mismatch = ref.clone()
    inf_mismatch[0, 0] = float("inf")
    for reference, candidate in [*((ref, c) for c in cases), (ref, nan_unwritten), (ref_with_nan, both_nan),
                                 (ref, inf_mismatch), (ref, ref[:, :5].t()), ((ref, ref.t()), (ref, ref.t() + 1)),
                                 ((ref, ref.t()), (ref, ref.t().contiguous())), (ref, ref.double())]:
        full = compare_outputs(reference, candidate, (1e-2, 1e-4), chunk=chunk)
        fast = compare_outputs(reference, candidate, (1e-2, 1e-4), chunk=chunk, stats=False)
        assert fast.passes == full.passes and fast.problem == full.problem
    # A transposed reference output against the same values laid out contiguously lines up chunk by chunk.
    assert compare_outputs(ref.t(), ref.t().contiguous(), (1e-4,), chunk=chunk).passes[1e-4]
    assert not compare_outputs(ref, inf_mismatch, (1e-2,), stats=False).passes[1e-2]
    assert compare_outputs(ref_with_nan, both_nan, (1e-2,), stats=False).passes[1e-2]


def _boundary_cases(dtype: torch.dtype, tol: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Reference/candidate pairs right at the tolerance and at the edges of the dtype's range."""
    info = torch.finfo(dtype)
    torch.manual_seed(3)
    ref = torch.randn(4096, dtype=torch.float64) * torch.logspace(-6, 6, 4096, dtype=torch.float64)
    cases = []
    for rel in (-0.5, -1e-3, -2.0**-18, -2.0**-22, -1e-9, 0.0, 1e-9, 2.0**-22, 2.0**-18, 1e-3, 0.5):
        # every element at (1 + rel) times the allowed error, alternating sign, in the dtype's rounding
        allowed = tol + tol * ref.abs()
        signs = torch.where(torch.arange(4096) % 2 == 0, 1.0, -1.0).double()
        cases.append((ref.to(dtype), (ref + signs * allowed * (1 + rel)).to(dtype)))
    special = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.max, -info.max, float("inf"), float("-inf"),
                            float("nan"), 1.0], dtype=dtype)
    for candidate in ([0.0, 0.0, 0.0, 0.0, info.max, -info.max, float("inf"), float("-inf"), float("nan"), 1.0],
                      [tol, -tol, 0.0, 0.0, -info.max, info.max, 1.0, float("inf"), float("nan"), 1.0],
                      [0.0, 0.0, 0.0, 0.0, info.max, -info.max, float("inf"), float("-inf"), 0.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0, info.max, -info.max, info.max, -info.max, float("nan"), 1.0 + 3 * tol]):
        cases.append((special, torch.tensor(candidate, dtype=dtype)))
    # an infinite reference against finite values, alone (no NaN beside it to fail the group anyway)
    for reference, candidate in (([float("inf"), 1.0], [1.0, 1.0]), ([float("-inf")], [-info.max]),
                                 ([info.max], [float("inf")]), ([1.0, float("inf")], [1.0, float("inf")])):
        cases.append((torch.tensor(reference, dtype=dtype), torch.tensor(candidate, dtype=dtype)))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tol", [1e-2, 1e-4])
def test_the_quick_pass_test_never_passes_what_the_float64_comparison_fails(dtype, tol):
    from dice_pipeline.verify.harness import _surely_close

    decided = {True: 0, False: 0}
    for ref, cand in _boundary_cases(dtype, tol):
        exact = torch.isclose(cand.double(), ref.double(), atol=tol, rtol=tol, equal_nan=True)
        for i in range(0, ref.numel(), 64):  # element groups: a quick pass must be an exact pass, group by group
            quick = bool(_surely_close(ref[i:i + 64], cand[i:i + 64], tol))
            assert not quick or bool(exact[i:i + 64].all()), (dtype, tol, i)
            decided[quick] += 1
        # and the whole check answers exactly as the float64 one does
        assert compare_outputs(ref, cand, (tol,), chunk=100, stats=False).passes[tol] == bool(exact.all())
        assert ref.dtype == cand.dtype == dtype  # never converted in place
    assert decided[True] and decided[False]  # both outcomes occur: the quick test is not vacuous


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tol", [1e-2, 1e-4])
def test_the_absolute_bound_never_passes_what_the_float64_comparison_fails(dtype, tol):
    from dice_pipeline.verify.harness import _within_absolute

    decided = {True: 0, False: 0}
    cases = _boundary_cases(dtype, tol)
    # differences right at tol itself, on references of every magnitude (the bound's own edge)
    ref = torch.randn(4096, dtype=torch.float64) * torch.logspace(-6, 6, 4096, dtype=torch.float64)
    for rel in (-1e-3, -2.0**-18, 0.0, 2.0**-18, 1e-3):
        cases.append((ref.to(dtype), (ref + tol * (1 + rel)).to(dtype)))
    for ref, cand in cases:
        exact = torch.isclose(cand.double(), ref.double(), atol=tol, rtol=tol, equal_nan=True)
        for i in range(0, ref.numel(), 64):
            quick = bool(_within_absolute(ref[i:i + 64], cand[i:i + 64], tol))
            assert not quick or bool(exact[i:i + 64].all()), (dtype, tol, i)
            decided[quick] += 1
    assert decided[True] and decided[False]
    assert bool(_within_absolute(torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype), tol))


def test_small_differences_are_vouched_for_in_two_passes_and_large_values_fall_through(monkeypatch):
    from dice_pipeline.verify import harness

    relative_calls = []
    real = harness._surely_close
    monkeypatch.setattr(harness, "_surely_close", lambda r, c, tol: (relative_calls.append(1), real(r, c, tol))[1])
    torch.manual_seed(5)
    ref = torch.randn(256, 256)
    assert compare_outputs(ref, ref + 1e-5, (1e-2,), chunk=10_000, stats=False).passes[1e-2]
    assert not relative_calls  # the absolute bound vouched for every chunk
    large = 1e4 + ref  # values about 1e4: errors of 1 pass relatively (1e-2 * 1e4) but not absolutely
    assert compare_outputs(large, large + 1.0, (1e-2,), chunk=10_000, stats=False).passes[1e-2]
    assert relative_calls
    half = ref.half()  # half types skip the absolute bound (their own difference rounds too coarsely)
    relative_calls.clear()
    assert compare_outputs(half, half, (1e-2,), stats=False).passes[1e-2] and relative_calls


def test_the_float64_comparison_runs_only_where_the_quick_test_cannot_vouch(monkeypatch):
    calls = []
    real_isclose = torch.isclose

    def counting_isclose(*args, **kwargs):
        calls.append(1)
        return real_isclose(*args, **kwargs)

    monkeypatch.setattr(torch, "isclose", counting_isclose)
    torch.manual_seed(4)
    ref = torch.randn(64, 64)
    assert compare_outputs(ref, ref + 1e-4, (1e-2,), chunk=1000, stats=False).passes[1e-2] and not calls
    assert not compare_outputs(ref, ref + 1.0, (1e-2,), chunk=1000, stats=False).passes[1e-2] and calls
    calls.clear()
    with_nan = ref.clone()
    with_nan[0, 0] = float("nan")
    assert compare_outputs(with_nan, with_nan.clone(), (1e-2,), stats=False).passes[1e-2] and calls  # NaN == NaN


def test_degenerate_detection_is_the_same_chunked():
    outputs = [torch.full((50,), 1e-4), torch.full((50,), -2e-4)]
    for chunk in (3, 10**6):
        constants: list[float] = []
        results = [_constant_outputs_pass(out, constants, 1e-2, chunk=chunk) for out in outputs]
        assert all(zeros for zeros, _ in results)


# --- a judge on the CPU: the correctness path with tiny models ---------------------------------------------------
def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)  # trusted test code
    return module


REFERENCE = """
import time
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
SLOW = 0.0
def get_inputs():
    time.sleep(SLOW)
    return [torch.rand(64, 32)]
def get_init_inputs():
    return []
"""


def _judge(candidate_src: str | None, **config) -> CandidateJudge:
    """A judge of the correctness path on the CPU (the profiler pass needs CUDA kernels: GPU tests cover it)."""
    reference = _module("reference_module", REFERENCE)
    candidate = _module("candidate_module", candidate_src) if candidate_src else None
    judge = CandidateJudge(reference, candidate, VerifyConfig(**config), RuntimeGuard(), ["k"], device=CPU)
    judge.run_profiler_check = lambda: None
    return judge


def test_a_slow_host_draw_moves_input_draws_to_the_device_and_says_so():
    judge = _judge(None, slow_draw_seconds=0.05)
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
    judge = _judge(None)
    judge.reference.get_inputs = lambda: [torch.rand(4096, 4096)]  # 64 MB: chosen from the meta dry run's size
    judge._choose_input_draw()
    assert judge.draw_on_gpu and "inputs of 64 MB" in judge.judgement.fields["provenance"]["input_draw"]
    small = _judge(None)  # 64 x 32: 8 KB, a host draw of microseconds
    small._choose_input_draw()
    assert not small.draw_on_gpu


def test_large_inputs_are_drawn_on_the_device_without_a_host_draw():
    judge = _judge(None, gpu_draw_bytes=1024)  # the 64x32 fp32 input is 8 KB
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
    judge = _judge(None)
    judge.prepare_reference()
    assert not judge.draw_on_gpu and judge.judgement.fields["provenance"]["input_draw"] == "get_inputs() on the host"


HONEST = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x + x
"""

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
    judgement = refuse_nested_phases(_judge(HONEST)).run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons
    # where the time went, stage by stage
    phases = judgement.fields["provenance"]["phase_seconds"]
    assert {"prepare_reference", "build_model", "correctness"} <= set(phases) and "timing" not in phases
    assert all(seconds >= 0 for seconds in phases.values())


def test_a_candidates_own_out_of_memory_is_its_runtime_error_retried_once_with_less_state():
    first = _judge(CANDIDATE_OOM).run(with_timing=False)
    assert first.status == Status.RUNTIME_ERROR and first.reasons[-1].code == "candidate_out_of_memory"
    assert first.fields["retry_low_memory"] is True
    second = _judge(CANDIDATE_OOM, low_memory=True).run(with_timing=False)
    assert second.status == Status.RUNTIME_ERROR and "retry_low_memory" not in second.fields


def test_an_out_of_memory_in_the_harness_is_an_infrastructure_error(monkeypatch):
    def compare_runs_out(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")

    # Patched before the judge (and its runtime guard's snapshot) exists: the guard would call a later patch a cheat.
    monkeypatch.setattr(sys.modules[CandidateJudge.__module__], "_constant_outputs_pass", compare_runs_out)
    judgement = _judge(HONEST).run(with_timing=False)
    assert judgement.status == Status.INFRASTRUCTURE_ERROR
    assert judgement.reasons[-1].code == "harness_out_of_memory" and judgement.fields["retry_low_memory"]


def test_two_runs_that_disagree_beyond_rounding_are_nondeterministic_output():
    judgement = _judge(RACY).run(with_timing=False)
    assert judgement.status == Status.INCORRECT and judgement.reasons[-1].code == "nondeterministic_output"


def test_atomics_order_noise_passes_the_consistency_check():
    judgement = _judge(ATOMIC_LIKE).run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons


def test_consistency_tolerance_is_far_tighter_than_correctness_but_not_below_precision():
    assert consistency_tolerance("float32", 1e-2, 0.01) == pytest.approx(1e-4)
    assert consistency_tolerance("float32", 1e-4, 0.01) == pytest.approx(1e-6)
    assert consistency_tolerance("float32", 1e-6, 0.01) == pytest.approx(4 * 2.0**-23)
    assert consistency_tolerance("bfloat16", 1e-2, 0.01) == pytest.approx(4 * 2.0**-7)


# --- the baseline-kernel rule -------------------------------------------------------------------------------------
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"
RELU = "void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min_kernel_functor<float> >(int, ...)"
DIV = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::DivFunctor<float> > >(int, ...)"


def _families(*names):
    return {kernel_family(name) for name in names}


def test_kernel_families_ignore_launch_variants():
    assert kernel_family(GEMM) == kernel_family("ampere_sgemm_128x64_nn") == "gemm"
    assert kernel_family("void cudnn::engines_precompiled::implicit_convolve_sgemm<float>(int)") == "conv"
    unrolled = "void at::native::unrolled_elementwise_kernel<at::native::clamp_min_kernel_functor<float>, L, S>(int)"
    assert kernel_family(RELU) == kernel_family(unrolled) != kernel_family(DIV)
    assert kernel_family("relu2_kernel(float const*, float*, long)") == "relu2_kernel"


def test_a_trivial_kernel_beside_a_pytorch_gemm_is_a_baseline_kernel():
    # torch.matmul (4,000 us of cuBLAS) plus a copy kernel (25 us): the reference's only kernel kind, a GEMM, ran.
    finding = baseline_kernel_finding(custom_us=25.0, total_us=4025.0, custom_ran=True,
                                      candidate_other_families=_families(GEMM), reference_families=_families(GEMM),
                                      max_share=0.5)
    assert finding is not None and "0.6%" in finding and "gemm" in finding
    # At small sizes the copy kernel's share is larger; the reference's work is still all PyTorch's.
    assert baseline_kernel_finding(3.0, 11.0, True, _families(GEMM), _families(GEMM), 0.5) is not None


def test_a_cublas_gemm_with_a_fused_custom_epilogue_is_not():
    # GEMM 12 us + a fused bias/ReLU/divide epilogue 1.2 us: 9% custom, but the reference's ReLU and divide kernels
    # are not in the candidate's PyTorch work: its kernel replaced them. At full size (0.3%) the same holds.
    for custom_us, total_us in ((1.2, 13.2), (10.0, 3000.0)):
        assert baseline_kernel_finding(custom_us, total_us, True, _families(GEMM), _families(GEMM, RELU, DIV),
                                       0.5) is None
    # The whole reference redone in PyTorch, then a copy kernel: a baseline kernel again.
    assert baseline_kernel_finding(1.2, 14.0, True, _families(GEMM, RELU, DIV), _families(GEMM, RELU, DIV),
                                   0.5) is not None
    # Custom kernels doing most of the time, or none having run, or an unknown reference: no finding.
    assert baseline_kernel_finding(50.0, 60.0, True, _families(GEMM), _families(GEMM), 0.5) is None
    assert baseline_kernel_finding(0.0, 50.0, False, _families(GEMM), _families(GEMM), 0.5) is None
    assert baseline_kernel_finding(1.0, 50.0, True, _families(GEMM), set(), 0.5) is None


def test_baseline_kernel_policy_is_validated():
    assert VerifyConfig().baseline_kernel_policy == "reject"
    VerifyConfig(baseline_kernel_policy="report")
    with pytest.raises(ValueError, match="baseline_kernel_policy"):
        VerifyConfig(baseline_kernel_policy="ignore")
    with pytest.raises(ValueError, match="speedup_convention"):
        VerifyConfig(speedup_convention="wall")


# --- limits sized from the task -------------------------------------------------------------------------------------
def test_run_limit_grows_with_the_task_and_is_capped():
    config = VerifyConfig(run_timeout_s=60, max_run_timeout_s=1800)
    small = config.run_time_limit(draw_s=0.001, reference_call_s=0.0001)
    large = config.run_time_limit(draw_s=0.01, reference_call_s=0.05)
    # A launch-bound task keeps about the base limit; a 50 ms reference call gets minutes more.
    assert 60 < small < 120 and large > 3 * small and large <= 1800
    assert config.run_time_limit(draw_s=1.0, reference_call_s=5.0) == 1800


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


ASK_FOR_MORE = """
import json, os, time
fd = int(os.environ["DICE_RUN_LIMIT_FD"])
os.write(fd, json.dumps({"limit_s": %s}).encode()); os.close(fd)
time.sleep(%s)
"""


def test_a_worker_may_ask_once_for_the_limit_its_task_needs(tmp_path):
    result = run_isolated(_child(ASK_FOR_MORE % (5.0, 2.0)), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=1.0, max_timeout_s=10.0, isolate_network=False)
    assert not result.timed_out and result.returncode == 0 and result.limit_s == 5.0


def test_the_asked_limit_is_capped_and_enforced(tmp_path):
    result = run_isolated(_child(ASK_FOR_MORE % (1000.0, 30.0)), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=0.5, max_timeout_s=1.5, isolate_network=False)
    assert result.timed_out and result.limit_s == 1.5 and result.wall_seconds < 10


def test_without_a_request_the_initial_limit_stands(tmp_path):
    result = run_isolated(_child("import time; time.sleep(30)"), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=1.0, max_timeout_s=60.0, isolate_network=False)
    assert result.timed_out and result.limit_s == 1.0 and result.wall_seconds < 10


# --- the batch: the low-memory retry, both conventions in the verdict -------------------------------------------------
def _fake_run(monkeypatch, payloads: list[dict]) -> tuple[api._BatchRun, list[dict]]:
    monkeypatch.setattr(api, "gpu_inventory", lambda: [api.GpuInfo(0, "Fake GPU", "1", "9.0")])
    run = api._BatchRun(VerifyConfig(verdict_store_dir=None), None)
    calls: list[dict] = []

    def fake_worker(job, stage, static, device, gate=None, *, control=False, low_memory=False,
                    gpu_exclusive=False, extra_request=None):
        calls.append({"stage": stage, "low_memory": low_memory, "control": control,
                      "extra_request": extra_request})
        outcome = types.SimpleNamespace(wall_seconds=1.0, network_isolated=True, peak_rss_mb=1.0, timed_out=False,
                                        memory_exceeded=False, limit_s=300.0, gpu_wait_s=None)
        return outcome, dict(payloads[len(calls) - 1])

    monkeypatch.setattr(run, "_run_worker", fake_worker)
    return run, calls


def test_an_out_of_memory_attempt_is_judged_again_with_less_state_and_the_second_verdict_stands(monkeypatch):
    run, calls = _fake_run(monkeypatch, [
        {"status": "infrastructure_error", "retry_low_memory": True, "peak_gpu_memory_mb": 130000.0,
         "reasons": [{"code": "harness_out_of_memory", "message": "24 GiB", "stage": "infrastructure"}]},
        {"status": "correct", "reasons": [], "flags": [], "speedup": 1.9, "speedup_gpu": 1.9, "speedup_host": 1.2,
         "speedup_convention": "gpu", "provenance": {"gpu": "Fake GPU"}},
    ])
    verdict = run.judge(VerifyJob("j", "ref", "cand"), StaticReport(), {}, device=0)
    assert [c["low_memory"] for c in calls] == [False, True]
    assert verdict.status == Status.CORRECT and verdict.speedup_gpu == 1.9 and verdict.speedup_host == 1.2
    assert verdict.provenance["first_attempt_out_of_memory"]["status"] == "infrastructure_error"


def test_no_retry_when_the_first_attempt_was_judged(monkeypatch):
    run, calls = _fake_run(monkeypatch, [{"status": "incorrect", "reasons": [], "flags": []}])
    verdict = run.judge(VerifyJob("j", "ref", "cand"), StaticReport(), {}, device=0)
    assert len(calls) == 1 and verdict.status == Status.INCORRECT


def test_measure_references_without_a_gpu_says_nothing_was_run(monkeypatch):
    monkeypatch.setattr(api, "gpu_inventory", lambda: [])
    rows = api.measure_references([("L1/1", REFERENCE), ("L1/2", REFERENCE)], VerifyConfig(),
                                  baselines=("eager", "compile"))
    assert [r["task_id"] for r in rows] == ["L1/1", "L1/2"]
    assert {r["status"] for r in rows} == {"not_executed"} and rows[0]["eager_ms_gpu"] is None
    with pytest.raises(ValueError, match="baselines"):
        api.measure_references([("t", REFERENCE)], VerifyConfig(), baselines=("tensorrt",))


def test_measure_references_reads_both_conventions_from_the_control_verdict(monkeypatch):
    run_payload = {"status": "correct", "reasons": [], "flags": [], "speedup": 1.0, "speedup_gpu": 1.01,
                   "speedup_host": 0.99, "speedup_convention": "gpu", "peak_gpu_memory_mb": 8200.0,
                   "reference_timing": {"median_ms": 2.0, "iqr_ms": 0.1, "mean_ms": 2.0, "n": 10, "cv": 0.01},
                   "baseline_speedups": {"compile": {"median_ms": 1.5, "n": 10, "convention": "gpu", "speedup": 1.3}},
                   "provenance": {"gpu": "Fake GPU", "reference_median_ms_host": 2.2,
                                  "input_draw": "get_inputs() on the host"}}
    monkeypatch.setattr(api, "gpu_inventory", lambda: [api.GpuInfo(0, "Fake GPU", "1", "9.0")])
    seen = []

    def fake_worker(self, job, stage, static, device, gate=None, *, control=False, low_memory=False,
                    gpu_exclusive=False, extra_request=None):
        seen.append(control)
        outcome = types.SimpleNamespace(wall_seconds=1.0, network_isolated=True, peak_rss_mb=1.0, timed_out=False,
                                        memory_exceeded=False, limit_s=300.0, gpu_wait_s=None)
        return outcome, dict(run_payload)

    monkeypatch.setattr(api._BatchRun, "_run_worker", fake_worker)
    [row] = api.measure_references([("L1/5", REFERENCE)], VerifyConfig(), baselines=("eager", "compile"))
    assert seen == [True] and row["status"] == "measured"
    assert (row["eager_ms_gpu"], row["eager_ms_host"], row["compile_ms_gpu"]) == (2.0, 2.2, 1.5)
    assert row["peak_gpu_mb"] == 8200.0 and row["control_speedup_gpu"] == 1.01


def test_verdicts_round_trip_both_conventions():
    verdict = Verdict(status=Status.CORRECT, speedup=2.5, speedup_gpu=2.5, speedup_host=1.4, speedup_convention="gpu",
                      peak_gpu_memory_mb=12.0)
    again = Verdict.from_json(verdict.to_json())
    assert (again.speedup_gpu, again.speedup_host, again.speedup_convention) == (2.5, 1.4, "gpu")
    old = Verdict.from_dict({"status": "correct", "speedup": 1.7, "reasons": []})  # a 0.2 verdict stays readable
    assert old.speedup == 1.7 and old.speedup_gpu is None


# --- 0.2 verdicts: readable on request, never silently ----------------------------------------------------------------
def test_older_verdicts_are_used_only_when_asked_for_and_say_so(tmp_path):
    store, job, config = VerdictStore(tmp_path), VerifyJob("j", "ref", "cand"), VerifyConfig()
    old = Verdict(status=Status.CORRECT, speedup=3.0, provenance={"gpu": "NVIDIA H200", "verifier_version": "0.2.0"})
    path = tmp_path / verdict_key(job, config, "0.2.0")[:2] / f"{verdict_key(job, config, '0.2.0')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(old.to_json())
    assert store.get(job, config, "NVIDIA H200") is None
    found = store.get(job, config, "NVIDIA H200", accept_versions=("0.2.0",))
    assert found is not None and "older_verifier_version" in found.flags
    assert found.provenance["judged_by_verifier"] == "0.2.0" and found.speedup_host == 3.0
    assert found.speedup_convention == "host"
    with pytest.raises(ValueError, match="cannot be read"):
        store.get(job, config, None, accept_versions=("0.1.0",))


def test_new_config_fields_do_not_enter_an_older_versions_key():
    job = VerifyJob("j", "ref", "cand")
    assert verdict_key(job, VerifyConfig(), "0.2.0") == verdict_key(
        job, VerifyConfig(speedup_convention="host", baseline_kernel_policy="report"), "0.2.0")
    assert verdict_key(job, VerifyConfig()) != verdict_key(job, VerifyConfig(speedup_convention="host"))
    assert verdict_key(job, VerifyConfig()) == verdict_key(job, VerifyConfig(low_memory=True))


def test_infrastructure_errors_are_not_stored(tmp_path):
    store = VerdictStore(tmp_path)
    verdict = Verdict(status=Status.INFRASTRUCTURE_ERROR, reasons=[Reason("harness_out_of_memory", "x")],
                      provenance={"gpu": "NVIDIA H200"})
    assert not store.put(VerifyJob("j", "r", "c"), VerifyConfig(), verdict)


def test_released_set_up_is_prepared_again_with_the_same_inputs_and_probe():
    """Before waiting for the whole GPU a worker gives back what the trusted set-up holds (worker.py); preparing
    again afterwards must see the very same seeded inputs and reference output."""
    judge = _judge(None)
    judge.prepare_reference()
    probe = judge.probe.clone()
    judge.release_prepared()
    assert not judge.prepared and judge.probe is None and judge.ref_model is None
    judge.prepare_reference()
    assert judge.prepared and torch.equal(judge.probe, probe)


def test_preparing_again_for_the_whole_gpu_is_its_own_phase_not_a_nested_one(refuse_nested_phases):
    from dice_pipeline.verify import worker

    judge = refuse_nested_phases(_judge(None))
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
    reference = _module("reference_workspace_module", source)
    judge = CandidateJudge(reference, None, VerifyConfig(), RuntimeGuard(), [], device=torch.device("cuda"))
    judge.prepare_reference()
    mb64 = 4096 * 4096 * 4
    assert judge.reference_workspace_bytes >= 2 * mb64
    assert judge.judgement.fields["provenance"]["reference_workspace_bytes"] == judge.reference_workspace_bytes


def test_the_wait_for_the_gpu_is_kept_apart_from_the_timed_section_s_seconds():
    """With several lanes, a timed section first waits for the other lanes' timed work: phase_seconds keeps that
    wait apart (`gpu_wait_for_timing`), so `timing` is this judgement's own time."""
    import time as _time

    from dice_pipeline.gpu_pool import SharedGpu
    from dice_pipeline.verify.gpu_share import GpuShareClient

    class SlowGate(GpuShareClient):
        def _ask(self, mode: str) -> None:
            if mode == SharedGpu.EXCLUSIVE:
                _time.sleep(0.3)  # another lane's timed section
            self.mode = mode

    judge = _judge(None)
    judge.gpu_share = SlowGate(None)
    judge.gpu_share.start()
    with judge.alone("timing"):
        _time.sleep(0.05)
    assert judge.phase_seconds["gpu_wait_for_timing"] >= 0.3
    assert 0.05 <= judge.phase_seconds["timing"] < 0.3
    assert judge.gpu_share.mode == SharedGpu.SHARED  # shared again after the section


class _WallClockEvent:
    """A stand-in for torch.cuda.Event on the CPU: the host's clock at record()."""

    def __init__(self, enable_timing: bool = True):
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: "_WallClockEvent") -> float:
        return (end.at - self.at) * 1e3


class _PairClock:
    """Pair times from a list (repeating its last one), each pair taking `step` seconds of a fake clock."""

    def __init__(self, times_ms: list[float], step: float = 0.0625):  # a binary fraction: exact sums
        self.times, self.step, self.now, self.calls = times_ms, step, 0.0, 0

    def pair(self) -> float:
        self.now += self.step
        self.calls += 1
        return self.times[min(self.calls, len(self.times)) - 1]

    def clock(self) -> float:
        return self.now


def test_warm_up_stops_once_warm_but_not_before_its_minimum():
    busy = _PairClock([1.0])  # a device already warm: steady from the first pair
    assert warm_up(busy.pair, 0.5, 1.0, busy.clock) == (8, True)  # held to the 0.5 s minimum
    quick = _PairClock([1.0])
    assert warm_up(quick.pair, 0.0, 1.0, quick.clock) == (6, True)  # two windows of three


def test_warm_up_waits_while_clocks_climb_and_gives_up_at_its_maximum():
    climbing = _PairClock([3.0, 2.8, 2.6, 2.3, 2.0, 1.7, 1.5, 1.3, 1.15, 1.05, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    pairs, steady = warm_up(climbing.pair, 0.0, 2.0, climbing.clock)
    assert steady and pairs >= 13  # not before the last window of falling times has passed
    jumpy = _PairClock([1.0, 2.0] * 100)  # never two windows alike: warms for the maximum, then goes on
    pairs, steady = warm_up(jumpy.pair, 0.0, 1.0, jumpy.clock)
    assert not steady and pairs == 16
    slow = _PairClock([500.0], step=1.0)  # a pair slower than the whole budget: still three pairs
    assert warm_up(slow.pair, 0.1, 0.5, slow.clock) == (3, False)
    fixed = _PairClock([1.0])  # minimum = maximum: the fixed warm-up of before
    assert warm_up(fixed.pair, 1.0, 1.0, fixed.clock) == (16, True)


def test_the_timing_loop_runs_on_the_cpu_and_says_where_its_time_went(refuse_nested_phases):
    judge = refuse_nested_phases(_judge(HONEST, timing_samples=12, timing_max_samples=12, timing_round_samples=4,
                                        l2_flush_mb=1, warmup_seconds=0.0))
    judge._event = _WallClockEvent
    judgement = judge.run()
    assert judgement.status == Status.CORRECT, judgement.reasons
    provenance = judgement.fields["provenance"]
    assert provenance["timing_pairs"] == 12 and provenance["timing_rounds"] == 3
    assert provenance["warmup_pairs"] >= 3 and isinstance(provenance["warmup_steady"], bool)
    assert judgement.fields["speedup_gpu"] > 0 and judgement.fields["speedup_host"] > 0
    split = provenance["timing_split_s"]
    assert set(split) == {"launch_floors", "warmup", "pairs"} and all(s >= 0 for s in split.values())
    # the split is part of the timing phase's wall time; the set-up before it is a phase of its own
    assert sum(split.values()) <= provenance["phase_seconds"]["timing"] + 1e-3
    assert provenance["phase_seconds"]["timing_setup"] >= 0


class _RecordingShare:
    """A stand-in for the worker's GpuShareClient: whether the GPU is held alone now, and how each hold ended."""

    def __init__(self):
        self.alone = False
        self.released_after: list[bool] = []

    def exclusive(self, *, then_release: bool = False):
        import contextlib

        @contextlib.contextmanager
        def hold():
            self.alone = True
            try:
                yield
            finally:
                self.alone = False
                self.released_after.append(then_release)
        return hold()


def _timing_judge(**config) -> CandidateJudge:
    judge = _judge(HONEST, timing_samples=4, timing_max_samples=4, timing_round_samples=4, l2_flush_mb=1,
                   warmup_seconds=0.0, **config)
    judge._event = _WallClockEvent
    judge.gpu_share = _RecordingShare()
    return judge


def test_the_timing_set_up_runs_beside_other_lanes_and_only_the_timed_pairs_have_the_gpu_alone():
    judge = _timing_judge()
    share = judge.gpu_share
    seen: list[tuple[str, bool]] = []
    setup, timed = judge._timing_setup, judge._run_timed_pairs
    judge._timing_setup = lambda: (seen.append(("setup", share.alone)), setup())[1]
    judge._run_timed_pairs = lambda *a: (seen.append(("pairs", share.alone)), timed(*a))[1]
    assert judge.run().status == Status.CORRECT
    assert seen == [("setup", False), ("pairs", True)]
    phases = judge.judgement.fields["provenance"]["phase_seconds"]
    assert {"timing_setup", "gpu_wait_for_timing", "timing"} <= set(phases)


def test_the_dispatcher_is_read_once_a_judgement_after_the_gpu_is_given_back(monkeypatch):
    # The read is 0.06 s of CPU work: inside the timed section, every other lane's timed section would wait for it.
    from dice_pipeline.verify.harness import DispatcherSnapshot

    reads: list[bool] = []
    real = DispatcherSnapshot.overrides
    holder: dict[str, CandidateJudge] = {}

    def recorded(self):
        reads.append(holder["judge"].gpu_share.alone)
        return real(self)

    monkeypatch.setattr(DispatcherSnapshot, "overrides", recorded)  # before the guard takes its snapshot
    holder["judge"] = judge = _timing_judge()
    assert judge.run().status == Status.CORRECT
    assert reads == [False]
    holder["judge"] = correctness_only = _judge(HONEST)  # the RL reward's judgement: read after the trials
    correctness_only.gpu_share = _RecordingShare()
    assert correctness_only.run(with_timing=False).status == Status.CORRECT
    assert reads == [False, False]


# Correct on every call the correctness trials make, then it starts writing into its input: only timed calls see it.
MUTATES_WHEN_TIMED = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        ModelNew.calls += 1
        out = x + x
        if ModelNew.calls > 15:  # 10 correctness calls and 3 warm-up pairs come first (4 timed pairs here)
            x.zero_()
        return out
"""


def test_a_candidate_that_writes_into_its_inputs_only_when_timed_is_caught_with_fresh_draws():
    judge = _timing_judge()
    judge.candidate = _module("candidate_module", MUTATES_WHEN_TIMED)
    judgement = judge.run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[0].code == "mutated_inputs", judgement.reasons
    assert "during timed call" in judgement.reasons[0].message


def test_a_task_that_hands_back_the_same_input_tensor_still_gets_a_pristine_copy():
    # get_inputs() caching its tensor: the fresh draw is the timing buffer itself, so the draw cannot be the
    # pristine copy; a clone is, and a candidate writing into its input is still caught.
    judge = _timing_judge()
    cached = torch.rand(64, 32)
    judge.reference.get_inputs = lambda: [cached]
    judge.candidate = _module("candidate_module", MUTATES_WHEN_TIMED)
    judgement = judge.run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[0].code == "mutated_inputs", judgement.reasons
    assert "during timed call" in judgement.reasons[0].message


def test_the_timed_section_gives_the_gpu_up_when_it_is_the_judgements_last_gpu_work():
    judge = _timing_judge()  # release_gpu_after_timing on by default, no extra baselines after the timing
    assert judge.run().status == Status.CORRECT and judge.gpu_share.released_after == [True]
    held = _timing_judge(release_gpu_after_timing=False)
    assert held.run().status == Status.CORRECT and held.gpu_share.released_after == [False]
    followed = _timing_judge(extra_baselines=["cuda_graph"])  # baselines timed after it: the hold goes on
    followed.run_extra_baselines = lambda: None  # (they need CUDA graphs: GPU tests cover them)
    assert followed.run().status == Status.CORRECT and followed.gpu_share.released_after == [False]
