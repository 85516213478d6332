"""A complete build environment (verify/build_environment.py): the headers of the CUDA math libraries a CPU host's
toolkit lacks come from the nvidia-* wheels of the `cuda-headers` extra, so a CPU host builds what a GPU host builds
(a candidate including <ATen/cuda/CUDAContext.h>, which needs cuBLAS's, cuSPARSE's and cuSOLVER's headers); a
library header the host still lacks is the host's fault: infrastructure_error, never stored, never a compile_error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fake_workers import FakeWorkers
from verify_cases import HONEST_KERNEL, REFERENCE, candidate

from dice_pipeline.verify import GpuInfo, Status, VerifyConfig, VerifyJob, compile_only, gpu_inventory, verify_batch
from dice_pipeline.verify.build_environment import (
    CUDA_LIBRARY_HEADERS,
    cuda_home,
    library_header_dirs,
    missing_toolkit_header,
)
from dice_pipeline.verify.store import VerdictStore

needs_no_gpu = pytest.mark.skipif(bool(gpu_inventory()), reason="checks the compile-only path of a host without a GPU")

# The honest relu kernel launched on PyTorch's current stream, as 12 of 99 real DICE pairs do.
CUDA_CONTEXT_CANDIDATE = candidate(cuda_source=HONEST_KERNEL.replace(
    "#include <torch/extension.h>", "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>").replace(
    "relu2_kernel<<<(n + 255) / 256, 256>>>", "relu2_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>"))


def _host_has(header: str) -> bool:
    """Whether the toolkit or an installed nvidia-* wheel has `header` (a toolkit folder that does not exist makes
    library_header_dirs list every wheel folder)."""
    toolkit = cuda_home() / "include"
    return (toolkit / header).is_file() or any((Path(folder) / header).is_file()
                                              for folder in library_header_dirs(toolkit.parent / "no_such_toolkit"))


@pytest.mark.parametrize("log, header", [
    ("cuda.cu:3:10: fatal error: cublas_v2.h: No such file or directory\n compilation terminated.", "cublas_v2.h"),
    ("In file included from ATen/cuda/CUDAContext.h:3:\nfatal error: cusparse.h: No such file or directory", "cusparse.h"),
    ("main.cpp:1:10: fatal error: 'curand_kernel.h' file not found", "curand_kernel.h"),
    ("cuda.cu:2:10: fatal error: my_kernels.h: No such file or directory", None),  # the candidate's own header
    ("cuda.cu:2:10: fatal error: cublas_v3.h: No such file or directory", None),  # no CUDA library ships it
    ("cuda.cu(7): error: identifier \"undefined_name\" is undefined", None),
])
def test_only_a_missing_cuda_library_header_is_the_hosts_fault(log, header):
    assert missing_toolkit_header(log) == header


def test_the_wheels_headers_are_found_only_where_the_toolkit_lacks_them(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include" / "cublas_v2.h").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    bare = tmp_path / "toolkit" / "include"
    bare.mkdir(parents=True)
    assert str(site / "nvidia" / "cu13" / "include") in library_header_dirs(bare)
    for header in ("cublas_v2.h", "cusparse.h", "cusolverDn.h", "curand_kernel.h"):
        (bare / header).write_text("")
    assert library_header_dirs(bare) == []  # a complete toolkit: its own headers, nothing added


def test_the_worker_reports_a_missing_library_header_as_an_infrastructure_error(tmp_path):
    from dice_pipeline.verify.build_cache import BuildInterceptor, ExtensionCompileError
    from dice_pipeline.verify.worker import _compile_failure

    interceptor = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch="9.0")
    missing = _compile_failure(interceptor, ExtensionCompileError(
        "extension failed to compile", "cuda.cu:2:10: fatal error: cufft.h: No such file or directory"))
    assert missing["status"] == "infrastructure_error" and missing["reason"]["code"] == "toolkit_header_missing"
    assert "cufft.h" in missing["reason"]["message"] and "cuda-headers" in missing["reason"]["message"]
    broken = _compile_failure(interceptor, ExtensionCompileError("x", "cuda.cu(3): error: expected a \";\""))
    assert broken["status"] == "compile_error" and broken["reason"]["code"] == "build_failed"


def test_an_infrastructure_error_from_the_build_is_never_stored(tmp_path):
    workers = FakeWorkers(build={"status": "infrastructure_error", "reason": {
        "code": "toolkit_header_missing", "message": "the build needs cublas_v2.h", "stage": "compile"}})
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), verdict_store_dir=str(tmp_path / "store"),
                          use_precompiled_header=False, build_batch_size=1)
    [verdict] = verify_batch([VerifyJob("j", REFERENCE, CUDA_CONTEXT_CANDIDATE)], config,
                             gpus=[GpuInfo(0, "Fake GPU", "1", "9.0")], worker_runner=workers)
    assert verdict.status == Status.INFRASTRUCTURE_ERROR and verdict.reason_codes() == ["toolkit_header_missing"]
    assert len(VerdictStore(config.verdict_store_dir)) == 0 and not workers.stage("run")


def test_the_library_headers_are_what_the_wheels_and_aten_need():
    assert {"cublas_v2.h", "cusparse.h", "cusolverDn.h", "curand_kernel.h", "cufft.h"} <= CUDA_LIBRARY_HEADERS


@needs_no_gpu
@pytest.mark.nvcc
@pytest.mark.slow
def test_a_candidate_including_the_cuda_context_header_builds_on_a_cpu_host(tmp_path):
    if not all(_host_has(header) for header in ("cublas_v2.h", "cusparse.h", "cusolverDn.h")):
        pytest.skip("needs the cuda-headers extra where the toolkit lacks the library headers: "
                    "pip install -e '.[cuda-headers]' (CI installs it)")
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), use_precompiled_header=False,
                          compile_timeout_s=900)
    verdict = compile_only(REFERENCE, CUDA_CONTEXT_CANDIDATE, config)
    assert verdict.status == Status.NOT_EXECUTED and verdict.reason_codes() == ["no_gpu"], verdict.to_json()
    assert verdict.provenance["build_mode"] == "compile_only" and verdict.compile_seconds > 0


@needs_no_gpu
@pytest.mark.nvcc
@pytest.mark.slow
def test_a_library_header_the_host_lacks_is_an_infrastructure_error_not_a_compile_error(tmp_path):
    if _host_has("cufft.h"):
        pytest.skip("this host has cuFFT's headers")
    uses_cufft = candidate(cuda_source=HONEST_KERNEL.replace("#include <torch/extension.h>",
                                                             "#include <torch/extension.h>\n#include <cufft.h>"))
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), use_precompiled_header=False,
                          compile_timeout_s=900)
    verdict = compile_only(REFERENCE, uses_cufft, config)
    assert verdict.status == Status.INFRASTRUCTURE_ERROR, verdict.to_json()
    assert verdict.reason_codes() == ["toolkit_header_missing"] and "cufft.h" in verdict.reasons[0].message
