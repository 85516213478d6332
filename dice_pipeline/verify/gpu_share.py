"""How a run-stage worker shares its GPU with the other judging lanes (VerifyConfig.gpu_lanes > 1).

The parent holds the GPU on the worker's behalf (`dice_pipeline.gpu_pool.SharedGpu`): the worker asks over a pipe
and waits for the grant. Shared mode covers every untimed use of the GPU (CUDA start-up, input draws, correctness
trials, the profiler pass, torch.compile's warm-up); exclusive mode covers the timed sections, so a timing never
overlaps another lane's GPU work (a worker whose last GPU use is its timed section gives the GPU up after it rather
than queue for shared use behind the other lanes' timed sections); whole mode gives a judgement too big for its
lane's memory share the GPU and its memory (SharedGpu's docstring). Keeping the lock in the parent, not in a file the worker could open, means a
candidate cannot take the GPU from the other lanes for longer than its own time limit (the parent releases what a
dead worker held), and the time a worker spends waiting for the GPU is added to its limit, so no candidate is
timed out for another's work.

A worker started ahead of its turn (VerifyConfig.prestart_gpu_workers) may start CUDA before its go
(`GpuShareClient.starting_cuda`): shared use like any untimed work, so never inside another lane's timed section,
but untracked, since the worker holds no task memory yet and must not hold up a lane that waits for the whole GPU
(that lane waits for every resident, and this worker's go may wait for that lane's turn).

Wire format, one byte each: the worker writes b"S" (shared), b"I" (shared, untracked: CUDA start-up before the go),
b"X" (exclusive), b"W" (whole) or b"R" (release); the parent answers b"G" once the mode asked for is held (a
request replaces what the worker held). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

from dice_pipeline import settings
from dice_pipeline.gpu_pool import SharedGpu

ENV_VAR = settings.GPU_SHARE_FDS.name
_MODES = {b"S": SharedGpu.SHARED, b"X": SharedGpu.EXCLUSIVE, b"W": SharedGpu.WHOLE}
_BYTES = {mode: byte for byte, mode in _MODES.items()}
_STARTING_CUDA = b"I"  # shared use without becoming a resident (module docstring)


class GpuShareServer:
    """The parent's end for one worker: serves its requests against `gpu` on a thread, counts the seconds it
    waited, and releases what it held when the worker's end closes (exit, crash or kill)."""

    def __init__(self, gpu: SharedGpu):
        self.gpu = gpu
        self._request_r, self._request_w = os.pipe()
        self._grant_r, self._grant_w = os.pipe()
        self._held: str | None = None
        self._lock = threading.Lock()
        self.waited_s = 0.0  # finished waits
        self._waiting_since: float | None = None
        self.requests = 0
        self._thread: threading.Thread | None = None

    def seconds_waited(self) -> float:
        """Seconds the worker has waited for the GPU so far, a wait still going on included."""
        with self._lock:
            ongoing = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
            return self.waited_s + ongoing

    def child_fds(self) -> tuple[int, int]:
        return self._request_w, self._grant_r

    def env(self) -> dict[str, str]:
        return {ENV_VAR: f"{self._request_w},{self._grant_r}"}

    def start(self) -> None:
        """After the worker process exists: drop the parent's copies of the worker's ends and start serving."""
        for fd in self.child_fds():
            os.close(fd)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _release_held(self) -> None:
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            self.gpu.release(held)

    def _serve(self) -> None:
        try:
            while byte := os.read(self._request_r, 1):
                if byte == b"R":
                    self._release_held()
                    continue
                mode = SharedGpu.SHARED if byte == _STARTING_CUDA else _MODES.get(byte)
                if mode is None:
                    continue  # garbage on the pipe changes nothing
                self.requests += 1
                self._release_held()
                with self._lock:
                    self._waiting_since = time.monotonic()
                waited = self.gpu.acquire(mode, holder=None if byte == _STARTING_CUDA else self)
                with self._lock:
                    self._held = mode
                    self._waiting_since = None
                    self.waited_s += waited
                try:
                    os.write(self._grant_w, b"G")
                except OSError:
                    break  # the worker is gone
        except OSError:
            pass
        finally:
            self._release_held()
            # Not gpu.leave() yet: the pipe closes as the worker exits, before its process group is reaped and the
            # driver has freed its memory; close() says it left.

    def close(self) -> None:
        """After the worker's whole process group is dead: its ends are closed, so the serving thread sees EOF."""
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._release_held()
        self.gpu.leave(self)  # its whole process group is gone: it holds no GPU memory
        for fd in (self._request_r, self._grant_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class GpuShareClient:
    """The worker's end. Without the parent's descriptors (one lane a GPU, or the CPU tests) every call returns at
    once: the worker already has the GPU to itself. `before_release` (e.g. torch.cuda.synchronize) runs before
    the worker gives up a mode, so its queued kernels finish inside the hold they belong to."""

    def __init__(self, fds: tuple[int, int] | None, before_release: Callable[[], None] = lambda: None):
        self._fds = fds
        self._before_release = before_release
        self.mode: str | None = None
        self.waits: list[float] = []
        self.wait_before_go_s: float | None = None

    @classmethod
    def from_env(cls, before_release: Callable[[], None] = lambda: None) -> GpuShareClient:
        raw = settings.GPU_SHARE_FDS.take()  # taken: candidate code never sees where the pipes are named
        fds = tuple(int(x) for x in raw.split(",")) if raw else None
        return cls(fds if fds and len(fds) == 2 else None, before_release)  # type: ignore[arg-type]

    @property
    def active(self) -> bool:
        return self._fds is not None

    def _ask(self, mode: str) -> None:
        if self.mode is not None:
            self._finish_held_work()
        if self._fds is not None:
            self.waits.append(self._request(_BYTES[mode]))
        self.mode = mode

    def _request(self, byte: bytes) -> float:
        """Ask the parent (a parent there is) for what `byte` names and wait for the grant; the seconds waited."""
        assert self._fds is not None
        request_w, grant_r = self._fds
        started = time.monotonic()
        os.write(request_w, byte)
        os.read(grant_r, 1)  # b"G"; EOF if the parent is gone, and then nobody else is on the GPU either
        return time.monotonic() - started

    @contextlib.contextmanager
    def starting_cuda(self) -> Iterator[None]:
        """Shared use of the GPU for the body, untracked (CUDA start-up before the worker's go: no task memory),
        released after it with `before_release`. A no-op without a parent."""
        if self._fds is None:
            yield
            return
        # not the judgement's wait: kept apart from `waits`
        self.wait_before_go_s = round(self._request(_STARTING_CUDA), 4)
        try:
            yield
        finally:
            self._give_up()

    def start(self, mode: str = SharedGpu.SHARED) -> None:
        """Hold `mode` for the worker's GPU work from now on (SHARED or EXCLUSIVE before CUDA is initialised; WHOLE
        at any time, but only with no task memory held: the grant waits for the other lanes' workers to finish)."""
        self._ask(mode)

    @contextlib.contextmanager
    def exclusive(self, *, then_release: bool = False) -> Iterator[None]:
        """The GPU to this worker alone for the body (a timed section), shared again after; with `then_release`
        (the worker's last use of the GPU) nothing after it: shared use would wait behind every timed section
        queued meanwhile. A no-op when the worker holds it exclusively (or whole) already."""
        if self.mode in (SharedGpu.EXCLUSIVE, SharedGpu.WHOLE):
            yield
            return
        previous = self.mode
        self._ask(SharedGpu.EXCLUSIVE)
        try:
            yield
        finally:
            if then_release:
                self.release()
            else:
                self._ask(previous or SharedGpu.SHARED)

    def release(self) -> None:
        """Give up what the worker holds (after `before_release`: its queued kernels finish inside the hold), asking
        for nothing: the worker will not touch the GPU again. A no-op without a hold."""
        if self.mode is not None:
            self._give_up()

    def _finish_held_work(self) -> None:
        """`before_release`, so the worker's queued kernels finish inside the hold they belong to."""
        with contextlib.suppress(Exception):  # a poisoned CUDA context: the error that poisoned it is reported
            self._before_release()

    def _give_up(self) -> None:
        self._finish_held_work()
        if self._fds is not None:
            os.write(self._fds[0], b"R")
        self.mode = None

    def summary(self) -> dict[str, float | int | bool]:
        summary: dict[str, float | int | bool] = {"lanes_shared": self.active, "gate_requests": len(self.waits),
                                                  "gate_wait_s": round(sum(self.waits), 4)}
        if self.wait_before_go_s is not None:
            summary["cuda_start_wait_before_go_s"] = self.wait_before_go_s
        return summary
