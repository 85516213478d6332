"""The verifier's verdict: the one data contract every stage reads (filtering, synthesis, RL reward, evaluation).

Standard library only: the verdict is built in GPU worker processes (torch, no Dagster) and read in the
Dagster process (no torch), and travels between them as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

# 0.2: paired-ratio timing in rounds, stale-output check, verdict store.
# 0.3: full-size tasks (chunked comparison, GPU input draws, harness faults as infrastructure_error, limits scaled
# to the task), both timing conventions (speedup_gpu / speedup_host), run-to-run consistency, the baseline-kernel
# reward policy.
# 0.3.1: dispatcher overrides (`dispatcher_override`: the candidate's kernels for PyTorch's operators, Python modes
# and dispatch-key switches left on) and work moved to the host (`host_compute`) are deceptive.
# 0.4: on a degenerate task a candidate must also pass a test a null output fails (`no_better_than_null_output`,
# `null_output_check`, `relative_error`); a timed call's wrong output is judged again alone (an input-dependent bug is
# `incorrect`, not `deceptive`); a toolkit header missing on the build host is `infrastructure_error`.
VERIFIER_VERSION = "0.4.0"
# Versions whose stored verdicts can still be read on request (VerdictStore.get(accept_versions=...)): never reused
# silently, and a verdict read that way says so in its provenance and flags.
READABLE_VERIFIER_VERSIONS = ("0.3.1", "0.3.0", "0.2.0")


class Status(str, Enum):
    """Outcome of judging one candidate. Ordered roughly by how far the candidate got."""

    COMPILE_ERROR = "compile_error"  # the candidate's extension (or Python file) did not build / import
    RUNTIME_ERROR = "runtime_error"  # it built but raised or crashed while running
    TIMEOUT = "timeout"  # a stage ran past its time limit; the process group was killed
    INCORRECT = "incorrect"  # it ran but its outputs do not match the reference
    DECEPTIVE = "deceptive"  # it games the check (PyTorch fallback, timer patching, caching, side streams...)
    CORRECT = "correct"  # built, matched the reference on every trial, passed every anti-gaming check
    NOT_EXECUTED = "not_executed"  # every check reachable here passed, but execution needs a GPU that is absent
    # The verifier failed, not the candidate (its own memory use, a lost worker): no judgement was made. Never a
    # reward of 0 or an evaluation failure; judge again.
    INFRASTRUCTURE_ERROR = "infrastructure_error"


# Statuses that end a candidate for good: no downstream stage may use it.
REJECTING_STATUSES = frozenset(
    {Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.INCORRECT, Status.DECEPTIVE}
)


@dataclass
class Reason:
    """One finding, machine-readable `code` (e.g. `torch_op_on_forward_path`) plus a human message."""

    code: str
    message: str
    stage: str = ""  # static | compile | correctness | anti_gaming | timing


@dataclass
class TimingStats:
    """Per-call GPU time in milliseconds over `n` timed samples."""

    median_ms: float
    iqr_ms: float
    mean_ms: float
    n: int
    cv: float  # coefficient of variation (std / mean)


# GPU kernels a compiler generated from PyTorch code (Inductor's Triton kernels, nvFuser's): torch.compile's work,
# however a candidate reached it. The static checks catch the plain spellings; the profiler pass catches the rest.
GENERATED_KERNEL_PATTERN = re.compile(r"\btriton_(?:poi|red|per|tem|for|unk)_|\btriton_\w*fused_|\bnvfuser_|CudaCodeGen")


def kernel_is_named(kernel_name: str, names: Iterable[str]) -> bool:
    """Whether a profiler kernel name (`void ns::name<...>(args)`) is one of `names` (the candidate's `__global__`s)."""
    head = kernel_name.split("(")[0]
    return any(re.search(rf"\b{re.escape(name)}\b", head) for name in names)


def generated_kernel_names(kernel_names: Iterable[str], own_kernel_names: Iterable[str] = ()) -> list[str]:
    """The compiler-generated kernels among `kernel_names` (profiler names), leaving out the candidate's own."""
    own = list(own_kernel_names)
    return sorted({name for name in kernel_names
                   if GENERATED_KERNEL_PATTERN.search(name) and not kernel_is_named(name, own)})


def generated_kernels_reason(generated: list[str]) -> Reason:
    """The deceptive reason `generated_kernels_ran`, given what `generated_kernel_names` found."""
    return Reason("generated_kernels_ran", f"kernels a compiler generated from PyTorch code ran in ModelNew's forward "
                  f"({', '.join(n[:60] for n in generated[:3])}): torch.compile's work, not the candidate's CUDA",
                  "anti_gaming")


@dataclass
class Verdict:
    status: Status
    reasons: list[Reason] = field(default_factory=list)
    # Correctness at the worst trial. Both tolerances are recorded: 1e-2 (DICE, KernelBench v0.1) and 1e-4
    # (KernelBench's current fp32 policy). `status == CORRECT` uses VerifyConfig's policy.
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    correct_at_1e2: bool | None = None
    correct_at_1e4: bool | None = None
    trials_passed: int | None = None
    trials_run: int | None = None
    # ||out - ref|| / ||ref|| over the floating-point outputs, the worst trial (2-norm, float64).
    relative_error: float | None = None
    # On a degenerate task (flag `degenerate_task`): the test a null output fails (judge.compare.NullOutputCheck:
    # null_outputs, null_relative_error, relative_error, bound, floor, reference_sensitivity, conclusive, passed).
    null_output_check: dict[str, Any] | None = None
    reference_timing: TimingStats | None = None
    candidate_timing: TimingStats | None = None
    speedup: float | None = None  # over eager PyTorch, in the convention `speedup_convention` names
    # Both timing conventions, measured on the same interleaved calls (NOTES.md section 3):
    # gpu = L2 flush and call enqueued back to back, CUDA events measure GPU time (KernelBench, triton do_bench,
    #       ConCuR's speedup_over_eager); host = device synchronized after the flush, so each interval also holds
    #       the host's launch latency of forward (verifier 0.2's only convention).
    speedup_gpu: float | None = None
    speedup_host: float | None = None
    speedup_convention: str | None = None  # "gpu" | "host": which of the two `speedup` is
    peak_gpu_memory_mb: float | None = None  # the worker's peak allocated GPU memory (inputs, outputs, both models)
    # Optional faster baselines (VerifyConfig.extra_baselines): name -> {median_ms, speedup} or {error}.
    baseline_speedups: dict[str, Any] | None = None
    # Advisory observations that are not failures by themselves: overhead_dominated, degenerate_task, ...
    flags: list[str] = field(default_factory=list)
    compile_seconds: float | None = None
    build_cache_hit: bool | None = None
    custom_kernel_time_share: float | None = None  # share of GPU time spent in non-ATen kernels
    provenance: dict[str, Any] = field(default_factory=dict)  # gpu, driver, torch, cuda, verifier version, time

    @property
    def passed(self) -> bool:
        return self.status == Status.CORRECT

    def reason_codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        d = dict(d)
        d["status"] = Status(d["status"])
        d["reasons"] = [Reason(**r) for r in d.get("reasons") or []]
        for key in ("reference_timing", "candidate_timing"):
            if d.get(key) is not None:
                d[key] = TimingStats(**d[key])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        return cls.from_dict(json.loads(text))

    def summary(self) -> str:
        """One line for the CLI and logs."""
        parts = [self.status.value]
        if self.speedup is not None:
            parts.append(f"speedup={self.speedup:.2f}x")
        for name, result in (self.baseline_speedups or {}).items():
            speedup = result.get("speedup")
            parts.append(f"vs_{name}={speedup:.2f}x" if speedup is not None else f"vs_{name}=failed")
        if self.max_abs_diff is not None:
            parts.append(f"max_abs_diff={self.max_abs_diff:.2e}")
        if self.reasons:
            parts.append("reasons=" + ",".join(self.reason_codes()))
        if self.flags:
            parts.append("flags=" + ",".join(self.flags))
        return " ".join(parts)
