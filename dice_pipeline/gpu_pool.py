"""Which GPU a worker may use, across threads, processes and concurrent Dagster runs on one host, and how many
builds the host's cores and memory can feed the GPUs with.

One lock file per device index under a shared directory, held with `fcntl.flock`: two holders of the same index
never overlap, whatever process they are in, and the kernel drops the lock when its holder dies, so a killed run
never leaves a GPU locked. Standard library only (it runs on GPU hosts too).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dice_pipeline import settings

# Peak resident memory of one candidate build (nvcc + cicc + the host compiler on torch/extension.h). Not measured
# on our hosts yet (benchmarks/compile_throughput.py records it as `peak_rss_mb`); 3 GiB is the usual figure for a
# torch extension translation unit and leaves room for ninja running main.cpp beside the CUDA file.
BUILD_MEMORY_MB = 3072


def default_lock_dir() -> str:
    """Per-host lock directory every run on this host shares (DICE_GPU_LOCK_DIR overrides). Keep it on a local
    filesystem: flock over NFS is not reliable, and the locks are per host anyway."""
    return settings.GPU_LOCK_DIR.get() or "/tmp/dice_gpu_locks"


def _lock_path(lock_dir: str | os.PathLike, device: int) -> Path:
    directory = Path(lock_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"gpu{int(device)}.lock"


def _try_lock(lock_dir: str | os.PathLike, device: int) -> int | None:
    """An open, exclusively locked descriptor for `device`, or None if someone else holds it."""
    fd = os.open(_lock_path(lock_dir, device), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    # Who holds it, for a person looking at the directory; the lock itself is the flock, not this text.
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
    return fd


@contextlib.contextmanager
def device_lock(lock_dir: str | os.PathLike | None, device: int, timeout_s: float | None = None,
                poll_s: float = 0.05) -> Iterator[None]:
    """Hold GPU `device` exclusively on this host for the body (waits while another holder has it). `lock_dir`
    None = no locking (the body runs at once). TimeoutError after `timeout_s` seconds of waiting."""
    if lock_dir is None:
        yield
        return
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (fd := _try_lock(lock_dir, device)) is None:
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"GPU {device} stayed locked by another worker for {timeout_s:g} s ({lock_dir})")
        time.sleep(poll_s)
    try:
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


@dataclass(frozen=True)
class GpuLease:
    """GPUs held by one worker; `env()` is what its process needs to see only them."""

    devices: tuple[int, ...]

    def env(self) -> dict[str, str]:
        # nvidia-smi numbers GPUs in PCI order; CUDA must use the same order so an index means the same GPU.
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in self.devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass
class DevicePool:
    """The GPUs of one host, handed out whole: each lease gets devices no other lease (in any process sharing
    `lock_dir`) holds at the same time."""

    devices: list[int]
    lock_dir: str = ""

    def __post_init__(self) -> None:
        self.lock_dir = self.lock_dir or default_lock_dir()

    @contextlib.contextmanager
    def lease(self, count: int = 1, timeout_s: float | None = None, poll_s: float = 0.05) -> Iterator[GpuLease]:
        """Hold `count` free devices for the body. Takes all of them or none (never holds some while waiting for
        the rest, so two leases cannot deadlock); waits while too few are free."""
        if not 1 <= count <= len(self.devices):
            raise ValueError(f"asked for {count} GPUs from a pool of {len(self.devices)} ({self.devices})")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            held: dict[int, int] = {}
            for device in self.devices:
                fd = _try_lock(self.lock_dir, device)
                if fd is not None:
                    held[device] = fd
                    if len(held) == count:
                        break
            if len(held) == count:
                break
            for fd in held.values():
                os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{count} of GPUs {self.devices} not free within {timeout_s:g} s")
            time.sleep(poll_s)
        try:
            yield GpuLease(tuple(held))
        finally:
            for fd in held.values():
                os.close(fd)


def available_memory_mb() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def compile_workers(cpu_cores: int | None = None, memory_mb: int | None = None, reserved_cores: int = 0,
                    build_memory_mb: int = BUILD_MEMORY_MB) -> int:
    """Builds to run side by side: one per core left after `reserved_cores` (the GPU workers' cores), and no more
    than the available memory holds at `build_memory_mb` each. At least 1."""
    cores = len(os.sched_getaffinity(0)) if cpu_cores is None else cpu_cores
    memory = available_memory_mb() if memory_mb is None else memory_mb
    by_cores = cores - reserved_cores if cores - reserved_cores >= 1 else cores
    by_memory = by_cores if memory is None else memory // max(1, build_memory_mb)
    return max(1, min(by_cores, by_memory))


class SharedGpu:
    """One GPU shared by several judging lanes of this process: untimed GPU work runs side by side (shared mode),
    a timed section runs alone (exclusive mode). Writers first: once a lane asks for exclusive use, no new shared
    holder gets in until it has had its turn, so a timed section waits only for the untimed work already running
    (never for an unending stream of it), and exclusive requests are served in the order they came.

    Whole mode is exclusive use of the GPU *and its memory*, for a judgement too big for its lane's share: a lane
    holding the gate alone still shares the memory with every lane whose worker is alive, even one that is only
    waiting for its own timed section. So the lanes' workers are tracked as residents (`holder`, from a worker's
    first grant until `leave`), and a whole request is granted only when every other resident is itself waiting
    for whole use (a worker frees its task memory before it asks, worker.py): the residents in mid-task finish
    their task first, and no new worker starts meanwhile. Whole requests are served in the order they came.

    Across processes the group behaves as one holder of the device's lock file (`device_lock`): the first lane
    to hold anything takes it, the last to let go releases it, so another run on this host never times on the
    GPU while our lanes use it. `lock_dir` None = no lock file."""

    SHARED, EXCLUSIVE, WHOLE = "shared", "exclusive", "whole"
    MODES = (SHARED, EXCLUSIVE, WHOLE)

    def __init__(self, device: int, lock_dir: str | os.PathLike | None = None, poll_s: float = 0.05):
        self.device = device
        self.lock_dir = lock_dir
        self.poll_s = poll_s
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False  # an exclusive or a whole holder
        self._queue: list[object] = []  # exclusive requests waiting, oldest first
        self._whole_queue: list[tuple[object, object]] = []  # (ticket, holder) of whole requests, oldest first
        self._residents: set[object] = set()  # holders whose worker may hold GPU memory
        self._fd: int | None = None
        self.exclusive_grants = 0
        self.whole_grants = 0

    def _take_device(self) -> None:
        # Called with the condition held and nothing held by this group: waits for other processes' holders.
        if self.lock_dir is None or self._fd is not None:
            return
        while (fd := _try_lock(self.lock_dir, self.device)) is None:
            time.sleep(self.poll_s)
        self._fd = fd

    def _drop_device_if_idle(self) -> None:
        if self._fd is not None and self._readers == 0 and not self._writer:
            os.close(self._fd)
            self._fd = None

    def _admitted(self, holder: object) -> bool:
        """A holder new to the GPU (its worker holds no memory yet) waits while a whole request is queued."""
        return holder is None or holder in self._residents or not self._whole_queue

    def _whole_ready(self, entry: tuple[object, object]) -> bool:
        waiting = {h for _, h in self._whole_queue}
        return (self._whole_queue[0] is entry and not self._writer and self._readers == 0
                and self._residents <= waiting)

    def _take_in_turn(self, queue: list, entry: object, ready: Callable[[], bool]) -> None:
        # Called with the condition held: wait in `queue` until `ready`, then hold the GPU alone.
        queue.append(entry)
        self._cond.notify_all()  # a resident now waiting for whole use may be what an earlier one waits for
        try:
            self._cond.wait_for(ready)
        finally:
            queue.remove(entry)
            self._cond.notify_all()  # the next in line may be ready now
        self._take_device()
        self._writer = True

    def acquire(self, mode: str, holder: object = None) -> float:
        """Wait for `mode` (SHARED, EXCLUSIVE or WHOLE); returns the seconds waited. `holder`: the worker asking
        (one identity per worker process; None = untracked, e.g. a caller with no worker)."""
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        started = time.monotonic()
        with self._cond:
            if mode == self.SHARED:
                self._cond.wait_for(lambda: not self._writer and not self._queue and self._admitted(holder))
                self._take_device()
                self._readers += 1
            elif mode == self.EXCLUSIVE:
                ticket = object()
                self._take_in_turn(self._queue, ticket, lambda: self._queue[0] is ticket and not self._writer
                                   and self._readers == 0 and self._admitted(holder))
                self.exclusive_grants += 1
            else:
                entry = (object(), holder)
                self._take_in_turn(self._whole_queue, entry, lambda: self._whole_ready(entry))
                self.whole_grants += 1
            if holder is not None:
                self._residents.add(holder)
        return time.monotonic() - started

    def release(self, mode: str) -> None:
        with self._cond:
            if mode == self.SHARED:
                if self._readers <= 0:
                    raise RuntimeError("release of a shared hold nobody has")
                self._readers -= 1
            elif mode in (self.EXCLUSIVE, self.WHOLE):
                if not self._writer:
                    raise RuntimeError(f"release of a {mode} hold nobody has")
                self._writer = False
            else:
                raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
            self._drop_device_if_idle()
            self._cond.notify_all()

    def leave(self, holder: object) -> None:
        """`holder`'s worker has ended: it holds no GPU memory any more (idempotent)."""
        with self._cond:
            self._residents.discard(holder)
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self, mode: str, holder: object = None) -> Iterator[float]:
        waited = self.acquire(mode, holder)
        try:
            yield waited
        finally:
            self.release(mode)

    def state(self) -> dict[str, int | bool]:
        with self._cond:
            return {"shared": self._readers, "exclusive": self._writer, "waiting_exclusive": len(self._queue),
                    "waiting_whole": len(self._whole_queue), "residents": len(self._residents)}
