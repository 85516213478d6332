"""GPU tests of the verifier (run on the GPU host): the runtime adversarial suite, a crashing kernel followed by an
honest one in the same batch, and timing repeatability. Skipped where no CUDA GPU is present."""

from __future__ import annotations

import os
import tempfile

import pytest
from verify_cases import HONEST, REFERENCE, RUNTIME_CASES

from dice_pipeline.verify import Status, VerifyConfig, VerifyJob, verify_batch

pytestmark = pytest.mark.gpu
CACHE_DIR = os.environ.get("DICE_VERIFY_CACHE") or os.path.join(tempfile.gettempdir(), "dice_verify_test_cache")


def _config(**overrides) -> VerifyConfig:
    return VerifyConfig(build_cache_dir=CACHE_DIR, **overrides)


@pytest.fixture(scope="module")
def suite_verdicts():
    jobs = [VerifyJob(c.name, c.reference, c.source) for c in RUNTIME_CASES]
    return dict(zip([c.name for c in RUNTIME_CASES], verify_batch(jobs, _config())))


@pytest.mark.parametrize("case", RUNTIME_CASES, ids=lambda c: c.name)
def test_runtime_case_gets_expected_verdict(case, suite_verdicts):
    verdict = suite_verdicts[case.name]
    print(case.name, verdict.summary())
    assert verdict.status.value == case.status, verdict.to_json()
    if case.codes:
        assert set(case.codes) & set(verdict.reason_codes()), verdict.to_json()
    assert set(case.flags) <= set(verdict.flags), verdict.flags
    assert verdict.provenance["gpu"] and verdict.provenance["verifier_version"]


def test_honest_verdict_has_timing_and_provenance(suite_verdicts):
    verdict = suite_verdicts["honest"]
    assert verdict.reference_timing.n >= 100 and verdict.candidate_timing.n >= 100
    assert verdict.speedup and verdict.speedup > 0
    assert verdict.custom_kernel_time_share and verdict.custom_kernel_time_share > 0.5
    assert verdict.correct_at_1e2 and verdict.correct_at_1e4
    for key in ("gpu", "driver", "torch", "cuda", "time", "timing_method"):
        assert verdict.provenance.get(key), key


def test_crash_then_honest_kernel_in_same_batch():
    crash = next(c for c in RUNTIME_CASES if c.name == "illegal_memory_access")
    # One build slot: the crashing candidate reaches the GPU first, the honest one runs after it.
    verdicts = verify_batch([VerifyJob("crash", REFERENCE, crash.source), VerifyJob("honest", REFERENCE, HONEST)],
                            _config(max_parallel_builds=1))
    assert verdicts[0].status == Status.RUNTIME_ERROR
    assert verdicts[1].status == Status.CORRECT, verdicts[1].to_json()


def test_same_candidate_three_times_gives_speedups_within_3_percent():
    verdicts = verify_batch([VerifyJob(f"run{i}", REFERENCE, HONEST) for i in range(3)], _config(max_parallel_builds=1))
    speedups = [v.speedup for v in verdicts]
    print("speedups", speedups)
    assert all(v.status == Status.CORRECT for v in verdicts)
    assert (max(speedups) - min(speedups)) / min(speedups) <= 0.03, speedups


def test_extra_baselines_time_the_reference_as_a_cuda_graph_and_compiled():
    (verdict,) = verify_batch([VerifyJob("baselines", REFERENCE, HONEST)],
                              _config(extra_baselines=("cuda_graph", "compile")))
    print(verdict.summary(), verdict.baseline_speedups)
    assert verdict.status == Status.CORRECT, verdict.to_json()
    graph = verdict.baseline_speedups["cuda_graph"]
    assert graph["n"] >= 100 and graph["median_ms"] > 0 and graph["speedup"] > 0
    # torch.compile may be unavailable for a reference (then its error is recorded), but it is always reported.
    compiled = verdict.baseline_speedups["compile"]
    assert ("speedup" in compiled and compiled["speedup"] > 0) or compiled.get("error")


# --- verifier 0.3 -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def v03_verdicts():
    from verify_cases import V03_RUNTIME_CASES

    jobs = [VerifyJob(c.name, c.reference, c.source) for c in V03_RUNTIME_CASES]
    return dict(zip([c.name for c in V03_RUNTIME_CASES], verify_batch(jobs, _config())))


def _v03_case(name):
    from verify_cases import V03_RUNTIME_CASES

    return next(c for c in V03_RUNTIME_CASES if c.name == name)


@pytest.mark.parametrize("name", ["racy_sgemm", "tiled_sgemm", "atomic_rowsum", "matmul_plus_copy_kernel",
                                  "cublas_gemm_fused_epilogue", "full_size_scalar_multiply"])
def test_v03_case_gets_expected_verdict(name, v03_verdicts):
    case, verdict = _v03_case(name), v03_verdicts[name]
    print(name, verdict.summary(), verdict.custom_kernel_time_share, verdict.peak_gpu_memory_mb)
    assert verdict.status.value == case.status, verdict.to_json()
    if case.codes:
        assert set(case.codes) & set(verdict.reason_codes()), verdict.to_json()
    assert set(case.flags) <= set(verdict.flags), verdict.flags


def test_v03_correct_verdicts_carry_both_conventions(v03_verdicts):
    for name in ("tiled_sgemm", "atomic_rowsum", "cublas_gemm_fused_epilogue", "full_size_scalar_multiply"):
        verdict = v03_verdicts[name]
        assert verdict.speedup_gpu and verdict.speedup_host and verdict.speedup_convention == "gpu", name
        assert verdict.speedup == verdict.speedup_gpu and verdict.peak_gpu_memory_mb > 0


def test_full_size_task_draws_on_the_gpu_inside_its_limit(v03_verdicts):
    verdict = v03_verdicts["full_size_scalar_multiply"]
    provenance = verdict.provenance
    assert "under a CUDA device context" in provenance["input_draw"], provenance["input_draw"]
    assert provenance["run_limit_s"] >= VerifyConfig().run_timeout_s
    assert verdict.peak_gpu_memory_mb > 8 * 1024  # input and output of 4 GiB each were resident


def test_baseline_kernel_is_reported_not_rejected_under_the_report_policy():
    case = _v03_case("matmul_plus_copy_kernel")
    (verdict,) = verify_batch([VerifyJob(case.name, case.reference, case.source)],
                              _config(baseline_kernel_policy="report"))
    assert verdict.status == Status.CORRECT and "baseline_kernel" in verdict.flags, verdict.to_json()
