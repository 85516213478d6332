"""What this host gives the verifier, and the parallelism chosen from it: its GPUs (with their memory, from
nvidia-smi), its cores and memory, the CUDA compiler; judging lanes a GPU, cores kept for the GPU workers, builds
side by side and build groups (`choose_parallelism`, applied where the config leaves them unset). Standard library
only: it runs in the calling process, which never imports torch.

The numbers are the measured best (benchmarks/RESULTS.md, 2026-12-06): on 16-core H100 and H200 hosts 8 lanes with
every core shared by workers and builds judged 67 candidates fastest (137.6 s on the H200, 4.89x the parallel
KernelBench-style baseline of that machine; 139.1 s on the H100), ahead of 6 lanes (146.4 s, 4.60x) and 4 lanes on 4
cores of their own (152.2 s, 4.42x); more than 8 lanes were never measured.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from dice_pipeline.gpu_pool import available_memory_mb, compile_workers
from dice_pipeline.verify.config import VerifyConfig

# Compiler processes one build worker runs at once (ninja's MAX_JOBS: a candidate's C++ and CUDA files side by side).
BUILD_JOBS = 2
# Judging lanes a GPU gets at most: the most measured, and the best measured (see above).
MAX_LANES = 8
# GPU memory a lane needs: a lane gets 0.9 / lanes of the GPU's memory, and a task that will not fit its share takes
# the GPU whole (worker.needs_whole_gpu); 8 GiB a lane is where the measured 8-lane runs were (9 GiB a lane on an 80
# GB H100). A smaller GPU gets fewer lanes rather than more whole-GPU waits.
LANE_MEMORY_MB = 8 * 1024
# Host cores a GPU's lane needs: the measured 16-core hosts ran 8 lanes a GPU best, two cores a lane.
CORES_PER_LANE = 2
# Extensions built as one library at most: 8 measured 2.2x less build wall time than building alone (40 candidates,
# 12 cores, H100 host; benchmarks/RESULTS.md).
MAX_BUILD_BATCH = 8


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    driver: str
    compute_capability: str
    memory_mb: int | None = None  # total memory, as nvidia-smi reports it (MiB); None where unknown


def _visible_indices() -> set[int] | None:
    """GPU indices this process was given through CUDA_VISIBLE_DEVICES (e.g. by a Dagster GPU pool); None = all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None  # GPU UUIDs: nvidia-smi indices cannot be matched to them here, so do not filter
    return {int(p) for p in parts}


def gpu_inventory() -> list[GpuInfo]:
    """GPUs as nvidia-smi reports them (no torch in this process), limited to CUDA_VISIBLE_DEVICES when it lists
    indices; empty where there is no driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        memory = parts[4] if len(parts) > 4 else ""
        gpus.append(GpuInfo(int(parts[0]), parts[1], parts[2], parts[3],
                            int(float(memory)) if memory.replace(".", "", 1).isdigit() else None))
    visible = _visible_indices()
    return [g for g in gpus if visible is None or g.index in visible]


def host_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def split_cpus(reserved: int, cores: list[int] | None = None) -> tuple[set[int] | None, set[int] | None]:
    """(cores for the GPU workers, cores for builds) out of `cores` (this process's), or (None, None) where there
    are fewer than 4x `reserved` of them: then workers and builds share every core."""
    allowed = sorted(host_cores() if cores is None else cores)
    if reserved <= 0 or len(allowed) < 4 * reserved:
        return None, None
    return set(allowed[-reserved:]), set(allowed[:-reserved])


def nvcc_available() -> bool:
    """Whether the CUDA compiler is where torch's extension builder looks for it: under $CUDA_HOME or $CUDA_PATH
    when set, else on PATH, else in /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return (Path(home) / "bin" / "nvcc").is_file()
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").is_file()


def default_lanes(gpus: list[GpuInfo], cores: int) -> int:
    """Judging lanes a GPU: MAX_LANES, fewer where the GPU's memory holds fewer lanes of LANE_MEMORY_MB or the
    host's cores give fewer than CORES_PER_LANE a lane across its GPUs. 1 without a GPU."""
    if not gpus:
        return 1
    by_cores = cores // (CORES_PER_LANE * len(gpus))
    known = [g.memory_mb for g in gpus if g.memory_mb]
    by_memory = min(known) // LANE_MEMORY_MB if known else MAX_LANES
    return max(1, min(MAX_LANES, by_cores, by_memory))


def choose_parallelism(config: VerifyConfig, gpus: list[GpuInfo], execute: bool, *, cores: list[int] | None = None,
                       memory_mb: int | None = None) -> VerifyConfig:
    """`config` with what it leaves unset (None) chosen for this host: `gpu_lanes` (default_lanes), `gpu_worker_cpus`
    (a core a lane, kept from builds only where the host has 4x as many: split_cpus), `max_parallel_builds` (a build
    a core the builds get, as many as the memory holds: gpu_pool.compile_workers). Set values are kept as given.
    `cores` and `memory_mb` default to this host's (tests pass fake ones)."""
    cores = host_cores() if cores is None else cores
    lanes = config.gpu_lanes or default_lanes(gpus if execute else [], len(cores))
    worker_cpus = lanes if config.gpu_worker_cpus is None else config.gpu_worker_cpus
    builds = config.max_parallel_builds
    if builds is None:
        _, build_cpus = split_cpus(worker_cpus * len(gpus), cores) if execute else (None, None)
        builds = compile_workers(cpu_cores=len(build_cpus or cores),
                                 memory_mb=available_memory_mb() if memory_mb is None else memory_mb)
    return replace(config, gpu_lanes=lanes, gpu_worker_cpus=worker_cpus, max_parallel_builds=builds)


def build_batch_size(config: VerifyConfig, candidates: int, slots: int) -> int:
    """Extensions a build group holds: config.build_batch_size, else enough to give each of the `slots` group builds
    that run at once a share of the `candidates` (no slot idle while another compiles a large group), at least 2
    (identical extensions are planned once only within a group: batched_build) and at most MAX_BUILD_BATCH."""
    if config.build_batch_size is not None:
        return config.build_batch_size
    return max(2, min(MAX_BUILD_BATCH, math.ceil(candidates / max(1, slots))))
