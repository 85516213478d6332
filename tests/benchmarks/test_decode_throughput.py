"""benchmarks/decode_throughput.py, run as its CPU dry run (tiny model, few tokens): the numbers are meaningless
here, the plumbing is what is checked (batch 1 over several prompts, the sweep, the self-scored continuation loss,
the JSON the GPU runs are recorded from)."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "decode_throughput.py"


def test_cpu_dry_run_writes_every_measurement(tmp_path):
    out = tmp_path / "decode.json"
    corpus = Path(__import__("transformers").__file__).parent
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--train-seconds", "2",
               "--corpus", str(corpus), "--corpus-mb", "0.3", "--new-tokens", "8", "--batch-sizes", "1", "2",
               "--batch1-prompts", "3", "--repeats", "1", "--vocab-size", "512", "--window", "128",
               "--sweep-thresholds", "0.5", "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())

    rows = {(r["batch"], r["decoder"]): r for r in report["results"]}
    assert set(rows) == {(b, d) for b in (1, 2) for d in ("autoregressive", "static", "dynamic")}
    # Batch 1 decodes 3 prompts one after another. The random model predicts in place (no next-token head), so its
    # autoregressive decoding is one-token blocks: a forward per token, plus the prompt's prefill.
    assert rows[(1, "autoregressive")]["forwards"] == 3 * (8 + 1)
    assert rows[(2, "autoregressive")]["forwards"] == 8 + 1
    for row in report["results"]:
        assert math.isfinite(row["continuation_loss"]) and row["continuation_loss"] >= 0
    # The score depends on the tokens only: where static and dynamic decoding wrote the same tokens, equal scores.
    for ratio in report["ratios"]:
        assert ratio["true_continuation_loss"] is None or ratio["true_continuation_loss"] >= 0
        if ratio["agreement"]["dynamic=static"] == 1.0:
            static, dynamic = rows[(ratio["batch"], "static")], rows[(ratio["batch"], "dynamic")]
            assert static["continuation_loss"] == dynamic["continuation_loss"]
    (sweep,) = report["threshold_sweep"]
    assert sweep["threshold"] == 0.5 and math.isfinite(sweep["continuation_loss"])
    assert 0 < sweep["tokens_per_forward"] <= 4


def run_dry(tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    corpus = Path(__import__("transformers").__file__).parent
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--corpus", str(corpus), "--corpus-mb", "0.3",
               "--new-tokens", "8", "--batch-sizes", "1", "--batch1-prompts", "2", "--repeats", "1",
               "--window", "128", "--sweep-thresholds", "--json", str(out), *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


def test_init_from_a_saved_checkpoint_decodes_what_was_saved(tmp_path):
    trained = run_dry(tmp_path, "trained", "--preset", "tiny", "--vocab-size", "512", "--train-seconds", "2",
                      "--save-model", str(tmp_path / "model"))
    loaded = run_dry(tmp_path, "loaded", "--init-from", str(tmp_path / "model"), "--train-seconds", "0")
    assert loaded["train_steps"] == 0 and "pretrained" in loaded["model"]
    # Same weights, same tokenizer, same held-out prompts: every decoder writes (and scores) the same continuation.
    def scores(report: dict) -> dict:
        return {r["decoder"]: r["continuation_loss"] for r in report["results"]}

    assert scores(loaded) == scores(trained)


def test_kernelbench_prompts_are_the_evaluations_chat_prompts_all_held_out(tmp_path, pair_factory):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"level": 1, "problem_id": i + 1, "name": f"{i + 1}_op",
                                         "code": pair_factory(i)["pytorch_code"]}) + "\n" for i in range(3)))
    report = run_dry(tmp_path, "kernelbench", "--preset", "tiny", "--vocab-size", "512", "--train-seconds", "1",
                     "--kernelbench-prompts", str(tasks), "--batch-sizes", "1", "2")
    assert "chat prompts of 3 KernelBench level-1 tasks" in report["corpus"] and "all held out" in report["corpus"]
    assert {(r["batch"], r["decoder"]) for r in report["results"]} == {
        (b, d) for b in (1, 2) for d in ("autoregressive", "static", "dynamic")}
    assert report["true_continuation_loss"] == {}  # a chat prompt has no file continuation to compare with
