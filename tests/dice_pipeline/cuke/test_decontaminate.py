"""Decontamination against the real KernelBench tasks: disguised copies are caught and named, unrelated code is not."""

from __future__ import annotations


import polars as pl
import pytest

from dice_pipeline.paths import kernelbench_tasks_path
from dice_pipeline.cuke.decontaminate import (
    KernelBenchIndex,
    decontaminate,
    decontamination_summary,
)
from dice_pipeline.cuke.normalize import normalize_python

KERNELBENCH_TASKS = kernelbench_tasks_path()

pytestmark = pytest.mark.skipif(
    KERNELBENCH_TASKS is None, reason=f"KernelBench tasks not found at {KERNELBENCH_TASKS}"
)

# KernelBench L2/37_Matmul_Swish_Sum_GroupNorm disguised: other class, attribute and variable names, `from torch
# import nn`, comments and a docstring of its own, type hints, sizes changed, the swish written the other way round.
DISGUISED_L2_37 = '''
import torch
from torch import nn


class FusedBlock(nn.Module):
    """Linear layer, then swish, a learned bias and group normalisation."""

    def __init__(self, n_in: int, n_out: int, groups: int, shift_shape) -> None:
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)  # the GEMM
        self.shift = nn.Parameter(torch.randn(shift_shape))
        self.norm = nn.GroupNorm(groups, n_out)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        # project, activate, shift, normalise
        inp = self.proj(inp)
        inp = torch.sigmoid(inp) * inp
        inp = inp + self.shift
        inp = self.norm(inp)
        return inp


BATCH = 16384
N_IN = 2048
N_OUT = 4096
GROUPS = 32
SHIFT_SHAPE = (N_OUT,)


def get_inputs():
    return [torch.rand(BATCH, N_IN)]


def get_init_inputs():
    return [N_IN, N_OUT, GROUPS, SHIFT_SHAPE]
'''

UNRELATED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Rotary position embedding applied to a query tensor, then a running max over the sequence."""

    def __init__(self, base: float):
        super().__init__()
        self.base = base

    def forward(self, q):
        b, s, h, d = q.shape
        inv = 1.0 / (self.base ** (torch.arange(0, d, 2, device=q.device).float() / d))
        angles = torch.outer(torch.arange(s, device=q.device).float(), inv)
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        q1, q2 = q[..., ::2], q[..., 1::2]
        rotated = torch.stack((q1 * cos - q2 * sin, q1 * sin + q2 * cos), dim=-1).flatten(-2)
        return torch.cummax(rotated, dim=1).values


def get_inputs():
    return [torch.rand(4, 1024, 16, 64)]


def get_init_inputs():
    return [10000.0]
'''


@pytest.fixture(scope="module")
def index() -> KernelBenchIndex:
    return KernelBenchIndex.from_path()


def test_normalisation_makes_renamed_code_identical():
    original = "import torch\nclass A:\n    def f(self, x):\n        '''doc'''\n        return torch.relu(x)  # c\n"
    renamed = "import torch\n\nclass Other:\n    def g(self, value):\n        return torch.relu(value)\n"
    assert normalize_python(original) == normalize_python(renamed)
    assert normalize_python(original) != normalize_python(renamed.replace("relu", "tanh"))


def test_disguised_kernelbench_task_is_caught_and_named(index):
    match = index.match(DISGUISED_L2_37)
    assert match is not None
    assert match.task_key == "L2/37_Matmul_Swish_Sum_GroupNorm"


def test_kernelbench_tasks_match_themselves_exactly():
    from dice_pipeline.kernelbench import load_kernelbench_tasks

    tasks = load_kernelbench_tasks(KERNELBENCH_TASKS).tasks[::25]
    small_index = KernelBenchIndex(tasks)
    for task in tasks:
        match = small_index.match(task.code)
        assert match is not None and (match.task_key, match.rule) == (task.key, "exact")


def test_unrelated_task_is_not_caught(index):
    assert index.match(UNRELATED) is None
    best = index.similarities(UNRELATED)
    assert not best or max(best[0].jaccard, best[0].containment) < 0.6


def test_kernelbench_task_inside_a_larger_file_is_caught_by_containment(index):
    extra = (
        "\n\ndef helper_unused(a, b):\n"
        + "".join(f"    a = torch.tanh(a) * b + {i}\n" for i in range(40))
        + "    return a\n"
    )
    match = index.match(DISGUISED_L2_37 + extra)
    assert match is not None and match.task_key == "L2/37_Matmul_Swish_Sum_GroupNorm"


def test_decontaminate_drops_and_counts_with_task_named(index):
    rows = pl.DataFrame(
        {"sample_id": ["copy", "clean", "broken"], "pytorch_code": [DISGUISED_L2_37, UNRELATED, "def x(:"]}
    )
    clean, drops = decontaminate(rows, index)
    assert clean["sample_id"].to_list() == ["clean", "broken"]
    assert drops.to_dicts()[0]["row_id"] == "copy"
    assert drops.to_dicts()[0]["kernelbench_task"] == "L2/37_Matmul_Swish_Sum_GroupNorm"
    summary = decontamination_summary(drops, rows.height, index.config)
    assert summary["dropped"] == 1 and summary["by_kernelbench_level"] == {"L2": 1}
