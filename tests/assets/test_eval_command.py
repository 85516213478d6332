"""`dice eval` end to end on CPU in a scratch Dagster home: register a tiny SDAR checkpoint, evaluate it on a
three-task level 1 (execution not run: no GPU), print the comparison report beside the paper's numbers; the CPU
smoke-test settings, quiet by default with a progress bar, and a Ctrl-C that the same command resumes from."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from training import SDARForCausalLM, preset_config
from training.tokenizer import train_bpe_tokenizer

TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()"
        "\n\n    def forward(self, x):\n        return {op}\n\ndef get_inputs():\n    return [torch.rand(4, 16)]\n\n"
        "def get_init_inputs():\n    return []\n")
TASKS = [(1, "1_Double", "x * 2"), (19, "19_ReLU", "torch.relu(x)")]


def test_dice_eval_registers_runs_and_reports(tmp_path, run_dice):
    tokenizer = train_bpe_tokenizer([TASK.format(op=op) for _, _, op in TASKS] * 4, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
                    ).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"level": 1, "problem_id": i, "name": n, "code": TASK.format(op=op)}) + "\n"
                             for i, n, op in TASKS))
    env = {"DICE_KERNELBENCH_TASKS": str(tasks), "DICE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    added = run_dice("eval", "add-checkpoint", "tiny", str(tmp_path / "ckpt"), **env)
    assert added.returncode == 0, added.stderr[-2000:]
    assert "tiny" in run_dice("eval", "list", **env).stdout
    bad_name = run_dice("eval", "add-checkpoint", "bad|name", str(tmp_path / "ckpt"), **env)
    assert bad_name.returncode == 2 and len(bad_name.stderr.splitlines()) == 1, bad_name.stderr
    ran = run_dice("eval", "run", "tiny", "--level", "1", "--max-new-tokens", "8", "--execute", "never", **env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "tiny level 1: run" in ran.stdout and "succeeded" in ran.stdout
    assert "| tiny | measured here | 0 / 0 / 0 * |" in ran.stdout and "| DICE-8B | paper |" in ran.stdout
    unknown = run_dice("eval", "run", "nobody", **env)
    assert unknown.returncode == 2 and "add-checkpoint nobody" in unknown.stderr
    assert len(unknown.stderr.splitlines()) == 1, unknown.stderr  # one line, no traceback


@pytest.fixture
def tiny_checkpoint_and_tasks(tmp_path):
    tasks = [(1, "1_Double", "x * 2"), (19, "19_ReLU", "torch.relu(x)"), (21, "21_Sigmoid", "torch.sigmoid(x)")]
    tokenizer = train_bpe_tokenizer([TASK.format(op=op) for _, _, op in tasks] * 4, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
                    ).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"level": 1, "problem_id": i, "name": n, "code": TASK.format(op=op)}) + "\n"
                            for i, n, op in tasks))
    env = {"DICE_KERNELBENCH_TASKS": str(path), "DICE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return tmp_path / "ckpt", env


def test_a_cpu_smoke_test_is_quiet_and_reports_its_level_incomplete(tiny_checkpoint_and_tasks, run_dice):
    checkpoint, env = tiny_checkpoint_and_tasks
    assert run_dice("eval", "add-checkpoint", "tiny", str(checkpoint), **env).returncode == 0
    ran = run_dice("eval", "run", "tiny", "--max-tasks", "2", "--max-new-tokens", "8", "--batch-size", "1", **env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    # One line a run and the report; no Dagster event stream (that is --verbose's)
    assert ran.stdout.splitlines()[:2] == [line for line in ran.stdout.splitlines()[:2] if ": run " in line]
    assert "DEBUG" not in ran.stdout + ran.stderr and "STEP_START" not in ran.stdout + ran.stderr
    assert "generate: 100%" in ran.stderr  # the progress bar
    assert "| tiny | measured here | 0 / 0 / 0 * † |" in ran.stdout  # † : only the first 2 of 3 tasks
    assert "| tiny | 1 | 1e-2 | 2 |" in ran.stdout


def test_the_paper_settings_on_a_cpu_say_how_to_smoke_test(capsys):
    import argparse

    from dice_pipeline.commands.eval import _warn_if_slow_on_this_host

    _warn_if_slow_on_this_host(argparse.Namespace(execute="auto", max_new_tokens=4096, max_tasks=None))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dice eval: no GPU here") and "--max-tasks 3 --max-new-tokens 64" in line


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_same_command_resumes(tiny_checkpoint_and_tasks, run_dice, tmp_path, ctrl_c):
    checkpoint, env = tiny_checkpoint_and_tasks
    assert run_dice("eval", "add-checkpoint", "tiny", str(checkpoint), **env).returncode == 0
    args = ["eval", "run", "tiny", "--max-new-tokens", "96", "--batch-size", "1", "--execute", "never"]
    full_env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home"),
                "DICE_WAREHOUSE_PATH": str(tmp_path / "w.duckdb"), "DICE_ARTIFACTS_DIR": str(tmp_path / "a"), **env}
    # Ctrl-C once the first answer is stored.
    returncode, out, err = ctrl_c(args, full_env, tmp_path, lambda: any(
        (tmp_path / "cache").glob("kernelbench_eval/*/level1/generations/*.json")))
    assert returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("dice eval:")]
    assert "interrupted during tiny level 1:" in line and "rerun the same command to resume" in line
    kept = int(re.search(r"(\d+) generations", line).group(1))
    assert 1 <= kept < 3

    again = run_dice(*args, **env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"generate:   0%|          | 0/{3 - kept}" in again.stderr  # only what was left is generated
