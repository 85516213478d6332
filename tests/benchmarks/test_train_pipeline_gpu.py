"""The GPU training run's CPU dry run: a tiny random model goes through every phase (conversion, SFT, the decoding
benchmark, the level-1 answers judged in the background, RL stage 1) within its budget, Exec is split by the family
groups given, OUT holds only JSON and logs, and the same command again resumes instead of starting over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dice_pipeline.prompts import format_kernel_response, kernel_generation_messages
from training.data import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _data_dir(path: Path, pair_factory) -> Path:
    pairs = [pair_factory(i) for i in range(10)]
    write_jsonl([{"sample_id": f"s{i}", "prompt_messages": json.dumps(kernel_generation_messages(p["pytorch_code"])),
                  "response": "<think>plan</think>" + format_kernel_response(p["generated_code"]),
                  "pytorch_code": p["pytorch_code"]} for i, p in enumerate(pairs)], path / "sft_samples.jsonl")
    write_jsonl([{"task_id": f"s{i}", "prompt_messages": json.dumps([{"role": "user", "content": "fill in"}]),
                  "pytorch_code": p["pytorch_code"], "prefix": "import torch\n", "suffix": "\nclass ModelNew: pass\n",
                  "difficulty": i % 3} for i, p in enumerate(pairs)], path / "infilling_tasks.jsonl")
    # Three level-1 tasks; the first two are also CuKe references (the run must not train on them), the third not.
    tasks = [pairs[0], pairs[1], pair_factory(12)]
    write_jsonl([{"level": 1, "problem_id": i + 1, "name": f"{i + 1}_relu", "code": p["pytorch_code"]}
                 for i, p in enumerate(tasks)], path / "kernelbench_tasks.jsonl")
    return path


def _corpus(path: Path) -> Path:
    path.mkdir()
    for i in range(6):
        (path / f"k{i}.cuh").write_text("".join(
            f"__global__ void scale{i}_{j}(const float* x, float* y, int n) {{\n"
            f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] * {j}.0f;\n}}\n"
            for j in range(30)))
    return path


def _run(out: Path, data: Path, tmp_path: Path, *extra: str) -> dict:
    command = [sys.executable, str(ROOT / "benchmarks" / "train_pipeline_gpu.py"), str(out), "--data", str(data),
               "--tiny", "--budget-s", "200", "--work-dir", str(tmp_path / "work"), "--convert-seconds", "3",
               "--convert-corpus", str(tmp_path / "corpus"), "--convert-window", "64", "--sft-seconds", "4",
               "--rl-steps", "1", "--decode-budget-s", "150", *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def test_tiny_dry_run_goes_through_every_phase_splits_exec_by_family_and_writes_only_results(tmp_path,
                                                                                            pair_factory):
    data = _data_dir(tmp_path / "data", pair_factory)
    _corpus(tmp_path / "corpus")
    families = tmp_path / "families.json"
    families.write_text(json.dumps({"L1/1_relu": "elementwise", "2_relu": "reduction"}))
    results = _run(tmp_path / "out", data, tmp_path, "--family-of", str(families), "--held-out-families",
                   "reduction")
    assert results["errors"] == [] and results["device"] == "cpu"
    assert [name for name, phase in results["phases"].items() if not phase["ok"]] == []
    assert list(results["phases"]) == ["data", "convert", "sft", "decode_benchmark", "kernelbench_generate",
                                       "rl_infilling", "kernelbench_record"]
    counts = results["data_counts"]
    assert counts["sft_rows_equal_to_a_kernelbench_task"] == 2 and counts["sft_train"] == 8
    assert counts["kernelbench_by_group"] == {"held_out": 1, "no_family": 1, "seen": 1}

    convert, sft = results["convert"], results["sft"]
    assert convert["files"] == 6 and convert["step"] > 0 and convert["loss_curve"]
    assert convert["prediction_shift"] == 1 and sft["prediction_shift"] == 1  # the conversion's, kept by SFT
    assert sft["step"] > 0 and sft["samples"] + sft["dropped_too_long"] == 8 and sft["max_length"] % 4 == 0

    decode = results["decode"]["by_batch"]
    assert set(decode) == {"1", "2"} and all(0 <= b["dynamic_same_token_as_static"] <= 1 for b in decode.values())

    kernelbench = results["kernelbench"]
    assert kernelbench["generation"]["answered"] == 3 and kernelbench["executed"] is False
    overall = kernelbench["overall"]["1e-2"]
    assert overall["n_tasks"] == 3 and overall["n_missing"] == 0 and 0.0 <= overall["exec_rate"] <= 1.0
    assert {g: m["1e-2"]["n_tasks"] for g, m in kernelbench["by_group"].items()} == {"held_out": 1, "no_family": 1,
                                                                                      "seen": 1}
    lines = [json.loads(line) for line in (tmp_path / "out" / "kernelbench_results.jsonl").read_text().splitlines()]
    assert {(line["task"], line["group"]) for line in lines} == {("L1/1_relu", "seen"), ("L1/2_relu", "held_out"),
                                                                 ("L1/3_relu", "no_family")}
    assert all(line["status"] for line in lines)  # every answer judged (static checks only on a CPU)

    rl = results["rl_infilling"]
    assert rl["step"] == 1 and rl["reward"] == "static" and rl["steps"][0]["status_counts"]

    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"results.json", "log.txt", "kernelbench_results.jsonl",
                                       "decode_throughput.json"}
    assert not any(p.suffix in (".safetensors", ".pt", ".bin") for p in files)


def test_the_same_command_again_resumes_every_phase(tmp_path, pair_factory):
    data = _data_dir(tmp_path / "data", pair_factory)
    _corpus(tmp_path / "corpus")
    first = _run(tmp_path / "first", data, tmp_path)
    again = _run(tmp_path / "again", data, tmp_path)
    assert again["errors"] == []
    # The conversion and SFT had spent their time boxes: resumed, nothing more trained, the same checkpoints.
    assert again["convert"]["resumed_from"] == first["convert"]["step"] == again["convert"]["step"]
    assert again["sft"]["checkpoint"] == first["sft"]["checkpoint"]
    assert again["sft"]["resumed_from"] == first["sft"]["step"]
    # The level-1 answers are reused, not generated again.
    assert again["kernelbench"]["generation"]["generated_now"] == 0
    assert first["kernelbench"]["generation"]["generated_now"] == 3
