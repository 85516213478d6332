"""benchmarks/scaling_capacity.py as its dry run (static checks only, any host): the plumbing the GPU run relies on
(phases, the JSON rewritten after each, the log, the summary line), not the figures."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scaling_capacity.py"


def test_dry_run_writes_every_phase_and_a_summary(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--budget-s", "60", "--dry-run"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "scaling_capacity.json").read_text())
    assert report["dry_run"] and report["build_workers"] >= 1 and report["cpu_cores"] >= 1
    compile_phase = report["phases"]["compile"]
    assert compile_phase["candidates"] == 3 and compile_phase["static_only"]
    assert compile_phase["statuses"] == {"not_executed": 3}
    assert report["phases"]["judge_1gpu"] == {"skipped": "dry run"}
    assert "skipped" in report["phases"]["judge_all_gpus"]
    assert "SUMMARY compile:" in result.stdout
    assert "compile: 3 cold builds" in (tmp_path / "scaling_capacity.log").read_text()


def test_judge_phase_fits_whole_rounds_into_the_time_left():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaling_capacity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = [{"uuid": f"u{i}", "pytorch_code": "ref", "generated_code": f"cand{i}"} for i in range(3)]
    jobs = module.plan_judge_jobs(built, [0, 1], seconds_left=60, seconds_per_candidate=10)
    assert len(jobs) == 10  # 5 a GPU in 85% of 60 s at 10 s each
    assert [j.job_id for j in jobs[:4]] == ["u0#0", "u1#0", "u2#0", "u0#1"]
    assert len({j.job_id for j in jobs}) == 10 and jobs[3].candidate_src == "cand0"
    assert module.plan_judge_jobs(built, [0], seconds_left=5, seconds_per_candidate=10) == []
    assert module.plan_judge_jobs([], [0], seconds_left=600, seconds_per_candidate=10) == []
