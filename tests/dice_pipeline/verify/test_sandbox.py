"""The isolation layer: timeouts kill the whole process group, crashes and memory blow-ups are reported,
secrets never reach the child, and the network is cut where the OS allows it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dice_pipeline.verify.sandbox import network_isolation_prefix, run_isolated, scrubbed_environment


def _run(tmp_path: Path, code: str, **kwargs):
    kwargs.setdefault("timeout_s", 30)
    return run_isolated([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_environment(), **kwargs)


def test_hanging_child_times_out_and_its_grandchildren_die(tmp_path):
    code = ("import subprocess, time, pathlib\n"
            "p = subprocess.Popen(['sleep', '60'])\n"
            "pathlib.Path('grandchild.pid').write_text(str(p.pid))\n"
            "time.sleep(60)\n")
    start = time.monotonic()
    result = _run(tmp_path, code, timeout_s=2)
    assert result.timed_out and time.monotonic() - start < 15
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    time.sleep(0.5)
    stat = Path(f"/proc/{grandchild}/stat")
    assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"


def test_crashing_child_reports_its_signal(tmp_path):
    result = _run(tmp_path, "import os; os.abort()")
    assert not result.timed_out and result.killed_by_signal == 6


def test_child_over_the_memory_cap_is_killed(tmp_path):
    result = _run(tmp_path, "x = bytearray(800 * 2**20)\nimport time\ntime.sleep(20)", memory_cap_mb=300)
    assert result.memory_exceeded and result.peak_rss_mb > 300 and result.wall_seconds < 15


def test_output_tail_is_captured(tmp_path):
    result = _run(tmp_path, "print('hello from the worker')")
    assert result.returncode == 0 and "hello from the worker" in result.output_tail


def test_environment_keeps_only_allowlisted_names_and_drops_secrets():
    base = {"PATH": "/bin", "HF_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s", "OPENAI_API_KEY": "k", "CUDA_HOME": "/cuda",
            "SOME_RANDOM_VAR": "x"}
    env = scrubbed_environment({"HOME": "/scratch", "MY_PRIVATE_TOKEN": "p"}, base=base)
    assert env == {"PATH": "/bin", "CUDA_HOME": "/cuda", "HOME": "/scratch"}


def test_child_sees_no_network_interface_but_loopback_where_unshare_works(tmp_path):
    result = _run(tmp_path, "import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert result.network_isolated == bool(network_isolation_prefix())
    if result.network_isolated:
        assert result.output_tail.strip() == "['lo']"


def test_child_runs_in_the_scratch_directory(tmp_path):
    result = _run(tmp_path, "import os; print(os.getcwd())")
    assert os.path.realpath(result.output_tail.strip()) == os.path.realpath(tmp_path)


def _open_gate_after(seconds: float):
    import threading

    gate = threading.Event()
    threading.Timer(seconds, gate.set).start()
    return gate


WAIT_FOR_GATE = ("import pathlib, time\n"
                 "pathlib.Path('waiting').touch()\n"
                 "while not pathlib.Path('go').exists(): time.sleep(0.01)\n")


def test_time_limit_counts_from_the_gate(tmp_path):
    # 1.5 s at the gate, then 0.3 s of work under a 1 s limit: not a timeout.
    result = _run(tmp_path, WAIT_FOR_GATE + "time.sleep(0.3)\n", timeout_s=1.0, gate=_open_gate_after(1.5),
                  gate_path=tmp_path / "go")
    assert not result.timed_out and result.returncode == 0
    assert result.wall_seconds < 1.0 and (tmp_path / "waiting").exists()


def test_work_after_the_gate_is_still_time_limited(tmp_path):
    result = _run(tmp_path, WAIT_FOR_GATE + "time.sleep(60)\n", timeout_s=1.0, gate=_open_gate_after(0.2),
                  gate_path=tmp_path / "go")
    assert result.timed_out


def test_a_child_that_dies_at_the_gate_does_not_hang_the_parent(tmp_path):
    import threading

    start = time.monotonic()
    result = _run(tmp_path, "raise SystemExit(3)", timeout_s=5, gate=threading.Event(), gate_path=tmp_path / "go")
    assert result.returncode == 3 and time.monotonic() - start < 5


def test_child_and_its_children_run_on_the_given_cores(tmp_path):
    core = min(os.sched_getaffinity(0))
    code = ("import os, subprocess, sys\n"
            "print('self', sorted(os.sched_getaffinity(0)))\n"
            "subprocess.run([sys.executable, '-c', 'import os; print(\"child\", sorted(os.sched_getaffinity(0)))'])\n")
    result = _run(tmp_path, code, cpus={core})
    assert f"self [{core}]" in result.output_tail and f"child [{core}]" in result.output_tail
