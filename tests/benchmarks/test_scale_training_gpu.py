"""The GPU scale measurement's CPU dry run: every measurement (block-diffusion SFT and autoregressive training with
and without activation checkpointing, rollout decoding at two batch sizes) runs on the tiny shape through the
project's own FSDP loop and lands in one JSON; a budget too small skips measurements and says so; the shapes are the
real SDAR-4B config's and Qwen3-1.7B's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale_training_gpu.py"
SDAR_4B = Path(os.environ.get("DICE_SDAR_FILES", ROOT.parent / "shared" / "data" / "sdar")) / "SDAR-4B-Chat"


def _script():
    spec = importlib.util.spec_from_file_location("scale_training_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: Path, *extra: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--dry-run", *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "scale_training.json").read_text())


def test_cpu_dry_run_writes_every_measurement(tmp_path):
    report = _run(tmp_path / "out")
    results = report["results"]
    assert [(r["kind"], r.get("activation_checkpointing"), r.get("batch")) for r in results] == [
        ("block_diffusion_sft", True, None), ("autoregressive", True, None),
        ("block_diffusion_sft", False, None), ("autoregressive", False, None),
        ("rollout_decoding", None, 2), ("rollout_decoding", None, 4)]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in results), results
    training = [r for r in results if r["kind"] != "rollout_decoding"]
    assert all(r["step_s"] > 0 and r["mfu"] > 0 for r in training)
    assert all(r["strategy"] == "fsdp" for r in results if r["kind"] == "block_diffusion_sft")
    decoding = [r for r in results if r["kind"] == "rollout_decoding"]
    assert all(r["cache_positions"] == 16 + 64 and r["rl_step_rollout_s_1gpu"] > 0 for r in decoding)
    assert {(r["shape"], r["activation_checkpointing"]) for r in report["bd_over_ar"]} == {("tiny", True),
                                                                                          ("tiny", False)}
    assert report["device"] == "cpu" and report["args"]["dry_run"]


def test_a_budget_too_small_skips_every_measurement_and_says_so(tmp_path):
    report = _run(tmp_path / "out", "--budget-s", "0")
    assert len(report["results"]) == 6
    assert all(r["status"] == "skipped" and "budget" in r["reason"] for r in report["results"])


def test_the_measured_shapes_are_sdar_4b_and_qwen3_1_7b():
    script = _script()
    four, small = script.shape_config("4B"), script.shape_config("1.7B")
    assert (small.num_hidden_layers, small.hidden_size, small.intermediate_size, small.num_attention_heads,
            small.num_key_value_heads, small.vocab_size) == (28, 2048, 6144, 16, 8, 151936)
    if not (SDAR_4B / "config.json").is_file():
        pytest.skip(f"the SDAR files are not at {SDAR_4B.parent} (set DICE_SDAR_FILES)")
    real = json.loads((SDAR_4B / "config.json").read_text())
    for field in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "block_size",
                  "mask_token_id"):
        assert getattr(four, field) == real[field], field


def test_mfu_counts_the_body_the_scored_head_and_block_causal_attention():
    script = _script()
    config = script.shape_config("4B")
    # 6 x (36 layers x (2560 x (2 x 4096 + 2 x 1024) + 3 x 2560 x 9728)) = 6 x 3.63e9 body FLOPs a token
    assert script.body_parameters(config) == 36 * (2560 * (2 * 4096 + 2 * 1024) + 3 * 2560 * 9728)
    per_token = script.ar_flops_per_token(config, 2048)
    assert per_token == pytest.approx(6 * script.body_parameters(config) + 6 * 2560 * 151936
                                      + 12 * 36 * 4096 * 1024.5)


def test_a_measurement_out_of_memory_is_retried_at_half_the_tokens_and_each_attempt_recorded(monkeypatch):
    import torch

    script = _script()
    sizes = []

    def fake_block_diffusion(shape, checkpointing, args, device, peak, row_length):
        sizes.append(row_length)
        if row_length > 4096:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return dict(row_length=row_length, tokens_per_s=1)

    monkeypatch.setattr(script, "measure_block_diffusion", fake_block_diffusion)
    args = script.parse_args(["--out", "unused", "--bd-row-length", "16384", "--length", "1024"])
    row = script.measure_training("block_diffusion_sft", dict(shape="4B", activation_checkpointing=True), args,
                                  torch.device("cpu"), None, None)
    assert sizes == [16384, 8192, 4096] and row["status"] == "ok" and row["row_length"] == 4096
    assert [a["size"] for a in row["oom_attempts"]] == [16384, 8192]
    # Never below one sample's two copies: out of memory there is the answer.
    args = script.parse_args(["--out", "unused", "--bd-row-length", "16384", "--length", "4096"])
    sizes.clear()
    with pytest.raises(torch.OutOfMemoryError, match="down to 8192"):
        script.measure_training("block_diffusion_sft", dict(shape="4B", activation_checkpointing=True), args,
                                torch.device("cpu"), None, None)
    assert sizes == [16384, 8192]
