"""Shared test fixtures and the skip rules for hardware-dependent tests."""

from __future__ import annotations

import os
import shutil

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when Playwright and a Chromium are both installed."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs Playwright: pip install -e '.[ui-test]' (README: Testing the UI)"
    chromium = os.environ.get("DICE_CHROMIUM", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        return f"needs Chromium at {chromium}: apt-get install chromium, or set DICE_CHROMIUM (README: Testing the UI)"
    return None


def pytest_collection_modifyitems(config, items):
    has_gpu = _cuda_available()
    has_nvcc = shutil.which("nvcc") is not None
    browser_missing = _browser_missing() if any("browser" in item.keywords for item in items) else None
    for item in items:
        if "browser" in item.keywords and browser_missing:
            item.add_marker(pytest.mark.skip(reason=browser_missing))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU host (see benchmarks/RESULTS.md)"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc on PATH"))


REFERENCE_TEMPLATE = '''import torch
import torch.nn as nn

N = {n}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * {scale}


def get_inputs():
    return [torch.rand(N)]


def get_init_inputs():
    return []
'''

CANDIDATE_TEMPLATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
__global__ void relu_scale_kernel(const float* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) * {scale}f;
}}
torch::Tensor relu_scale(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""
cpp_src = "torch::Tensor relu_scale(torch::Tensor x);"
relu_scale = load_inline(name="relu_scale_{scale}", cpp_sources=cpp_src, cuda_sources=source,
                         functions=["relu_scale"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu_scale.relu_scale(x)
'''


def make_pair(index: int, speedup: float | None = 2.5, **extra) -> dict:
    """A valid ConCuR-format row; `index` makes its content (and so its hash) unique."""
    return {
        "uuid": f"pair-{index}",
        "problem_name": f"relu_scale_{index}",
        "pytorch_code": REFERENCE_TEMPLATE.format(n=1024 * (index + 1), scale=index + 1),
        "generated_code": CANDIDATE_TEMPLATE.format(scale=index + 1),
        "generated_think": "Fuse the ReLU and the scale into one pass.",
        "speedup_over_eager": speedup,
        **extra,
    }


@pytest.fixture
def pair_factory():
    return make_pair


@pytest.fixture(scope="session")
def kernelbench_index():
    """KernelBench's tasks indexed for decontamination (../shared/data/kernelbench or DICE_KERNELBENCH_TASKS);
    tests that need them are skipped, saying so, where they are absent."""
    from dice_pipeline.cuke.decontaminate import KernelBenchIndex
    from dice_pipeline.paths import kernelbench_tasks_path

    path = kernelbench_tasks_path()
    if path is None:
        pytest.skip("KernelBench's tasks are not here (../shared/data/kernelbench or DICE_KERNELBENCH_TASKS)")
    return KernelBenchIndex.from_path(path)


@pytest.fixture(scope="session")
def kernelbench_tasks_by_name(kernelbench_index):
    """Level-1 task name (e.g. "19_ReLU") -> its reference code."""
    return {task.name: task.code for task in kernelbench_index.tasks if task.level == 1}
