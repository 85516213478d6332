"""`dice eval` end to end on CPU in a scratch Dagster home: register a tiny SDAR checkpoint, evaluate it on a
three-task level 1 (execution not run: no GPU), print the comparison report beside the paper's numbers."""

from __future__ import annotations

import json

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
    assert run_dice("eval", "add-checkpoint", "bad|name", str(tmp_path / "ckpt"), **env).returncode != 0
    ran = run_dice("eval", "run", "tiny", "--level", "1", "--max-new-tokens", "8", "--execute", "never", **env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "tiny level 1: run" in ran.stdout and "succeeded" in ran.stdout
    assert "| tiny | measured here | 0 / 0 / 0 * |" in ran.stdout and "| DICE-8B | paper |" in ran.stdout
    unknown = run_dice("eval", "run", "nobody", **env)
    assert unknown.returncode != 0 and "add-checkpoint nobody" in unknown.stderr
