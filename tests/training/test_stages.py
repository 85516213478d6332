"""The stage runners on a tiny model: SFT resumes after a kill with the same data order and loss curve, two gloo
processes under torchrun reproduce one process's curve, a changed dataset is refused, RL tasks come in the stage's
order, an RL stage runs end to end with the static-check reward (no GPU: nothing executed, said so), and the
conversion step trains on a code folder, is reused once its time box is spent, and feeds SFT; every stage writes the
one checkpoint format."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dice_pipeline.prompts import format_kernel_response, kernel_generation_messages
from training.checkpoints import resolve_checkpoint
from training.convert import ConversionConfig, run_conversion_stage
from training.data import read_rows, write_jsonl
from training.rl import run_rl_stage
from training.sft import SFTConfig, epoch_orders, run_sft_stage, sft_steps
from training.stages import run_stage
from training.tasks import rl_tasks_from_rows

ROOT = Path(__file__).resolve().parents[2]
SFT = dict(epochs=2, samples_per_step=1, learning_rate=1e-3, save_every=2, tokenizer_vocab_size=1024)


@pytest.fixture
def sft_rows(pair_factory):
    rows = []
    for i in range(5):
        pair = pair_factory(i)
        rows.append({"prompt_messages": json.dumps(kernel_generation_messages(pair["pytorch_code"])),
                     "response": format_kernel_response(pair["generated_code"])})
    return rows


def _cli(args, env_extra=None, **popen):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _losses(history):
    return [round(record["loss"], 5) for record in history]


def test_data_order_is_one_permutation_per_epoch_from_the_seed():
    orders = epoch_orders(5, 2, seed=3)
    assert orders == epoch_orders(5, 2, seed=3) and orders != epoch_orders(5, 2, seed=4)
    assert all(sorted(order) == list(range(5)) for order in orders)
    assert [indices for _, indices in sft_steps(orders, 2)] == [orders[0][:2], orders[0][2:4], orders[0][4:],
                                                                orders[1][:2], orders[1][2:4], orders[1][4:]]


def test_sft_resumes_after_a_kill_with_the_same_data_order_and_curve(tmp_path, sft_rows):
    data = write_jsonl(sft_rows, tmp_path / "sft.jsonl")
    reference = run_sft_stage("preset:tiny", data, tmp_path / "reference", SFTConfig(**SFT), resume=False)
    assert reference["step"] == 10 and reference["stopped_by"] == "completed"

    out = tmp_path / "killed"
    process = _cli(["-m", "training.stages", "sft", "--base", "preset:tiny", "--data", str(data), "--out", str(out),
                    "--config", json.dumps(SFT), "--no-progress"])
    deadline = time.monotonic() + 120
    while not (out / "latest").is_file() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = json.loads((resolve_checkpoint(out) / "trainer_state.json").read_text())
    assert 2 <= saved["step"] < 10, "killed before its first checkpoint or after the end: nothing to resume"

    resumed = run_sft_stage("preset:tiny", data, out, SFTConfig(**SFT), resume=True)
    assert resumed["resumed_from"] == saved["step"] and resumed["step"] == 10
    assert saved["identity"]["seed"] == 0 and saved["identity"]["samples_per_step"] == 1
    # The resumed run walks the same batches with the same noise from the same weights and optimizer state.
    assert _losses(resumed["history"]) == pytest.approx(_losses(reference["history"]), abs=1e-4)
    assert resumed["tokens_seen"] == reference["tokens_seen"]


def test_resume_refuses_a_checkpoint_trained_on_other_data(tmp_path, sft_rows):
    config = SFTConfig(**{**SFT, "max_steps": 2})
    run_sft_stage("preset:tiny", write_jsonl(sft_rows, tmp_path / "a.jsonl"), tmp_path / "out", config)
    assert (tmp_path / "out" / "latest").read_text() == "step-2"
    with pytest.raises(ValueError, match="other data or another order"):
        run_sft_stage("preset:tiny", write_jsonl(sft_rows[:-1], tmp_path / "b.jsonl"), tmp_path / "out", config)


def test_two_gloo_processes_reproduce_the_single_process_loss_curve(tmp_path, sft_rows):
    data = write_jsonl(sft_rows, tmp_path / "sft.jsonl")
    config = {**SFT, "epochs": 2, "samples_per_step": 4}  # each epoch's last global batch (1 sample): rank 1 idle
    single = run_sft_stage("preset:tiny", data, tmp_path / "single", SFTConfig(**config), resume=False)
    process = _cli(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29613",
                    "-m", "training.stages", "sft", "--base", "preset:tiny", "--data", str(data),
                    "--out", str(tmp_path / "ddp"), "--config", json.dumps(config), "--no-progress",
                    "--results", str(tmp_path / "ddp.json")], env_extra={"OMP_NUM_THREADS": "1"})
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert ddp["world_size"] == 2 and ddp["step"] == single["step"] == 4
    assert _losses(ddp["history"]) == pytest.approx(_losses(single["history"]), rel=1e-4)
    assert ddp["tokens_seen"] == single["tokens_seen"]


def test_rl_tasks_come_in_the_stages_order(pair_factory):
    pairs = [pair_factory(i) for i in range(3)]
    end_to_end = [{"schedule_position": p, "task_id": f"t{p}", "pytorch_code": pairs[p]["pytorch_code"],
                   "difficulty": d} for p, d in ((2, 3), (0, 0), (1, 1))]
    tasks = rl_tasks_from_rows(end_to_end, "rl_end_to_end")
    assert [t.task_id for t in tasks] == ["t0", "t1", "t2"] and tasks[0].prefix is None
    assert "class Model" in tasks[0].messages[-1]["content"]
    infilling = [{"task_id": "a", "prompt_messages": json.dumps([{"role": "user", "content": "fill"}]),
                  "pytorch_code": pairs[0]["pytorch_code"], "prefix": "import torch\n", "suffix": "class ModelNew:",
                  "difficulty": None}]
    (task,) = rl_tasks_from_rows(infilling, "rl_infilling")
    assert task.messages == [{"role": "user", "content": "fill"}] and task.prefix == "import torch\n"
    assert task.difficulty == 0


def test_rl_stage_runs_from_an_sft_checkpoint_with_the_static_reward(tmp_path, sft_rows, pair_factory):
    sft = run_sft_stage("preset:tiny", write_jsonl(sft_rows, tmp_path / "sft.jsonl"), tmp_path / "sft",
                        SFTConfig(**{**SFT, "max_steps": 2}))
    tasks = write_jsonl([{"schedule_position": i, "task_id": f"t{i}", "pytorch_code": pair_factory(i)["pytorch_code"],
                          "difficulty": i} for i in range(3)], tmp_path / "tasks.jsonl")
    result = run_rl_stage(tmp_path / "sft", tasks, tmp_path / "rl", "rl_end_to_end",
                          dict(samples_per_task=2, tasks_per_step=2, steps=2, max_new_tokens=16))
    assert result["step"] == 2 and result["reward"] == "static" and result["base"] == str(tmp_path / "sft")
    assert Path(result["checkpoint"]) == resolve_checkpoint(tmp_path / "rl") and Path(result["checkpoint"]).is_dir()
    first, second = result["history"]
    assert first["task_ids"] == ["t0", "t1"] and second["task_ids"] == ["t2", "t0"]  # easy -> hard, then around
    assert all("deceptive_share_by_reason" in r and r["samples"] == 4 for r in result["history"])
    assert read_rows(tasks)[0]["task_id"] == "t0" and sft["checkpoint"].endswith("step-2")


def _code_folder(path: Path) -> Path:
    path.mkdir()
    for i in range(6):
        (path / f"k{i}.cuh").write_text("".join(
            f"__global__ void scale{i}_{j}(const float* x, float* y, int n) {{\n"
            f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] * {j}.0f;\n}}\n"
            for j in range(30)))
    return path


CONVERT = dict(max_seconds=30.0, max_steps=6, window=64, rows_per_step=2, learning_rate=1e-3, warmup_steps=2,
               save_every=3, tokenizer_vocab_size=512, min_chars=500)


def test_the_conversion_step_trains_on_a_code_folder_is_reused_once_done_and_feeds_sft(tmp_path, sft_rows):
    corpus = _code_folder(tmp_path / "corpus")
    config = ConversionConfig.from_dict({**CONVERT, "corpus_roots": [str(corpus)]})
    first = run_conversion_stage("preset:tiny", tmp_path / "convert", config)
    assert first["files"] == 6 and first["roots"] == [str(corpus.resolve())] and first["windows"] > 0
    assert first["step"] == 6 and first["stopped_by"] == "max_steps" and first["loss_first"] > 0
    assert first["prediction_shift"] == 1  # the conversion's convention, here on a random model too
    assert Path(first["checkpoint"]) == resolve_checkpoint(tmp_path / "convert")

    # Asked again (every threshold partition's SFT asks for it): the saved run, at once (no corpus, no model load).
    again = run_conversion_stage("preset:tiny", tmp_path / "convert", config)
    assert again["step"] == 6 and again["resumed_from"] == 6 and again["history"] == first["history"]
    assert again["checkpoint"] == first["checkpoint"] and again["device"] == "(not loaded)"
    assert {k: again[k] for k in ("files", "windows", "roots")} == {k: first[k] for k in ("files", "windows", "roots")}
    # Other settings (here a longer run) train on from the checkpoint instead.
    longer = run_conversion_stage("preset:tiny", tmp_path / "convert",
                                  ConversionConfig.from_dict({**CONVERT, "max_steps": 8, "corpus_roots": [str(corpus)]}))
    assert longer["resumed_from"] == 6 and longer["step"] == 8

    sft = run_sft_stage(str(tmp_path / "convert"), write_jsonl(sft_rows, tmp_path / "sft.jsonl"), tmp_path / "sft",
                        SFTConfig(**{**SFT, "max_steps": 2}))
    assert sft["step"] == 2 and sft["prediction_shift"] == 1 and sft["dropped_too_long"] == 0
    assert sft["max_length"] % 4 == 0 and sft["samples"] == 5


def test_every_stage_writes_the_one_checkpoint_format(tmp_path, sft_rows, pair_factory):
    convert = run_stage("convert", "preset:tiny", tmp_path / "convert",
                        config={**CONVERT, "max_steps": 2, "corpus_roots": [str(_code_folder(tmp_path / "c"))]})
    sft = run_stage("sft", convert["checkpoint"], tmp_path / "sft", write_jsonl(sft_rows, tmp_path / "s.jsonl"),
                    {**SFT, "max_steps": 2})
    tasks = write_jsonl([{"schedule_position": i, "task_id": f"t{i}", "pytorch_code": pair_factory(i)["pytorch_code"],
                          "difficulty": i} for i in range(2)], tmp_path / "tasks.jsonl")
    rl = run_stage("rl_end_to_end", sft["checkpoint"], tmp_path / "rl", tasks,
                   dict(samples_per_task=2, tasks_per_step=1, steps=1, max_new_tokens=8))
    layouts = []
    for result in (convert, sft, rl):
        step_dir = Path(result["checkpoint"])
        assert (step_dir.parent / "latest").read_text() == step_dir.name
        files = {p.name for p in step_dir.iterdir()}
        layouts.append({name for name in files if not name.startswith(("tokenizer", "special_tokens", "vocab",
                                                                          "merges", "chat_template"))})
        state = json.loads((step_dir / "trainer_state.json").read_text())
        assert state["step"] == int(step_dir.name.split("-")[1]) and "identity" in state
    assert layouts[0] == layouts[1] == layouts[2] >= {"config.json", "model.safetensors", "optimizer.pt", "rng.pt",
                                                      "trainer_state.json", "metrics.jsonl"}
