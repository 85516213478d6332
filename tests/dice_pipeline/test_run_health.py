"""A run whose process is gone is ended as canceled (not left "Started" forever, and its planned partitions not
marked failed: they keep their last materialization); a live one is left alone."""

import os
import socket
import subprocess
import sys

import dagster as dg
import pytest

from dice_pipeline.run_health import (
    HOST_TAG,
    PID_TAG,
    STARTED_AT_TAG,
    end_orphaned_runs,
    process_alive,
    process_tags,
)


@dg.op
def noop():
    pass


@dg.job
def one_step():
    noop()


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _run(instance, status=dg.DagsterRunStatus.STARTED, **tags):
    return instance.create_run_for_job(one_step, tags=tags, status=status)


def test_a_run_whose_process_is_gone_is_ended_with_the_reason(instance):
    pid = _dead_pid()
    killed = _run(instance, **{PID_TAG: str(pid), HOST_TAG: socket.gethostname()})
    (line,) = end_orphaned_runs(instance)
    assert killed.run_id in line and f"pid {pid}" in line
    assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.CANCELED
    assert end_orphaned_runs(instance) == []  # once


def test_a_live_run_and_another_hosts_run_are_left_alone(instance):
    alive = _run(instance, **process_tags())
    elsewhere = _run(instance, **{PID_TAG: str(_dead_pid()), HOST_TAG: "some-other-host"})
    assert end_orphaned_runs(instance) == []
    assert {instance.get_run_by_id(r.run_id).status for r in (alive, elsewhere)} == {dg.DagsterRunStatus.STARTED}


def test_a_pid_reused_by_a_later_process_does_not_keep_a_run_alive(instance):
    # This process is alive, but it started after the recorded process did: it is not the one that ran the run.
    reused = _run(instance, **{PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), STARTED_AT_TAG: "1000.0"})
    assert len(end_orphaned_runs(instance)) == 1
    assert instance.get_run_by_id(reused.run_id).status == dg.DagsterRunStatus.CANCELED


def test_a_canceling_run_whose_process_is_gone_ends_canceled(instance):
    canceling = _run(instance, status=dg.DagsterRunStatus.CANCELING, **{PID_TAG: str(_dead_pid())})
    end_orphaned_runs(instance)
    assert instance.get_run_by_id(canceling.run_id).status == dg.DagsterRunStatus.CANCELED


def test_a_run_known_only_by_its_start_event_is_checked_by_that_process(instance):
    # What the UI's run worker leaves: no dice tags, a RUN_START event written by the worker's own process.
    finished = one_step.execute_in_process(instance=instance)
    assert finished.success
    for pid in (os.getpid(), _dead_pid()):
        run = _run(instance)
        start = dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=run.job_name, pid=pid)
        instance.report_dagster_event(start, run.run_id)
    marked = end_orphaned_runs(instance)
    assert len(marked) == 1 and f"pid {pid}" in marked[0]  # the dead worker's run only; finished runs untouched
    statuses = sorted(r.status.value for r in instance.get_runs())
    assert statuses == ["CANCELED", "STARTED", "SUCCESS"]
    assert process_alive(os.getpid()) and not process_alive(_dead_pid())
