"""`dice dev` puts the instance right before the UI starts: runs whose process is gone are ended, threshold
partitions with a bad key replaced or deleted, and the paper's threshold added."""

import argparse
import socket
import subprocess
import sys

import dagster as dg
import pytest

from assets import keys
from dice_pipeline.commands import dev
from dice_pipeline.run_health import HOST_TAG, PID_TAG


@dg.op
def noop():
    pass


@dg.job
def one_step():
    noop()


def test_dice_dev_tidies_the_instance_before_the_ui_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    instance = dg.DagsterInstance.get()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    killed = instance.create_run_for_job(one_step, status=dg.DagsterRunStatus.STARTED,
                                         tags={PID_TAG: str(child.pid), HOST_TAG: socket.gethostname()})
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["1.50", "abc"])
    started = []

    def execv(path, command):  # what would replace this process with `dagster dev`
        started.append(command)
        raise SystemExit(0)

    monkeypatch.setattr(dev.os, "execv", execv)
    with pytest.raises(SystemExit):
        dev.start_dagster_dev(argparse.Namespace(host="127.0.0.1", port="3000"))
    assert started and started[0][1:4] == ["-m", "dagster", "dev"]
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"dice dev: run {killed.run_id} ended as canceled") for line in lines), lines
    assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.CANCELED
    assert sorted(instance.get_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name)) == ["1.5", "2.0"]
