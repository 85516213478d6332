"""Run one untrusted worker process: own process group (killed whole on timeout), scrubbed environment, scratch
working directory, host-memory cap, and no network where the OS lets us unshare it. Standard library only.

Memory cap: RLIMIT_AS breaks CUDA (the driver reserves tens of GB of virtual address space up front, so any useful
limit fails `cuInit`), and RLIMIT_RSS is not enforced by Linux. So the parent polls the resident set of every
process in the worker's group (nvcc, cc1plus and ninja included) and kills the group past the cap.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dice_pipeline import settings
from dice_pipeline.gpu_pool import SharedGpu
from dice_pipeline.verify.gpu_share import GpuShareServer

# Only these variables reach a worker; everything else (tokens, keys, cloud credentials) stays behind.
ENV_ALLOWLIST = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "LD_LIBRARY_PATH",
    "CC", "CXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CCACHE_DIR", "CCACHE_BASEDIR",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PYTHONHASHSEED",
)
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE")
POLL_SECONDS = 0.2
OUTPUT_TAIL_CHARS = 6000


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    memory_exceeded: bool
    wall_seconds: float
    peak_rss_mb: float
    output_tail: str
    network_isolated: bool
    limit_s: float | None = None  # the time limit in force at the end (the initial one, or the one the task asked)
    gpu_wait_s: float | None = None  # seconds the worker waited for its shared GPU (added to its limit)

    @property
    def killed_by_signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


def scrubbed_environment(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The allowlisted part of `base` (default os.environ) plus `extra`; nothing that looks like a secret."""
    base = os.environ if base is None else base
    env = {k: base[k] for k in ENV_ALLOWLIST if k in base}
    env.update(extra or {})
    return {k: v for k, v in env.items() if not any(marker in k.upper() for marker in SECRET_MARKERS)}


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...]:
    """`unshare -n` (root) or `unshare -rn` (user namespace) when either works here, else nothing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for prefix in ((unshare, "-n"), (unshare, "-rn")):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ()


def _process_group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in a group, from /proc (pages -> MB)."""
    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # fields after "(comm)": state, ppid, pgrp, ..., rss at 21
        if len(fields) > 21 and int(fields[2]) == pgid:
            total += int(fields[21]) * page_mb
    return total


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_isolated(argv: list[str], *, cwd: str | Path, env: dict[str, str], timeout_s: float,
                 memory_cap_mb: int | None = None, isolate_network: bool = True,
                 log_name: str = "worker.log", gate: threading.Event | None = None,
                 gate_path: str | Path | None = None, cpus: set[int] | None = None,
                 max_timeout_s: float | None = None, gpu_share: SharedGpu | None = None) -> SandboxResult:
    """Run `argv` in its own session and wait; stdout and stderr go to `cwd/log_name`, whose tail is returned.

    With a `gate`, the process starts at once but is told to go only when the gate is set (by creating
    `gate_path`, which the worker waits for): a worker can do its trusted start-up (interpreter, imports) while
    another uses the GPU. The time limit and `wall_seconds` count from the go. `cpus`: the cores the process (and
    every process it starts later) may run on.

    With `max_timeout_s`, the process may ask once for a longer limit (up to that cap) by writing
    `{"limit_s": X}` to the pipe whose descriptor it finds in DICE_RUN_LIMIT_FD and closing it: the worker does so
    after measuring its task, before any untrusted code runs, so the limit fits the task's size.

    With `gpu_share`, the worker shares that GPU with other lanes through the pipes of gpu_share.py: the seconds it
    waits for the GPU are added to its limit (at most `max_timeout_s` or the limit again), and whatever it held is
    released when it ends."""
    if (gate is None) != (gate_path is None):
        raise ValueError("gate and gate_path go together")
    prefix = network_isolation_prefix() if isolate_network else ()
    log_path = Path(cwd) / log_name
    start = time.monotonic()
    peak_rss = 0.0
    timed_out = memory_exceeded = False
    limit = {"s": timeout_s, "asked": None}
    read_fd = write_fd = None
    if max_timeout_s is not None:
        read_fd, write_fd = os.pipe()
        env = {**env, settings.RUN_LIMIT_FD.name: str(write_fd)}
    share = GpuShareServer(gpu_share) if gpu_share is not None else None
    pass_fds = (write_fd,) if write_fd is not None else ()
    if share is not None:
        env = {**env, **share.env()}
        pass_fds += share.child_fds()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen([*prefix, *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds)
        except BaseException:
            if share is not None:
                share.start()  # closes the worker's ends
                share.close()
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)  # the child holds the only write end now: EOF when it closes (or dies)
        if share is not None:
            share.start()
        extension_cap = max_timeout_s if max_timeout_s is not None else timeout_s
        if read_fd is not None:
            def read_limit() -> None:
                chunks = []
                with os.fdopen(read_fd, "rb") as pipe:
                    while chunk := pipe.read(4096):
                        chunks.append(chunk)
                try:
                    asked = float(json.loads(b"".join(chunks).decode())["limit_s"])
                except (ValueError, KeyError, TypeError):
                    return  # nothing (or garbage) written: the initial limit stands
                limit["asked"] = asked
                limit["s"] = min(max(timeout_s, asked), max_timeout_s)

            threading.Thread(target=read_limit, daemon=True).start()
        if cpus:
            try:  # right after the start, before the worker runs any compiler: children inherit the mask
                os.sched_setaffinity(proc.pid, cpus)
            except (ProcessLookupError, OSError):
                pass  # already gone, or not allowed here: the run goes on unpinned
        stop = threading.Event()

        def watch_memory() -> None:
            nonlocal peak_rss, memory_exceeded
            while not stop.wait(POLL_SECONDS):
                rss = _process_group_rss_mb(proc.pid)
                peak_rss = max(peak_rss, rss)
                if memory_cap_mb is not None and rss > memory_cap_mb:
                    memory_exceeded = True
                    _kill_group(proc.pid)
                    return

        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        waited_before_go = 0.0  # a prestarted worker's wait to start CUDA: before its limit counts, so not added
        if gate is not None:
            while not gate.wait(0.05) and proc.poll() is None:
                pass
            Path(gate_path).touch()
            start = time.monotonic()
            waited_before_go = share.seconds_waited() if share is not None else 0.0
        try:
            while proc.poll() is None:
                waited = (min(share.seconds_waited() - waited_before_go, extension_cap) if share is not None
                          else 0.0)
                remaining = limit["s"] + waited - (time.monotonic() - start)
                if remaining <= 0:
                    timed_out = True
                    break
                try:
                    proc.wait(timeout=min(remaining, 0.5))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # Kill the whole group even on a clean exit: a worker must leave no grandchildren behind.
            _kill_group(proc.pid)
            proc.wait()
            stop.set()
            watcher.join()
            if share is not None:
                share.close()
    output = log_path.read_bytes()[-OUTPUT_TAIL_CHARS:].decode("utf-8", "replace")
    return SandboxResult(
        returncode=proc.returncode, timed_out=timed_out, memory_exceeded=memory_exceeded,
        wall_seconds=time.monotonic() - start, peak_rss_mb=peak_rss, output_tail=output,
        network_isolated=bool(prefix), limit_s=limit["s"],
        gpu_wait_s=share.waited_s - waited_before_go if share is not None else None,
    )
