"""The GPU training run's CPU dry run: a tiny random model goes through every phase (convert, SFT, both RL stages,
an evaluation after each) within its budget, and OUT holds only JSON and logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dice_pipeline.prompts import format_kernel_response, kernel_generation_messages
from training.stages import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _data_dir(path: Path, pair_factory) -> Path:
    pairs = [pair_factory(i) for i in range(10)]
    write_jsonl([{"sample_id": f"s{i}", "prompt_messages": json.dumps(kernel_generation_messages(p["pytorch_code"])),
                  "response": format_kernel_response(p["generated_code"]), "pytorch_code": p["pytorch_code"]}
                 for i, p in enumerate(pairs)], path / "sft_samples.jsonl")
    write_jsonl([{"task_id": f"s{i}", "prompt_messages": json.dumps([{"role": "user", "content": "fill in"}]),
                  "pytorch_code": p["pytorch_code"], "prefix": "import torch\n", "suffix": "\nclass ModelNew: pass\n",
                  "difficulty": i % 3} for i, p in enumerate(pairs)], path / "infilling_tasks.jsonl")
    pool = pairs + [pair_factory(10), pair_factory(11)]  # two references CuKe does not hold
    write_jsonl([{"schedule_position": i, "task_id": f"t{i}", "pytorch_code": p["pytorch_code"], "difficulty": i}
                 for i, p in enumerate(pool)], path / "end_to_end_tasks.jsonl")
    write_jsonl([{"level": 1, "problem_id": i, "name": f"{i}_relu", "code": p["pytorch_code"]}
                 for i, p in enumerate(pairs[:3])], path / "kernelbench_tasks.jsonl")
    return path


def test_tiny_dry_run_goes_through_every_stage_and_writes_only_results(tmp_path, pair_factory):
    data = _data_dir(tmp_path / "data", pair_factory)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_pipeline_gpu.py"), str(out),
                           "--data", str(data), "--tiny", "--budget-s", "60", "--work-dir", str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == [] and results["device"] == "cpu"
    assert [name for name, phase in results["phases"].items() if not phase["ok"]] == []
    assert set(results["evaluations"]) == {"base", "sft", "rl_infilling", "rl_end_to_end"}
    for evaluation in results["evaluations"].values():
        assert evaluation["heldout_cuke"]["tasks"] == 4 and evaluation["kernelbench_l1"]["tasks"] == 2
        assert 0.0 <= evaluation["kernelbench_l1"]["compile_rate"] <= 1.0
    # Held out: 2 of the 10 CuKe samples (a fifth) + the 2 pool references CuKe lacks; none of them trained on.
    assert results["data_counts"] == {"sft_train": 8, "heldout_cuke": 4, "heldout_from_sft": 2, "infilling_train": 8,
                                      "end_to_end_train": 8, "kernelbench_l1_sample": 2}
    assert results["sft"]["step"] > 0
    assert results["rl_infilling"]["steps"] and results["rl_end_to_end"]["reward"] == "static"
    assert results["elapsed_s"] < 60 + 45
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size < 16 * 2**20 for p in files)
    assert not any(p.suffix in (".safetensors", ".pt", ".bin") for p in files)
    assert len((out / "generations.jsonl").read_text().splitlines()) == 4 * (4 + 2)


def test_sft_only_run_decodes_its_checkpoint_on_kernel_files_it_never_trained_on(tmp_path, pair_factory):
    from dice_pipeline.seed_corpus import load_seed_pairs

    data = _data_dir(tmp_path / "data", pair_factory)
    out = tmp_path / "out"
    # The conversion step first: continued training on CUDA source files (here a few written for the test).
    corpus = tmp_path / "cuda_corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"k{i}.cuh").write_text("".join(
            f"__global__ void scale{i}_{j}(const float* x, float* y, int n) {{\n"
            f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] * {j}.0f;\n}}\n"
            for j in range(30)))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_pipeline_gpu.py"), str(out),
                           "--data", str(data), "--tiny", "--budget-s", "120", "--stages", "sft", "--sft-seconds",
                           "4", "--decode-benchmark", "--work-dir", str(tmp_path / "work"),
                           "--convert-seconds", "3", "--convert-corpus", str(corpus), "--convert-window", "64"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == [] and set(results["evaluations"]) == {"base", "sft"}
    convert = results["convert"]
    assert convert["files"] == 6 and convert["roots"] == [str(corpus.resolve())] and convert["windows"] > 0
    assert convert["steps"] > 0 and convert["tokens"] > 0 and convert["loss_last20"] < convert["loss_first"]
    assert results["phases"]["rl_infilling"]["skipped"] and results["phases"]["rl_end_to_end"]["skipped"]
    assert results["phases"]["sft"]["ok"] and results["phases"]["decode_benchmark"]["ok"]
    # The SFT's answers are the factory's candidate files; the 2 held-out samples' files differ from the 8 trained
    # (their scale constant), and no seed corpus candidate is one of them.
    prompts = results["decode_prompts"]
    assert prompts["heldout_cuke"] == 2 and prompts["seed_not_in_sft"] == len(load_seed_pairs())
    trained = {json.loads(line)["response"] for line in
               (tmp_path / "work" / "data" / "sft_train.jsonl").read_text().splitlines()}
    for path in Path(prompts["folder"]).glob("*.py"):
        assert not any(path.read_text() in response for response in trained)
    decode = json.loads((out / "decode_throughput.json").read_text())
    assert "all held out" in decode["corpus"] and decode["results"]
