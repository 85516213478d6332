"""What the verifier is asked to judge (`VerifyJob`) and how (`VerifyConfig`).

Standard library only: both travel as JSON from the calling process (Dagster, CLI, RL trainer) to the isolated
GPU worker processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dice_pipeline import settings

# fp32 tolerances (atol == rtol): DICE and KernelBench v0.1 judge at 1e-2, KernelBench's current harness at 1e-4.
TOLERANCE_LOOSE = 1e-2
TOLERANCE_STRICT = 1e-4
TOLERANCE_POLICIES = ("v0.1", "current")
# See VerifyConfig.extra_baselines; the seconds each adds to a run worker's time limit (torch.compile builds kernels).
EXTRA_BASELINE_SECONDS = {"cuda_graph": 10.0, "compile": 120.0}
EXTRA_BASELINES = tuple(EXTRA_BASELINE_SECONDS)
SPEEDUP_CONVENTIONS = ("gpu", "host")
BASELINE_KERNEL_POLICIES = ("reject", "report")


def default_build_cache_dir() -> str:
    """DICE_VERIFY_CACHE, else kernel_builds in the project cache: one build cache for the pipeline, `dice verify`
    and the benchmarks alike."""
    from dice_pipeline.paths import cache_dir

    return settings.VERIFY_CACHE.get() or str(cache_dir() / "kernel_builds")


def default_device_lock_dir() -> str:
    from dice_pipeline.gpu_pool import default_lock_dir

    return default_lock_dir()


@dataclass(frozen=True)
class VerifyJob:
    """One candidate (`class ModelNew`) to judge against one KernelBench-format reference (`class Model`)."""

    job_id: str
    reference_src: str
    candidate_src: str


@dataclass
class VerifyConfig:
    """Knobs of one verification run, and the one source of their defaults (the KernelVerifier resource passes
    overrides through). Defaults follow KernelBench / DICE (NOTES.md section 3); fields left None are chosen for the
    host the batch runs on (inventory.choose_parallelism: lanes, cores, builds from the GPUs' memory and the cores)."""

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
    # Warm-up before the timed pairs (harness.warm_up): at least warmup_min_seconds, then until the pairs' device
    # time stops falling (clocks climb from idle over ~100s of ms), at most warmup_seconds. A GPU kept busy by the
    # other judging lanes is warm at the minimum; warmup_min_seconds >= warmup_seconds warms for exactly that long.
    warmup_seconds: float = 0.5
    warmup_min_seconds: float = 0.1
    compile_timeout_s: float = 900.0
    # The run stage's limit: this base (interpreter, imports, cached extension loads) plus what the task needs,
    # estimated in the worker from one input draw and one reference call before any candidate code runs (the
    # candidate may be up to slow_candidate_factor times slower than the reference per call), at most
    # max_run_timeout_s. A full-size KernelBench task is not killed by a limit sized for a small one.
    run_timeout_s: float = 300.0
    max_run_timeout_s: float = 1800.0
    slow_candidate_factor: float = 10.0
    # Fewest timed pairs when each pair is slow: timing stops at timing_budget_s once this many are in, even below
    # timing_samples (long kernels have little per-call noise; 100 pairs of a 1 s call would take minutes).
    timing_min_samples: int = 10
    # "v0.1": atol=rtol=1e-2 for every dtype (DICE's reward, KernelBench v0.1).
    # "current": 1e-4 for fp32 outputs, 1e-2 for fp16/bf16 (KernelBench main). Both verdicts are always recorded.
    tolerance_policy: str = "v0.1"
    seed: int = 42
    build_cache_dir: str = field(default_factory=default_build_cache_dir)
    # Builds side by side; None = a build a core the builds get, no more than the memory holds (3 GiB a build).
    max_parallel_builds: int | None = None
    devices: list[int] | None = None  # GPU indices to shard execution over; None = every GPU nvidia-smi lists
    memory_cap_mb: int | None = 16384  # host RSS cap per worker process group (see sandbox.py for why RSS)
    gpu_memory_fraction: float | None = 0.9  # caching-allocator cap per worker
    execute: bool | None = None  # None = execute where a GPU is present, else static + compile only
    # "fast": lighter CUDA headers (light, then trimmed: see light_cuda_headers), precompiled torch/extension.h,
    # local arch only (the source as written is the last resort). "default": load_inline's own flags (the
    # KernelBench baseline).
    build_profile: str = "fast"
    # Precompile torch/extension.h once per flag set for the C++ binding file (cached; first build pays ~1 min).
    use_precompiled_header: bool = True
    # "fast" builds first try a CUDA file with ATen's core and per-operator headers in place of torch/types.h
    # (build_cache.light_cuda_sources; about half the nvcc work) and a main.cpp with pybind11, torch's Tensor
    # casters and the same in place of torch/extension.h (light_binding_sources; a third of the g++ work where no
    # PCH is ready), then the trimmed, then the full sources.
    light_cuda_headers: bool = True
    # Up to this many candidates' extensions (same flags and #includes) are compiled as one library, each in its
    # own namespace, so the torch headers are compiled once per group (batched_build; "fast" profile only).
    # Members a failed group build names build alone. 1 = every candidate builds alone. (H100 host, 40 seed
    # candidates on 12 cores: 2.2x less build wall time with 8, the same statuses; benchmarks/RESULTS.md.) None = up
    # to 8, fewer where a batch has too few candidates to give every group build slot a share (at least 2).
    build_batch_size: int | None = None
    # Group builds compiling at once; 0 = the build cores / inventory.BUILD_JOBS (groups in waves, none oversubscribed).
    parallel_group_builds: int = 0
    # Where candidates are judged on a GPU: a candidate whose group built every extension it declares goes
    # straight to its run stage (no build worker of its own importing torch on the build cores; its extensions
    # load from the cache there). A run stage that meets an extension not in the cache hands the candidate back
    # to its build stage and is run again (scheduler.BatchRun.judge). False = every member runs its build stage.
    skip_grouped_member_builds: bool = True
    l2_flush_mb: int = 256  # H200 L2 is 60 MB: flush with at least 4x that
    # Which timing convention `Verdict.speedup` (and so the filter, the reward and fast_p) uses; both are always
    # measured. "gpu": flush and call enqueued back to back (KernelBench, triton do_bench, ConCuR's numbers);
    # "host": the device is synchronized after the flush, so the host's launch latency is inside every sample.
    speedup_convention: str = "gpu"
    # Inputs are drawn with the task's get_inputs() under a CUDA device context (a seeded generator on the GPU) when
    # one CPU draw takes longer than this, or when the inputs are larger than gpu_draw_bytes (seen through a
    # meta-device dry run): KernelBench's 4 GiB inputs take tens of seconds to draw on the host, and a judgement
    # draws about ten times (set-up, probe, correctness trials, profiler pass, timing set-up), each on the host a
    # CPU-bound wait while its lane holds the GPU (shared) and keeps the other lanes' timed sections waiting: a
    # 128 MB host draw took 0.3-0.5 s on a loaded 16-core host, the same draw on the GPU about a millisecond.
    slow_draw_seconds: float = 0.05
    gpu_draw_bytes: int = 32 * 2**20
    # Set by the verifier on its one retry after an out-of-memory error: one resident input set, a shorter
    # history for the stale-output check, and one poison block per output.
    low_memory: bool = False
    # Run-to-run consistency: the candidate's two outputs for the same inputs (before and after the reference ran)
    # must agree to the policy tolerance times this (with a floor of a few units of the output dtype's precision),
    # else `nondeterministic_output` (a race). Atomics-ordering differences are far below it.
    consistency_tolerance_ratio: float = 0.01
    # On a degenerate task (zeros or a constant pass the tolerance), an output's relative error ||out - ref|| / ||ref||
    # must be at most this share of the null output's, on every correctness trial and timed call, else
    # `no_better_than_null_output` (judge/compare.py NullOutputCheck; inconclusive where rounding alone could reach it).
    null_output_share: float = 0.1
    timing_input_sets: int = 3  # distinct input sets rotated (and re-permuted) across timed calls
    # Reference median below this many launch floors (an empty kernel timed the same way) => overhead_dominated.
    overhead_floor_multiple: float = 5.0
    # Share of GPU time in the candidate's own kernels below which the verdict carries `minor_custom_kernel_share`.
    minor_custom_share: float = 0.1
    # Policy for PyTorch compute ops on ModelNew's forward path next to custom kernels (KernelBench allows it):
    # False = allowed and flagged `torch_ops_on_forward_path`; True = judged deceptive. A forward path made of
    # PyTorch ops alone is always deceptive.
    forbid_torch_compute_on_forward: bool = False
    # A baseline kernel: the candidate's own kernels take less than baseline_kernel_share of its GPU time, and the
    # PyTorch/library kernels it runs besides them include every kind of kernel the reference runs (the reference's
    # work redone by PyTorch: `torch.matmul` plus a trivial copy kernel). A cuBLAS GEMM with a fused custom
    # epilogue is not one (the reference's bias/activation kernels are missing from its PyTorch work), whatever
    # its share. "reject": deceptive, `baseline_kernel` (the RL reward and CuKe); "report": the flag
    # `baseline_kernel` only (KernelBench-compatible evaluation, which allows it, counts it).
    baseline_kernel_policy: str = "reject"
    baseline_kernel_share: float = 0.5
    isolate_network: bool = True
    # Architecture for compile-only builds where no GPU is present to ask (9.0 = H100/H200, our GPU hosts).
    compile_arch: str = "9.0"
    # Where nothing will execute (no GPU, or execute=False): still build every candidate (the compile-only stage
    # that farms builds out ahead of the GPU stage). ~1-3 min a candidate on a 2-core machine; False = static only.
    build_without_gpu: bool = True
    # Start each GPU worker (interpreter, imports: ~2-4 s) while the previous candidate is still on the GPU; it
    # waits at a gate and runs no task code until its turn. Beside other lanes (gpu_lanes > 1) it also starts CUDA
    # meanwhile, in shared use of the GPU (worker.start_cuda_before_go); with one lane it touches no GPU before.
    prestart_gpu_workers: bool = True
    # Beside other lanes, a prestarted worker starts CUDA before its go (above); False = at its go, as with one lane.
    start_cuda_before_go: bool = True
    # Beside other lanes, a worker whose timed section is its last use of the GPU gives the GPU up after it (after
    # a device sync) instead of asking for shared use again: shared use waits behind every queued timed section,
    # so each lane of a wave used to wait for all of them before it could report and exit. False = ask again.
    release_gpu_after_timing: bool = True
    # CPU cores a GPU keeps free of builds for its workers: eager references are launch-bound, and CUDA events count
    # the gaps between launches, which widen when builds load every core (measured: up to ~25% on a speedup).
    # Applied on hosts with at least 4x as many cores; 0 = off; None = a core a lane (on a 16-core host with 8 lanes
    # none is kept: every core shared, the best measured configuration).
    gpu_worker_cpus: int | None = None
    # A VerdictStore directory (see store.py): executed verdicts are reused for identical jobs and configs, and new
    # ones are added. None = no store.
    verdict_store_dir: str | None = None
    # Packed, read-only verdict stores (store.pack_verdict_store) consulted after verdict_store_dir: the verdicts
    # the project ships for its own GPU-judged data. Empty = none.
    verdict_archives: tuple[str, ...] = ()
    # Older verifier versions whose stored verdicts may be used when this version has none (e.g. ("0.2.0",)):
    # never silently; such verdicts carry the flag `older_verifier_version` and name their version.
    accept_verdicts_from: tuple[str, ...] = ()
    # Faster baselines the reference is also timed as, after the eager comparison, for a correct candidate:
    # "cuda_graph" (the reference's forward captured in a CUDA graph: no launch overhead) and "compile"
    # (torch.compile, default mode). Recorded in `Verdict.baseline_speedups`; they never change the status, and the
    # speedup filter keeps using the eager speedup. Empty = none (the default: timing stays eager-only).
    extra_baselines: tuple[str, ...] = ()
    # Per-host GPU lock directory (dice_pipeline/gpu_pool.py, shared with the GpuPool resource): each run-stage
    # worker holds its device's lock while it runs, so concurrent batches (two Dagster runs, a benchmark, training)
    # never time on one GPU at once. Default DICE_GPU_LOCK_DIR or /tmp/dice_gpu_locks; None = no locks.
    device_lock_dir: str | None = field(default_factory=default_device_lock_dir)
    # Judging lanes per GPU: that many run-stage workers on one GPU at once. Their untimed GPU work (CUDA start-up,
    # input draws, correctness trials, the profiler pass, torch.compile's warm-up) runs side by side; every timed
    # section runs with the GPU to itself (gpu_pool.SharedGpu, gpu_share.py), and the seconds a worker waits for
    # the GPU are added to its time limit. Each lane gets gpu_memory_fraction (0.9 when unset) / gpu_lanes of the
    # GPU's memory; a run that runs out of memory in a lane is judged again with the GPU to itself. 1 = one
    # candidate on the GPU at a time; None = from the GPU's memory and the host's cores (inventory.default_lanes: 8
    # on the 16-core H100 and H200 hosts, the best measured).
    gpu_lanes: int | None = None

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
        if self.speedup_convention not in SPEEDUP_CONVENTIONS:
            raise ValueError(f"speedup_convention must be one of {SPEEDUP_CONVENTIONS}, got {self.speedup_convention!r}")
        if self.baseline_kernel_policy not in BASELINE_KERNEL_POLICIES:
            raise ValueError(f"baseline_kernel_policy must be one of {BASELINE_KERNEL_POLICIES}, "
                             f"got {self.baseline_kernel_policy!r}")
        if not 0 < self.null_output_share < 1:
            raise ValueError("null_output_share must be in (0, 1)")
        if self.gpu_lanes is not None and self.gpu_lanes < 1:
            raise ValueError("gpu_lanes must be >= 1 (None: chosen for the host)")
        if self.build_batch_size is not None and self.build_batch_size < 1:
            raise ValueError("build_batch_size must be >= 1 (1 builds every candidate alone)")
        if self.max_parallel_builds is not None and self.max_parallel_builds < 1:
            raise ValueError("max_parallel_builds must be >= 1 (None: chosen for the host)")
        if self.gpu_worker_cpus is not None and self.gpu_worker_cpus < 0:
            raise ValueError("gpu_worker_cpus must be >= 0 (0: none kept; None: a core a lane)")
        if self.parallel_group_builds < 0:
            raise ValueError("parallel_group_builds must be >= 0 (0: the build cores / inventory.BUILD_JOBS)")
        if self.warmup_seconds < 0 or self.warmup_min_seconds < 0:
            raise ValueError("warmup_seconds and warmup_min_seconds must be >= 0")
        if self.timing_min_samples < 1:
            raise ValueError("timing_min_samples must be >= 1")
        self.timing_min_samples = min(self.timing_min_samples, self.timing_samples)
        if self.max_run_timeout_s < self.run_timeout_s:
            raise ValueError("max_run_timeout_s must be >= run_timeout_s")
        unknown = set(self.extra_baselines) - set(EXTRA_BASELINES)
        if unknown:
            raise ValueError(f"extra_baselines must be among {EXTRA_BASELINES}, got {sorted(unknown)}")
        self.extra_baselines = tuple(dict.fromkeys(self.extra_baselines))
        self.verdict_archives = tuple(str(path) for path in self.verdict_archives)
        self.accept_verdicts_from = tuple(self.accept_verdicts_from)

    def tolerance_for(self, dtype_name: str) -> float:
        """The atol=rtol that decides `status` for an output of this dtype ('float32', 'float16', ...)."""
        if self.tolerance_policy == "current" and dtype_name in ("float32", "float64"):
            return TOLERANCE_STRICT
        return TOLERANCE_LOOSE

    def stage_time_limit(self, stage: str) -> float:
        """Seconds a worker stage may take before the task's own estimate arrives: the build limit, or the run
        limit plus the extra baselines' time."""
        if stage in ("build", "pch", "group_build"):
            return self.compile_timeout_s
        return self.run_timeout_s + sum(EXTRA_BASELINE_SECONDS[name] for name in self.extra_baselines)

    def run_time_limit(self, draw_s: float, reference_call_s: float) -> float:
        """The run stage's limit for a task whose input draw takes `draw_s` and whose reference call takes
        `reference_call_s` (measured in the worker before candidate code runs): every call the judgement makes,
        with the candidate allowed slow_candidate_factor times the reference's time per call, twice over, on top
        of the base limit; at most max_run_timeout_s."""
        trials = self.correctness_trials
        pairs = self.timing_samples  # an upper bound where calls are slow: timing stops at its budget then
        reference_calls = 2 + 2 * trials + 1 + 3 + 2 * pairs + 3 * len(self.extra_baselines) * pairs
        candidate_calls = 2 * trials + 2 + 3 + 2 * pairs
        draws = 2 + trials + 1 + self.timing_input_sets + pairs + 3
        needed = (draws * draw_s + reference_calls * reference_call_s
                  + candidate_calls * reference_call_s * self.slow_candidate_factor
                  + 4 * self.timing_budget_s)  # both conventions' timing loops, and their rounds
        return min(self.stage_time_limit("run") + 2 * needed, self.max_run_timeout_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})
