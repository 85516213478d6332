"""A CandidateJudge on the CPU for the verifier's tests: reference and candidate modules made from source, the
correctness path and (with WallClockEvent) the timing loop run as on the GPU, without one. The profiler pass needs
CUDA kernels: it is skipped here (GPU tests cover it)."""

from __future__ import annotations

import contextlib
import time
import types

import torch

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.judge import CandidateJudge, RuntimeGuard

CPU = torch.device("cpu")

# 2 * x on a small input: the task most CPU judge tests use.
DOUBLING_REFERENCE = """
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

HONEST_DOUBLING = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x + x
"""


def module(name: str, source: str) -> types.ModuleType:
    made = types.ModuleType(name)
    exec(compile(source, name, "exec"), made.__dict__)  # trusted test code
    return made


def cpu_judge(candidate_src: str | None, reference_src: str = DOUBLING_REFERENCE, *, control: bool = False,
              **config) -> CandidateJudge:
    """A judge of `candidate_src` (None: no candidate module; `control`: the reference against itself)."""
    reference = module("reference_module", reference_src)
    candidate = module("candidate_module", candidate_src) if candidate_src else None
    judge = CandidateJudge(reference, candidate, VerifyConfig(**config), RuntimeGuard(), ["k"], device=CPU,
                           control=control)
    judge.run_profiler_check = lambda: None
    return judge


class WallClockEvent:
    """A stand-in for torch.cuda.Event on the CPU: the host's clock at record()."""

    def __init__(self, enable_timing: bool = True):
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: WallClockEvent) -> float:
        return (end.at - self.at) * 1e3


class RecordingShare:
    """A stand-in for the worker's GpuShareClient: whether the GPU is held alone now, and how each hold ended."""

    def __init__(self):
        self.alone = False
        self.released_after: list[bool] = []

    def exclusive(self, *, then_release: bool = False):
        @contextlib.contextmanager
        def hold():
            self.alone = True
            try:
                yield
            finally:
                self.alone = False
                self.released_after.append(then_release)
        return hold()


def timing_judge(candidate_src: str = HONEST_DOUBLING, reference_src: str = DOUBLING_REFERENCE, **config
                 ) -> CandidateJudge:
    """A CPU judge that also runs the timing loop: four timed pairs, no warm-up minimum, wall-clock events."""
    settings = dict(timing_samples=4, timing_max_samples=4, timing_round_samples=4, l2_flush_mb=1, warmup_seconds=0.0)
    judge = cpu_judge(candidate_src, reference_src, **{**settings, **config})
    judge._event = WallClockEvent
    judge.gpu_share = RecordingShare()
    return judge
