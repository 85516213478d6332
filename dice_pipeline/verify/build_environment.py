"""The build's CUDA environment: where the toolkit is, which headers of the CUDA math libraries it lacks on this host
and where installed nvidia-* wheels provide them (the `cuda-headers` extra), and how to tell a build that failed for
want of one (the host's fault: infrastructure_error) from one that failed for the candidate's code. Standard library
only (read in the worker, before and after builds, and in the parent)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Headers of the CUDA toolkit's math libraries (cuBLAS, cuSPARSE, cuSOLVER, cuRAND, cuFFT, NVRTC, nvJitLink), by file
# name. A GPU host has them (its toolkit, or the nvidia-* wheels its CUDA torch depends on); a CPU host's toolkit may
# not (ours has none), and ATen/cuda/CUDAContext.h alone includes cuBLAS's, cuSPARSE's and cuSOLVER's. The wheels of
# the `cuda-headers` extra (pyproject.toml) give a CPU host those of a GPU host's torch (library_header_dirs); a build
# that still misses one failed for the host, not the candidate (missing_toolkit_header: infrastructure_error).
CUDA_LIBRARY_HEADERS = frozenset({
    "cublas.h", "cublas_api.h", "cublas_v2.h", "cublasLt.h", "cublasXt.h", "nvblas.h",
    "cusparse.h", "cusparse_v2.h",
    "cusolverDn.h", "cusolverMg.h", "cusolverRf.h", "cusolverSp.h", "cusolverSp_LOWLEVEL_PREVIEW.h", "cusolver_common.h",
    "curand.h", "curand_discrete.h", "curand_discrete2.h", "curand_globals.h", "curand_kernel.h", "curand_lognormal.h",
    "curand_mrg32k3a.h", "curand_mtgp32.h", "curand_mtgp32_host.h", "curand_mtgp32_kernel.h",
    "curand_mtgp32dc_p_11213.h", "curand_normal.h", "curand_normal_static.h", "curand_philox4x32_x.h",
    "curand_poisson.h", "curand_precalc.h", "curand_uniform.h",
    "cufft.h", "cufftXt.h", "cufftw.h", "nvrtc.h", "nvJitLink.h",
})
# One header of each library the extra installs: where the toolkit lacks one, the wheels' folders are searched.
_LIBRARY_PROBES = ("cublas_v2.h", "cusparse.h", "cusolverDn.h", "curand_kernel.h")
# gcc/nvcc ("fatal error: x.h: No such file or directory") and clang ("fatal error: 'x.h' file not found").
_MISSING_HEADER = re.compile(r"fatal error: '?([\w./+-]+?)'?(?:: No such file or directory| file not found)")


def cuda_home() -> Path:
    """The CUDA toolkit's root as torch's extension builder finds it: $CUDA_HOME, $CUDA_PATH, else /usr/local/cuda."""
    return Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")


def library_header_dirs(toolkit_include: Path) -> list[str]:
    """Include folders of installed nvidia-* wheels (`pip install -e '.[cuda-headers]'`: site-packages/nvidia/cu13/
    include, or nvidia/<library>/include for CUDA 12's) holding library headers `toolkit_include` lacks; none where
    the toolkit has them all. Searched after the toolkit's own folder, so its headers always win."""
    import importlib.util

    missing = [header for header in _LIBRARY_PROBES if not (toolkit_include / header).is_file()]
    if not missing:
        return []
    spec = importlib.util.find_spec("nvidia")
    roots = [Path(root) for root in (spec.submodule_search_locations or [])] if spec is not None else []
    found: list[str] = []
    for root in roots:
        for folder in sorted(root.glob("cu*/include")) + sorted(root.glob("*/include")):
            if str(folder) not in found and any((folder / header).is_file() for header in missing):
                found.append(str(folder))
    return found


def missing_toolkit_header(log: str) -> str | None:
    """The CUDA library header a build could not find (one of CUDA_LIBRARY_HEADERS, by its file name), or None:
    the host lacks it, so the build failed for the host, not for the candidate."""
    for name in _MISSING_HEADER.findall(log):
        if name in CUDA_LIBRARY_HEADERS:
            return name
    return None
