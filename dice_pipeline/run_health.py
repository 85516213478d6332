"""Runs whose process is gone are ended (canceled), so the UI never shows a killed run as "Started" forever.

A run killed with SIGKILL (or its machine rebooted) cannot report its own end, and Dagster's run monitoring cannot
ask the default run launcher whether a run worker lives. Every run records the process that executes it: `dice run`
tags its runs with its pid and host (`dice/pid`, `dice/host`), and any run's RUN_START event names the process that
started it (the run worker the UI launched, or `dice run` itself). A run still in progress whose process no longer
exists on this host (or is another process that reused the pid since) is orphaned. `dice run`, `dice dev` and a
sensor in the code location call `end_orphaned_runs`.

An orphaned run is marked canceled, not failed: it was stopped from outside, and Dagster counts the partitions a
failed run had planned as failed, while a killed run's unfinished steps wrote nothing (every warehouse write is one
transaction): the partitions keep their last materialization, which is what the warehouse holds.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

PID_TAG = "dice/pid"
HOST_TAG = "dice/host"
STARTED_AT_TAG = "dice/process_started_at"


def process_tags() -> dict[str, str]:
    """Tags for a run executed in this process, so a later check can tell whether it still runs."""
    started = process_start_time(os.getpid())
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(),
            **({STARTED_AT_TAG: f"{started:.2f}"} if started is not None else {})}


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from /proc; None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    if fields[0] == "Z":  # a zombie has exited: only its exit status is left
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def process_alive(pid: int, started_before: float | None = None) -> bool:
    """Whether `pid` is a live process on this host; with `started_before` (a time), also that it is the process
    that existed then, not a later one given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    started = process_start_time(pid)
    if started is None:
        # Without /proc (not Linux) os.kill's answer stands; with it, no start time means an exited zombie.
        return not os.path.exists("/proc/self/stat")
    # The clock ticks of /proc round the start time: allow a few seconds.
    return started_before is None or started <= started_before + 5.0


@dataclass(frozen=True)
class RunProcess:
    pid: int
    host: str | None  # None: recorded by a RUN_START event (this instance's runs start on this host)
    started_before: float | None  # the process existed at this time (the run's start)


def run_process(instance, run) -> RunProcess | None:
    """The process executing `run`, as recorded; None when nothing says (a run not started yet)."""
    from dagster import DagsterEventType

    if PID_TAG in run.tags:
        started = run.tags.get(STARTED_AT_TAG)
        return RunProcess(int(run.tags[PID_TAG]), run.tags.get(HOST_TAG),
                          float(started) if started else None)
    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_START, limit=1).records
    if not records:
        return None
    entry = records[0].event_log_entry
    pid = entry.dagster_event.pid if entry.dagster_event is not None else None
    return None if pid is None else RunProcess(int(pid), None, entry.timestamp)


def end_orphaned_runs(instance) -> list[str]:
    """Mark canceled every unfinished run whose process is gone from this host. Returns one line per run."""
    from dagster import DagsterRunStatus, RunsFilter

    in_progress = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                   DagsterRunStatus.CANCELING]
    host = socket.gethostname()
    marked = []
    for record in instance.get_run_records(filters=RunsFilter(statuses=in_progress)):
        run = record.dagster_run
        process = run_process(instance, run)
        if process is None or (process.host is not None and process.host != host):
            continue  # not started yet (the daemon's business), or another host's
        if run.status == DagsterRunStatus.NOT_STARTED and PID_TAG not in run.tags:
            continue  # queued in the UI, waiting for the daemon
        if process_alive(process.pid, process.started_before):
            continue
        message = (f"the process running it (pid {process.pid}) is gone: killed, or its machine restarted; its "
                   "unfinished steps wrote nothing")
        instance.report_run_canceled(run, message=message)
        marked.append(f"run {run.run_id} ended as canceled: {message}")
    return marked
