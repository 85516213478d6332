"""The GPU evaluation script's CPU dry run: a tiny SDAR checkpoint, three tasks, no GPU. It writes its 7 files,
states that nothing executed, imports nothing a torch-only GPU host lacks, and a second run resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from training import SDARForCausalLM, preset_config
from training.tokenizer import train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()"
        "\n\n    def forward(self, x):\n        return {op}\n\ndef get_inputs():\n    return [torch.rand(4, 16)]\n\n"
        "def get_init_inputs():\n    return []\n")
TASKS = [(1, "1_Double", "x * 2"), (19, "19_ReLU", "torch.relu(x)"), (23, "23_Softmax", "torch.softmax(x, dim=1)")]


def test_cpu_dry_run_writes_everything_and_resumes(tmp_path):
    tokenizer = train_bpe_tokenizer([TASK.format(op=op) for _, _, op in TASKS] * 4, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
                    ).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"level": 1, "problem_id": i, "name": n, "code": TASK.format(op=op)}) + "\n"
                             for i, n, op in TASKS))
    command = [sys.executable, str(ROOT / "benchmarks" / "kernelbench_eval_gpu.py"), str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "ckpt"), "--level", "1", "--tasks-file", str(tasks), "--budget-s", "300",
               "--max-new-tokens", "8", "--state-dir", str(tmp_path / "state")]
    env = {**os.environ, "PATH": "/usr/bin:/bin", "DICE_VERIFY_CACHE": str(tmp_path / "builds")}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["baselines.json", "log.txt", "metrics.json", "report.md",
                                                     "results.jsonl", "sanity.json", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["executed"] is False and summary["forbidden_modules_loaded"] == []
    assert summary["complete"] and summary["sanity_passed"] and summary["generated_now"] == 3
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_key"] for r in rows] == ["L1/1_Double", "L1/19_ReLU", "L1/23_Softmax"]
    assert not any(r["executed"] for r in rows)
    baselines = json.loads((out / "baselines.json").read_text())
    assert {b["status"] for b in baselines.values()} == {"not_executed"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["tolerance"] for m in metrics] == ["1e-2", "1e-4"] and metrics[0]["n_tasks"] == 3
    assert "measured here" in (out / "report.md").read_text()

    second = subprocess.run(command + ["--no-sanity"], capture_output=True, text=True, timeout=600, env=env,
                            cwd=tmp_path)
    assert second.returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generated_now"] == 0 and summary["judged_now"] == 0  # all read back from the state directory


def test_a_crash_still_writes_every_file_with_what_there_is(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"level": 1, "problem_id": 1, "name": "1_Double", "code": TASK.format(op="x * 2")})
                     + "\n")
    command = [sys.executable, str(ROOT / "benchmarks" / "kernelbench_eval_gpu.py"), str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "no_such_checkpoint"), "--tasks-file", str(tasks),
               "--state-dir", str(tmp_path / "state"), "--no-sanity"]
    env = {**os.environ, "PATH": "/usr/bin:/bin", "DICE_VERIFY_CACHE": str(tmp_path / "builds")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["error"] and not summary["complete"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [(r["task_key"], r["status"]) for r in rows] == [("L1/1_Double", "missing")]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())[0]["n_missing"] == 1


def test_which_baselines_a_later_run_measures():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernelbench_eval_gpu import _needs_baseline

    assert _needs_baseline(None, "eager", executes=False)
    assert not _needs_baseline({"status": "not_executed"}, "eager", executes=False)
    assert _needs_baseline({"status": "not_executed"}, "eager", executes=True)
    assert _needs_baseline({"status": "infrastructure_error"}, "eager", executes=True)
    assert not _needs_baseline({"status": "timeout"}, "eager", executes=True)
    assert _needs_baseline({"status": "measured"}, "compile", executes=True)
    assert not _needs_baseline({"status": "measured", "compile_status": "runtime_error"}, "compile", executes=True)
    assert not _needs_baseline({"status": "not_executed"}, "compile", executes=True)


def _sweep_row(task_id, status="measured", lanes=1, baselines=("eager", "compile"), compile_ms=0.5):
    return {"task_id": task_id, "status": status, "message": "", "eager_ms_gpu": 1.0, "eager_ms_host": 1.1,
            "compile_ms_gpu": compile_ms, "compile_error": None if compile_ms else "BackendCompilerFailed: boom",
            "peak_gpu_mb": 10.0, "input_draw": "get_inputs() on the host", "provenance": {"gpu": "H200"},
            "lanes_per_gpu": lanes, "baselines": list(baselines)}


def test_baselines_are_taken_from_a_one_lane_sweep_only():
    from dice_pipeline.evaluation.baselines import baselines_from_sweep

    rows = [_sweep_row("L1/1_A"), _sweep_row("L1/2_B", lanes=3), _sweep_row("L1/3_C", compile_ms=None),
            _sweep_row("L1/4_D", baselines=("eager",)), _sweep_row("L1/5_E", status="infrastructure_error"),
            _sweep_row("L1/6_F", status="timeout"), _sweep_row("L2/1_G")]
    seeded = baselines_from_sweep(rows, ["L1/1_A", "L1/2_B", "L1/3_C", "L1/4_D", "L1/5_E", "L1/6_F"])
    assert sorted(seeded) == ["L1/1_A", "L1/3_C", "L1/4_D", "L1/6_F"]  # multi-lane, infra error, other level: out
    assert seeded["L1/1_A"]["compile_status"] == "measured" and seeded["L1/1_A"]["compile_ms_gpu"] == 0.5
    assert seeded["L1/3_C"]["compile_status"] == "runtime_error" and "boom" in seeded["L1/3_C"]["compile_message"]
    assert "compile_status" not in seeded["L1/4_D"]  # eager only: the evaluation still times torch.compile
    assert "compile_status" not in seeded["L1/6_F"]

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernelbench_eval_gpu import _needs_baseline

    assert not _needs_baseline(seeded["L1/1_A"], "compile", executes=True)
    assert _needs_baseline(seeded["L1/4_D"], "compile", executes=True)
    assert not _needs_baseline(seeded["L1/6_F"], "eager", executes=True)


def test_baselines_from_a_sweep_are_only_those_measured_on_this_gpu():
    from dice_pipeline.evaluation.baselines import baselines_from_sweep

    rows = [_sweep_row("L1/1_A"), {**_sweep_row("L1/2_B"), "provenance": {"gpu": "NVIDIA H100 80GB HBM3"}}]
    assert sorted(baselines_from_sweep(rows, ["L1/1_A", "L1/2_B"], gpu="H200")) == ["L1/1_A"]
    assert sorted(baselines_from_sweep(rows, ["L1/1_A", "L1/2_B"], gpu="NVIDIA H100 80GB HBM3")) == ["L1/2_B"]
    assert sorted(baselines_from_sweep(rows, ["L1/1_A", "L1/2_B"])) == ["L1/1_A", "L1/2_B"]


def test_the_sweep_resumes_from_its_state_and_retries_infrastructure_errors(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernelbench_sweep import read_state

    state = tmp_path / "state.jsonl"
    state.write_text("\n".join(json.dumps(r) for r in [
        _sweep_row("L1/1_A", status="infrastructure_error"), _sweep_row("L1/1_A"),
        _sweep_row("L1/2_B"), _sweep_row("L1/2_B", status="infrastructure_error"),
        _sweep_row("L1/3_C", status="not_executed")]) + "\n{\"task_id\": \"L1/4")
    kept = {row["task_id"]: row["status"] for row in read_state(state)}
    assert kept == {"L1/1_A": "measured"}  # the last row wins; infra errors and not-executed are judged again
    assert read_state(tmp_path / "missing.jsonl") == [] and read_state(None) == []


def test_the_sweep_summary_says_where_the_time_went_and_which_gpus_measured():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernelbench_sweep import summarize

    from dice_pipeline.verify import VerifyConfig

    rows = []
    for index, (timing, whole, oom) in enumerate([(4.0, False, False), (6.0, True, False), (9.0, False, True)]):
        row = _sweep_row(f"L1/{index + 1}_T", lanes=2)
        row["control_speedup_gpu"] = 1.0
        row["provenance"] = {"gpu": "H200" if index else "H100", "run_seconds": 10.0 + index, "run_limit_s": 300.0,
                             "phase_seconds": {"timing": timing, "correctness": 2.0},
                             **({"whole_gpu_from_the_start": {"input_mb": 6144.0}} if whole else {}),
                             **({"first_attempt_out_of_memory": {"status": "runtime_error"}} if oom else {})}
        rows.append(row)
    summary = summarize(rows, [], 30.0, VerifyConfig(), 2)
    assert summary["phase_seconds_median"] == {"timing": 6.0, "correctness": 2.0}
    assert summary["whole_gpu_from_the_start"] == ["L1/2_T"]
    assert summary["judged_again_after_running_out_of_memory"] == ["L1/3_T"]
    assert summary["gpus_of_rows"] == ["H100", "H200"] and summary["tasks_over_their_limit"] == []
