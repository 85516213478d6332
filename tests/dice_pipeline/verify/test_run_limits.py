"""The run stage's time limit: sized to the task from one input draw and one reference call, asked for once by the
worker before any candidate code runs, capped and enforced by the sandbox."""

from __future__ import annotations

import sys

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.sandbox import run_isolated


def test_run_limit_grows_with_the_task_and_is_capped():
    config = VerifyConfig(run_timeout_s=60, max_run_timeout_s=1800)
    small = config.run_time_limit(draw_s=0.001, reference_call_s=0.0001)
    large = config.run_time_limit(draw_s=0.01, reference_call_s=0.05)
    # A launch-bound task keeps about the base limit; a 50 ms reference call gets minutes more.
    assert 60 < small < 120 and large > 3 * small and large <= 1800
    assert config.run_time_limit(draw_s=1.0, reference_call_s=5.0) == 1800

def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]

ASK_FOR_MORE = """
import json, os, time
fd = int(os.environ["DICE_RUN_LIMIT_FD"])
os.write(fd, json.dumps({"limit_s": %s}).encode()); os.close(fd)
time.sleep(%s)
"""

def test_a_worker_may_ask_once_for_the_limit_its_task_needs(tmp_path):
    result = run_isolated(_child(ASK_FOR_MORE % (5.0, 2.0)), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=1.0, max_timeout_s=10.0, isolate_network=False)
    assert not result.timed_out and result.returncode == 0 and result.limit_s == 5.0

def test_the_asked_limit_is_capped_and_enforced(tmp_path):
    result = run_isolated(_child(ASK_FOR_MORE % (1000.0, 30.0)), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=0.5, max_timeout_s=1.5, isolate_network=False)
    assert result.timed_out and result.limit_s == 1.5 and result.wall_seconds < 10

def test_without_a_request_the_initial_limit_stands(tmp_path):
    result = run_isolated(_child("import time; time.sleep(30)"), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          timeout_s=1.0, max_timeout_s=60.0, isolate_network=False)
    assert result.timed_out and result.limit_s == 1.0 and result.wall_seconds < 10
