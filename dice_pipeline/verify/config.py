"""What the verifier is asked to judge (`VerifyJob`) and how (`VerifyConfig`).

Standard library only: both travel as JSON from the calling process (Dagster, CLI, RL trainer) to the isolated
GPU worker processes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# fp32 tolerances (atol == rtol): DICE and KernelBench v0.1 judge at 1e-2, KernelBench's current harness at 1e-4.
TOLERANCE_LOOSE = 1e-2
TOLERANCE_STRICT = 1e-4
TOLERANCE_POLICIES = ("v0.1", "current")
# See VerifyConfig.extra_baselines; the seconds each adds to a run worker's time limit (torch.compile builds kernels).
EXTRA_BASELINE_SECONDS = {"cuda_graph": 10.0, "compile": 120.0}
EXTRA_BASELINES = tuple(EXTRA_BASELINE_SECONDS)


def default_build_cache_dir() -> str:
    return os.environ.get("DICE_VERIFY_CACHE") or str(Path.home() / ".cache" / "dice_pipeline" / "verify_builds")


@dataclass(frozen=True)
class VerifyJob:
    """One candidate (`class ModelNew`) to judge against one KernelBench-format reference (`class Model`)."""

    job_id: str
    reference_src: str
    candidate_src: str


@dataclass
class VerifyConfig:
    """Knobs of one verification run. Defaults follow KernelBench / DICE (NOTES.md section 3)."""

    correctness_trials: int = 5
    timing_samples: int = 100  # timed calls per model at least, interleaved reference/candidate
    # More samples (whole rounds) are taken until the median paired speedup is known to within this relative
    # half-width (a distribution-free 95% interval), up to timing_max_samples or timing_budget_s of timed calls.
    timing_target_precision: float = 0.01
    timing_max_samples: int = 1000
    timing_budget_s: float = 5.0
    # Input buffers are re-allocated every this many samples: the speedup is a median over several memory
    # placements, not one (one placement can shift a memory-bound kernel's time by a few percent).
    timing_round_samples: int = 50
    warmup_seconds: float = 0.5  # warm-up by time: clocks climb from idle over ~100s of ms
    compile_timeout_s: float = 900.0
    run_timeout_s: float = 300.0
    # "v0.1": atol=rtol=1e-2 for every dtype (DICE's reward, KernelBench v0.1).
    # "current": 1e-4 for fp32 outputs, 1e-2 for fp16/bf16 (KernelBench main). Both verdicts are always recorded.
    tolerance_policy: str = "v0.1"
    seed: int = 42
    build_cache_dir: str = field(default_factory=default_build_cache_dir)
    max_parallel_builds: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    devices: list[int] | None = None  # GPU indices to shard execution over; None = every GPU nvidia-smi lists
    memory_cap_mb: int | None = 16384  # host RSS cap per worker process group (see sandbox.py for why RSS)
    gpu_memory_fraction: float | None = 0.9  # caching-allocator cap per worker
    execute: bool | None = None  # None = execute where a GPU is present, else static + compile only
    # "fast": trimmed CUDA headers, precompiled torch/extension.h, local arch only (falls back to the full
    # source if the trimmed one does not build). "default": load_inline's own flags (the KernelBench baseline).
    build_profile: str = "fast"
    # Precompile torch/extension.h once per flag set for the C++ binding file (cached; first build pays ~1 min).
    use_precompiled_header: bool = True
    l2_flush_mb: int = 256  # H200 L2 is 60 MB: flush with at least 4x that
    timing_input_sets: int = 3  # distinct input sets rotated (and re-permuted) across timed calls
    # Reference median below this many launch floors (an empty kernel timed the same way) => overhead_dominated.
    overhead_floor_multiple: float = 5.0
    # Share of GPU time in the candidate's own kernels below which the verdict carries `minor_custom_kernel_share`.
    minor_custom_share: float = 0.1
    # Policy for PyTorch compute ops on ModelNew's forward path next to custom kernels (KernelBench allows it):
    # False = allowed and flagged `torch_ops_on_forward_path`; True = judged deceptive. A forward path made of
    # PyTorch ops alone is always deceptive.
    forbid_torch_compute_on_forward: bool = False
    isolate_network: bool = True
    # Architecture for compile-only builds where no GPU is present to ask (9.0 = H100/H200, our GPU hosts).
    compile_arch: str = "9.0"
    # Where nothing will execute (no GPU, or execute=False): still build every candidate (the compile-only stage
    # that farms builds out ahead of the GPU stage). ~1-3 min a candidate on a 2-core machine; False = static only.
    build_without_gpu: bool = True
    # Start each GPU worker (interpreter, imports: ~2-4 s) while the previous candidate is still on the GPU; it
    # waits at a gate, runs no task code and touches no GPU until its turn.
    prestart_gpu_workers: bool = True
    # CPU cores kept free of builds for the GPU workers: eager references are launch-bound, and CUDA events count
    # the gaps between launches, which widen when builds load every core (measured: up to ~25% on a speedup).
    # Applied on hosts with at least 4x as many cores; 0 = off.
    gpu_worker_cpus: int = 2
    # A VerdictStore directory (see store.py): executed verdicts are reused for identical jobs and configs, and new
    # ones are added. None = no store.
    verdict_store_dir: str | None = None
    # Faster baselines the reference is also timed as, after the eager comparison, for a correct candidate:
    # "cuda_graph" (the reference's forward captured in a CUDA graph: no launch overhead) and "compile"
    # (torch.compile, default mode). Recorded in `Verdict.baseline_speedups`; they never change the status, and the
    # speedup filter keeps using the eager speedup. Empty = none (the default: timing stays eager-only).
    extra_baselines: tuple[str, ...] = ()
    # Per-host GPU lock directory (dice_pipeline/gpu_pool.py): each run-stage worker holds its device's lock while
    # it runs, so concurrent batches (two Dagster runs, a benchmark) never time on one GPU at once. None = no locks.
    device_lock_dir: str | None = None

    def __post_init__(self) -> None:
        if self.tolerance_policy not in TOLERANCE_POLICIES:
            raise ValueError(f"tolerance_policy must be one of {TOLERANCE_POLICIES}, got {self.tolerance_policy!r}")
        if self.build_profile not in ("fast", "default"):
            raise ValueError(f"build_profile must be 'fast' or 'default', got {self.build_profile!r}")
        if self.correctness_trials < 1:
            raise ValueError("correctness_trials must be >= 1")
        if self.timing_samples < 1:
            raise ValueError("timing_samples must be >= 1")
        if self.timing_max_samples < self.timing_samples:
            raise ValueError("timing_max_samples must be >= timing_samples")
        if self.timing_round_samples < 1:
            raise ValueError("timing_round_samples must be >= 1")
        if self.timing_input_sets < 1:
            raise ValueError("timing_input_sets must be >= 1")
        unknown = set(self.extra_baselines) - set(EXTRA_BASELINES)
        if unknown:
            raise ValueError(f"extra_baselines must be among {EXTRA_BASELINES}, got {sorted(unknown)}")
        self.extra_baselines = tuple(dict.fromkeys(self.extra_baselines))

    def tolerance_for(self, dtype_name: str) -> float:
        """The atol=rtol that decides `status` for an output of this dtype ('float32', 'float16', ...)."""
        if self.tolerance_policy == "current" and dtype_name in ("float32", "float64"):
            return TOLERANCE_STRICT
        return TOLERANCE_LOOSE

    def stage_time_limit(self, stage: str) -> float:
        """Seconds a worker stage may take: the build limit, or the run limit plus the extra baselines' time."""
        if stage == "build":
            return self.compile_timeout_s
        return self.run_timeout_s + sum(EXTRA_BASELINE_SECONDS[name] for name in self.extra_baselines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
