"""The staged recipe end to end on one GPU, time-boxed: SmolLM2-135M-Instruct (GGUF) converted to block diffusion,
evaluated, then block-diffusion SFT on CuKe, BiC-RL stage 1 (kernel infilling) and stage 2 (end-to-end, easy->hard),
with an evaluation after each stage: compile rate, correctness and deceptive rate of the generated kernels on held-out
CuKe tasks and on a sample of KernelBench level 1 (greedy, static decoding, block 4, 4 steps, a short
--max-new-tokens to fit the budget), judged by `dice_pipeline.verify.verify_batch` on the GPU. Each evaluation's
kernels are judged in the background while the next stage trains (builds run on the CPU cores).

Inputs are files (the GPU image has no DuckDB): `dice export-training-data DATA_DIR` writes sft_samples.jsonl,
infilling_tasks.jsonl, end_to_end_tasks.jsonl and kernelbench_tasks.jsonl there. Held-out CuKe tasks (a seeded
hash split of the SFT samples) are kept out of SFT and both RL stages.

Writes to OUT_DIR (no checkpoints: those stay in --work-dir): results.json (rewritten after every phase, so a kill
leaves what was done), generations.jsonl, log.txt, and decode_throughput.json with --decode-benchmark.

    dice run --verdict-store benchmarks/results/h200_verdict_store   # CuKe at 2.0 with the H200 verdicts (31 samples)
    dice export-training-data training_data                          # 1.8 MB: carry it (git-ignored)
    python3 benchmarks/train_pipeline_gpu.py OUT --data training_data --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf \
        --budget-s 540 --work-dir /tmp/dice_train_work                # H200: ~9.5 min (the budget + start-up)
    python3 benchmarks/train_pipeline_gpu.py OUT --data DIR --tiny --budget-s 60  # CPU dry run, tiny random model

`--convert-seconds S` first trains the converted base for S seconds on local CUDA/C++ source (SDAR's conversion
step, block-diffusion loss on every token; by default the CUDA toolkit's headers and PyTorch's kernel headers,
training/corpus.py, about 24 MB, none of them a CuKe answer or a decode prompt), so that SFT starts from a model
that knows the language of kernel files, not from the autoregressive one:

    python3 benchmarks/train_pipeline_gpu.py OUT --data training_data --gguf ... --stages sft --convert-seconds 600 \
        --sft-seconds 240 --decode-benchmark --budget-s 1080       # decoding speed on a trained checkpoint

The GGUF needs the `gguf` package (and `accelerate`), as for `benchmarks/gpu_suite.sh OUT decode-smollm2`. The SFT
checkpoint stays in --work-dir for a second call: `python3 benchmarks/decode_throughput.py --init-from
/tmp/dice_train_work/sft/$(cat /tmp/dice_train_work/sft/latest) --train-seconds 0 --json OUT/decode_sft.json`, or
`--decode-benchmark` runs it within --budget-s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dice_pipeline.prompts import extract_code_block, kernel_generation_messages  # noqa: E402
from training import stages  # noqa: E402

COMPILED_STATUSES = {"runtime_error", "timeout", "incorrect", "deceptive", "correct", "not_executed"}


class Run:
    """The run's clock, log and results file: every phase records into `results` and rewrites results.json."""

    def __init__(self, out_dir: Path, budget_s: float) -> None:
        self.out_dir = out_dir
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.results: dict = {"budget_s": budget_s, "phases": {}, "evaluations": {}, "errors": []}
        self.log_file = open(out_dir / "log.txt", "a", buffering=1)
        self.lock = threading.RLock()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        line = f"[{self.elapsed():7.1f}s] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")

    def save(self) -> None:
        with self.lock:  # the judging threads save too
            self.results["elapsed_s"] = round(self.elapsed(), 1)
            (self.out_dir / "results.json.partial").write_text(json.dumps(self.results, indent=1, default=str))
            os.replace(self.out_dir / "results.json.partial", self.out_dir / "results.json")

    def phase(self, name: str, function, *args, **kwargs):
        """Run one phase; a failure is recorded (with its traceback in the log) and the run goes on."""
        self.log(f"== {name} ({self.left():.0f} s left)")
        started = time.monotonic()
        try:
            value = function(*args, **kwargs)
            self.results["phases"][name] = {"seconds": round(time.monotonic() - started, 1), "ok": True}
            return value
        except Exception as exc:  # noqa: BLE001 - record and continue: the run must end with its results written
            self.log(traceback.format_exc())
            self.results["phases"][name] = {"seconds": round(time.monotonic() - started, 1), "ok": False,
                                            "error": f"{type(exc).__name__}: {exc}"}
            self.results["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.save()


# ------------------------------------------------------------------------------------------------------------ data
def _stable_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def strip_reasoning(response: str) -> str:
    """The answer without its <think>...</think> trace: with a few hundred tokens to answer in, the model must
    learn to write the kernel file first."""
    return re.sub(r"^\s*<think>.*?</think>\s*", "", response, flags=re.DOTALL)


def split_data(data_dir: Path, heldout: int, kernelbench_sample: int, out: Path, keep_reasoning: bool) -> dict:
    """Files for the stages and the two evaluation sets. Held-out CuKe-like tasks: up to a fifth of the CuKe SFT
    samples, topped up to `heldout` with end-to-end pool references CuKe does not hold (seeded hash order); every
    held-out reference is removed from SFT and both RL stages."""
    sft = stages.read_rows(data_dir / "sft_samples.jsonl")
    if not sft:
        raise ValueError(f"{data_dir}/sft_samples.jsonl is empty: run `dice run` then `dice export-training-data`")
    pool = _rows(data_dir / "end_to_end_tasks.jsonl")
    ranked = sorted(sft, key=lambda r: _stable_hash(str(r.get("sample_id", r["pytorch_code"]))))
    held = [(f"cuke:{r.get('sample_id')}", r["pytorch_code"]) for r in ranked[:min(heldout, max(1, len(sft) // 5))]]
    sft_code = {r["pytorch_code"] for r in sft}
    pool_only = sorted((r for r in pool if r["pytorch_code"] not in sft_code),
                       key=lambda r: _stable_hash(str(r["task_id"])))
    held += [(f"pool:{r['task_id']}", r["pytorch_code"]) for r in pool_only[:max(0, heldout - len(held))]]
    held_code = {code for _, code in held}
    train = [r for r in sft if r["pytorch_code"] not in held_code]
    if not keep_reasoning:
        train = [{**r, "response": strip_reasoning(r["response"])} for r in train]
    infilling = [r for r in _rows(data_dir / "infilling_tasks.jsonl") if r["pytorch_code"] not in held_code]
    end_to_end = [r for r in pool if r["pytorch_code"] not in held_code]
    kernelbench = [r for r in _rows(data_dir / "kernelbench_tasks.jsonl") if int(r.get("level", 1)) == 1]
    kernelbench = sorted(kernelbench, key=lambda r: _stable_hash(str(r.get("task_id", r.get("name", "")))))
    kernelbench = kernelbench[:kernelbench_sample]
    paths = {"sft": stages.write_jsonl(train, out / "sft_train.jsonl"),
             "infilling": stages.write_jsonl(infilling, out / "infilling_train.jsonl"),
             "end_to_end": stages.write_jsonl(end_to_end, out / "end_to_end_train.jsonl")}
    evaluation = {"heldout_cuke": held,
                  "kernelbench_l1": [(f"kb:{r.get('task_id', r.get('name'))}", _kernelbench_code(r))
                                     for r in kernelbench]}
    counts = {"sft_train": len(train), "heldout_cuke": len(held),
              "heldout_from_sft": sum(name.startswith("cuke:") for name, _ in held),
              "infilling_train": len(infilling), "end_to_end_train": len(end_to_end),
              "kernelbench_l1_sample": len(kernelbench)}
    return {"paths": paths, "evaluation": evaluation, "counts": counts}


def decode_prompt_files(data_dir: Path, train_path: Path, out: Path) -> dict:
    """Kernel files no SFT step saw, as .py files under `out` (decode_throughput.py --prompt-corpus): the held-out
    CuKe samples' answers and the seed corpus's candidates whose file is not an SFT answer (those the filter kept
    out: slower, wrong or deceptive). Prompts from the domain the checkpoint was trained on, never from its data."""
    from dice_pipeline.seed_corpus import load_seed_pairs

    train_rows = stages.read_rows(train_path)
    trained = {extract_code_block(r["response"]) or r["response"] for r in train_rows}
    trained_references = {r["pytorch_code"] for r in train_rows}
    files: dict[str, str] = {}
    for row in stages.read_rows(data_dir / "sft_samples.jsonl"):
        code = extract_code_block(row["response"]) or ""
        if row["pytorch_code"] not in trained_references and code and code not in trained:
            files[f"heldout_cuke_{_stable_hash(row['pytorch_code'])[:12]}"] = code
    for pair in load_seed_pairs():
        if pair["generated_code"] not in trained:
            files[f"seed_{pair['problem_name']}"] = pair["generated_code"]
    out.mkdir(parents=True, exist_ok=True)
    for name, code in files.items():
        (out / f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}.py").write_text(code)
    return {"files": len(files), "heldout_cuke": sum(n.startswith("heldout_cuke_") for n in files),
            "seed_not_in_sft": sum(n.startswith("seed_") for n in files), "folder": str(out)}


def _rows(path: Path) -> list[dict]:
    return stages.read_rows(path) if path.is_file() else []


def _kernelbench_code(row: dict) -> str:
    for key in ("code", "pytorch_code", "ref_arch_src", "source"):
        if isinstance(row.get(key), str):
            return row[key]
    raise KeyError(f"KernelBench row without code: {sorted(row)}")


# ------------------------------------------------------------------------------------------------------ evaluation
def generate_kernels(checkpoint: str, tasks: list[tuple[str, str]], max_new_tokens: int, batch_size: int) -> list:
    """One greedy answer per task: static decoding, block 4, 4 steps (DICE's evaluation), EOS stops."""
    from training.generate import block_diffusion_generate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = stages.load_base(checkpoint)
    model.to(device).eval()
    if device.type == "cuda":
        model.to(torch.bfloat16)
    answers = []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start:start + batch_size]
        prompts = [tokenizer(tokenizer.apply_chat_template(kernel_generation_messages(code), tokenize=False,
                                                           add_generation_prompt=True),
                             add_special_tokens=False)["input_ids"] for _, code in chunk]
        result = block_diffusion_generate(model, prompts, max_new_tokens, block_size=4, steps=4, strategy="static",
                                          temperature=0.0, eos_token_id=tokenizer.eos_token_id,
                                          pad_token_id=tokenizer.pad_token_id or 0)
        for row, length in zip(result.tokens, result.lengths):
            answers.append(tokenizer.decode(row[:int(length)].tolist(), skip_special_tokens=True))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return answers


def judge(jobs: list[tuple[str, str, str]], timeout_s: float) -> dict:
    """Verdict summaries by job id (verify_batch in its isolated workers); jobs unfinished at the timeout are
    recorded as `unjudged_timeout`, never as a candidate failure."""
    from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch

    finished: dict[str, dict] = {}
    # Timing is not what is measured here (a few samples keep `correct` verdicts cheap); no nvcc builds on a
    # GPU-less host (the dry run): those take minutes a candidate there and prove nothing the GPU run does not.
    config = VerifyConfig(timing_samples=10, timing_max_samples=20, timing_budget_s=1.0, build_without_gpu=False,
                          compile_timeout_s=max(30.0, timeout_s), run_timeout_s=120.0)

    def collect(job, verdict) -> None:
        finished[job.job_id] = {"status": getattr(verdict.status, "value", verdict.status),
                                "reasons": list(verdict.reason_codes()),
                                "speedup": getattr(verdict, "speedup", None)}

    def run() -> None:
        try:
            for job, verdict in zip(batch, verify_batch(batch, config, on_result=collect)):
                collect(job, verdict)
        except Exception as exc:  # noqa: BLE001 - the judge failed: recorded per job below
            failure.append(f"{type(exc).__name__}: {exc}")

    batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
    failure: list[str] = []
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    unjudged = {"status": "unjudged_timeout" if thread.is_alive() else "infrastructure_error",
                "reasons": failure[:1]}
    return {job.job_id: finished.get(job.job_id, unjudged) for job in batch}


def summarize(rows: list[dict]) -> dict:
    """Rates over all tasks of a set: a task without a code block counts as not compiled and not correct."""
    n = len(rows)
    statuses: dict[str, int] = {}
    deceptive_reasons: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        if row["status"] == "deceptive":
            for reason in row.get("reasons") or ["unspecified"]:
                deceptive_reasons[reason] = deceptive_reasons.get(reason, 0) + 1
    judged = n - statuses.get("unjudged_timeout", 0) - statuses.get("infrastructure_error", 0)
    compiled = sum(statuses.get(s, 0) for s in COMPILED_STATUSES)
    return {"tasks": n, "judged": judged, "with_code": sum(1 for r in rows if r["has_code"]),
            "compile_rate": compiled / n if n else None,
            "correct_rate": statuses.get("correct", 0) / n if n else None,
            "deceptive_rate": statuses.get("deceptive", 0) / n if n else None,
            "statuses": statuses, "deceptive_by_reason": deceptive_reasons}


class Evaluations:
    """Generate now (on the GPU, between stages); judge in a background thread while the next stage trains."""

    def __init__(self, run: Run, evaluation: dict, args) -> None:
        self.run, self.evaluation, self.args = run, evaluation, args
        self.threads: list[threading.Thread] = []
        self.generations = open(run.out_dir / "generations.jsonl", "a", buffering=1)

    def evaluate(self, label: str, checkpoint: str) -> None:
        if self.run.left() < 0:
            raise TimeoutError(f"no time left to evaluate {label} ({self.run.left():.0f} s)")
        tasks = [(name, job_id, code) for name, items in self.evaluation.items() for job_id, code in items]
        answers = generate_kernels(checkpoint, [(job_id, code) for _, job_id, code in tasks],
                                   self.args.max_new_tokens, self.args.eval_batch_size)
        rows, jobs = [], []
        for (name, job_id, code), answer in zip(tasks, answers):
            candidate = extract_code_block(answer)
            rows.append({"set": name, "job_id": f"{label}/{job_id}", "has_code": candidate is not None})
            if candidate is not None:
                jobs.append((f"{label}/{job_id}", code, candidate))
            self.generations.write(json.dumps({"stage": label, "set": name, "task": job_id,
                                               "answer": answer[:6000]}) + "\n")
        self.run.log(f"{label}: {len(jobs)}/{len(rows)} answers hold a code block; judging in the background")

        def judge_and_record() -> None:
            verdicts = judge(jobs, timeout_s=max(30.0, self.run.left() - 15))
            for row in rows:
                row.update(verdicts.get(row["job_id"], {"status": "no_code", "reasons": ["no_code"]}))
            with self.run.lock:
                self.run.results["evaluations"][label] = {name: summarize([r for r in rows if r["set"] == name])
                                                          for name in self.evaluation}
            self.run.log(f"{label} judged: " + json.dumps(
                {n: {k: s[k] for k in ("compile_rate", "correct_rate", "deceptive_rate")}
                 for n, s in self.run.results["evaluations"][label].items()}))
            self.run.save()

        thread = threading.Thread(target=judge_and_record, daemon=True)
        thread.start()
        self.threads.append(thread)

    def wait(self) -> None:
        for thread in self.threads:
            thread.join(max(1.0, self.run.left()))


# ------------------------------------------------------------------------------------------------------- stages
def train_on_code_corpus(model, tokenizer, args, on_gpu: bool) -> dict:
    """SDAR's conversion step on `model` in place: block-diffusion training on every token of local source files
    (args.convert_corpus, else the CUDA/C++ headers of training.corpus.kernel_code_roots()) for
    args.convert_seconds. None of those files is a CuKe answer or a decode prompt (kernel files written for tasks).
    Returns what it read and how training went."""
    from training.corpus import KERNEL_CODE_SUFFIXES, PYTHON_SUFFIXES, kernel_code_roots, read_code_corpus
    from training.sft import continued_training_config, text_windows, train_block_diffusion

    started = time.monotonic()
    roots = args.convert_corpus or kernel_code_roots()
    texts = read_code_corpus(roots, int(args.convert_corpus_mb * 2**20), min_chars=1000,
                             suffixes=KERNEL_CODE_SUFFIXES + PYTHON_SUFFIXES)
    windows = text_windows(tokenizer, texts, args.convert_window)
    if not windows:
        raise ValueError(f"no {args.convert_window}-token window in the conversion corpus under "
                         f"{', '.join(map(str, roots))}")
    read_s = time.monotonic() - started
    device = torch.device("cuda" if on_gpu else "cpu")
    model.to(device).train()
    history = train_block_diffusion(model, windows, continued_training_config(
        args.convert_lr, args.convert_seconds, args.convert_window))
    model.to("cpu").eval()
    tokens = sum(r["clean_tokens"] for r in history)
    last = history[-20:]
    return {"roots": [str(r) for r in roots], "files": len(texts),
            "mib": round(sum(map(len, texts)) / 2**20, 2), "windows": len(windows), "window": args.convert_window,
            "steps": len(history), "tokens": tokens,
            "epochs": round(tokens / (len(windows) * args.convert_window), 3),
            "loss_first": round(history[0]["loss"], 4),
            "loss_last20": round(sum(r["loss"] for r in last) / len(last), 4),
            "loss_curve": [(r["step"], round(r["loss"], 4)) for r in history[:: max(1, len(history) // 50)]],
            "read_seconds": round(read_s, 1), "train_seconds": round(history[-1]["seconds"], 1)}


def stage_seconds(run: Run, share: float, reserve: float) -> float:
    """This stage's time box: its share of what is left after the reserve (evaluations and judging to come)."""
    return max(5.0, (run.left() - reserve) * share)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="results folder (JSON + logs only, no checkpoints)")
    parser.add_argument("--data", type=Path, default=ROOT / "training_data", help="dice export-training-data folder")
    parser.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct.Q4_1.gguf (or a checkpoint)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: a tiny random model, a few steps")
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--work-dir", type=Path, default=None, help="checkpoints (default: a folder under /tmp)")
    parser.add_argument("--heldout", type=int, default=8, help="held-out CuKe tasks (at most a fifth of CuKe)")
    parser.add_argument("--kernelbench-sample", type=int, default=16, help="KernelBench level-1 tasks evaluated")
    parser.add_argument("--max-new-tokens", type=int, default=3072, help="evaluation answers (DICE: 4096)")
    parser.add_argument("--eval-batch-size", type=int, default=32)
    parser.add_argument("--sft-lr", type=float, default=3e-5, help="DICE: 1e-5 (3 epochs on 6,303 samples)")
    parser.add_argument("--rl-max-new-tokens", type=int, default=3072, help="RL rollouts (DICE: 4096)")
    parser.add_argument("--sft-max-length", type=int, default=6144, help="prompt + response tokens (DICE: 6144)")
    parser.add_argument("--sft-samples-per-step", type=int, default=4,
                        help="4 x 6144-token samples: ~40k tokens a step, ~30 GB of activations for the 135M model")
    parser.add_argument("--keep-reasoning", action="store_true",
                        help="train on the <think> traces too (default: the kernel file alone, to fit short answers)")
    parser.add_argument("--decode-benchmark", action="store_true",
                        help="then run benchmarks/decode_throughput.py on the SFT checkpoint, in --decode-budget-s "
                             "kept out of --budget-s")
    parser.add_argument("--decode-budget-s", type=float, default=150.0)
    parser.add_argument("--stages", choices=("all", "sft"), default="all",
                        help="sft: convert, SFT and its evaluation only (e.g. a longer SFT for --decode-benchmark)")
    parser.add_argument("--sft-seconds", type=float, default=None,
                        help="SFT's time box (default: its share of --budget-s)")
    parser.add_argument("--convert-seconds", type=float, default=0.0,
                        help="continued block-diffusion training of the converted base on local CUDA/C++ source "
                             "before anything else (SDAR's conversion step; counts against --budget-s)")
    parser.add_argument("--convert-corpus", type=Path, nargs="+", default=None,
                        help="folders of the conversion corpus, their CUDA/C++ and Python files (default: "
                             "training.corpus.kernel_code_roots(), the CUDA toolkit's headers and PyTorch's kernel "
                             "headers; add e.g. the transformers package's folder for Python)")
    parser.add_argument("--convert-corpus-mb", type=float, default=32.0)
    parser.add_argument("--convert-lr", type=float, default=1e-4,
                        help="peak; cosine decay to a tenth (the 2026-12-04 SmolLM2 conversion's)")
    parser.add_argument("--convert-window", type=int, default=512, help="tokens a training window")
    parser.add_argument("--decode-prompts", choices=("kernels", "python"), default="kernels",
                        help="kernels: kernel files the SFT never saw (decode_prompt_files); python: the "
                             "installed transformers package's files, as decode_throughput.py does alone")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work_dir or Path("/tmp") / f"dice_train_work_{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    decode_budget = min(args.decode_budget_s, args.budget_s / 2) if args.decode_benchmark else 0.0
    run = Run(args.out, args.budget_s - decode_budget)
    on_gpu = torch.cuda.is_available()
    run.results.update(device=torch.cuda.get_device_name(0) if on_gpu else "cpu", torch=torch.__version__,
                       tiny=args.tiny, data=str(args.data), work_dir=str(work),
                       date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not args.tiny and args.gguf is None:
        parser.error("--gguf is required unless --tiny")
    if args.tiny:
        args.kernelbench_sample, args.max_new_tokens, args.rl_max_new_tokens = min(args.kernelbench_sample, 2), 32, 16
    split = run.phase("data", split_data, args.data, args.heldout, args.kernelbench_sample, work / "data",
                      args.keep_reasoning)
    run.results["reasoning_in_sft"] = args.keep_reasoning
    if split is None:
        run.save()
        return 1
    run.results["data_counts"] = split["counts"]
    evaluations = Evaluations(run, split["evaluation"], args)
    base = "preset:tiny" if args.tiny else str(args.gguf)

    # The base: converted once (SFT loads the same spec), evaluated as converted.
    base_dir = work / "base"

    def convert() -> str:
        texts = stages.training_texts(stages.read_rows(split["paths"]["sft"]))
        model, tokenizer = stages.load_base(base, texts=texts, vocab_size=2048)
        if args.convert_seconds > 0:
            run.results["convert"] = train_on_code_corpus(model, tokenizer, args, on_gpu)
            run.log(f"convert: {run.results['convert']}")
        model.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)
        return str(base_dir)
    base_checkpoint = run.phase("convert_base", convert)
    if base_checkpoint:
        run.phase("eval_base", evaluations.evaluate, "base", base_checkpoint)

    # Time boxes: SFT gets the largest share; each RL stage a share of what is then left; a reserve stays for the
    # evaluations (generation ~10-30 s each) and the last judging.
    reserve = 0.2 * args.budget_s
    checkpoint = base_checkpoint
    if checkpoint:
        sft_config = stages.SFTStageConfig(
            learning_rate=1e-3 if args.tiny else args.sft_lr, epochs=100,
            samples_per_step=4 if args.tiny else args.sft_samples_per_step,
            max_length=1536 if args.tiny else args.sft_max_length, max_seconds=stage_seconds(run, 0.45, reserve),
            save_every=10**9, final_lr_ratio=0.1, attention_backend="dense", tokenizer_vocab_size=1024)
        if args.sft_seconds is not None:
            sft_config.max_seconds = args.sft_seconds
        result = run.phase("sft", stages.run_sft_stage, checkpoint, split["paths"]["sft"], work / "sft", sft_config,
                           resume=False, on_step=lambda r: r["step"] % 20 == 0 and run.log(f"sft {r}"))
        if result:
            run.results["sft"] = {k: v for k, v in result.items() if k != "history"}
            run.results["sft"]["loss_curve"] = [(r["step"], round(r["loss"], 4)) for r in result["history"]]
            checkpoint = result["checkpoint"]
            run.phase("eval_sft", evaluations.evaluate, "sft", checkpoint)

    reward = "verifier" if on_gpu else "static"
    verify_config = dict(timing_samples=10, timing_max_samples=20, timing_budget_s=1.0, run_timeout_s=120.0,
                         build_without_gpu=False)
    for stage, tasks_key, share in (("rl_infilling", "infilling", 0.5), ("rl_end_to_end", "end_to_end", 0.8)):
        if args.stages == "sft" or not checkpoint or not stages.read_rows(split["paths"][tasks_key]) \
                or run.left() < 0.25 * reserve:
            run.log(f"{stage}: skipped (--stages {args.stages}, no checkpoint, no tasks or no time: "
                    f"{run.left():.0f} s left)")
            run.results["phases"][stage] = {"ok": False, "skipped": True, "seconds": 0.0}
            continue
        seconds = stage_seconds(run, share, reserve)
        rl_config = dict(steps=1000, tasks_per_step=2 if args.tiny else 8, samples_per_task=2 if args.tiny else 4,
                         max_new_tokens=args.rl_max_new_tokens, learning_rate=1e-6, max_seconds=seconds,
                         checkpoint_every=10**6, rollout_batch_size=32, attention_backend="dense")
        result = run.phase(stage, stages.run_rl_stage, checkpoint, split["paths"][tasks_key], work / stage,
                           stage, rl_config, reward, verify_config, False,
                           lambda r, stage=stage: run.log(
                               f"{stage} step {r['step']}: reward {r['reward_mean']} deceptive {r['deceptive']} "
                               f"statuses {r['status_counts']} rollout/reward/update s "
                               f"{r['seconds_rollout']:.1f}/{r['seconds_reward']:.1f}/{r['seconds_update']:.1f}"),
                           reward_timeout_s=max(20.0, 0.6 * seconds))
        if result:
            keep = ("step", "reward_mean", "kl", "loss", "deceptive_share", "deceptive_by_reason", "status_counts",
                    "groups_used", "groups_dropped", "seconds_rollout", "seconds_reward", "seconds_reward_prepare",
                    "seconds_update")
            run.results[stage] = {**{k: v for k, v in result.items() if k != "history"},
                                  "steps": [{k: r.get(k) for k in keep} for r in result["history"]]}
            checkpoint = result["checkpoint"]
            run.phase(f"eval_{stage}", evaluations.evaluate, stage, checkpoint)

    run.log(f"waiting for the judging ({run.left():.0f} s left)")
    evaluations.wait()
    if args.decode_benchmark and run.results.get("sft"):
        def decode() -> int:
            # Its log goes to OUT/log.txt's neighbour only through our log: keep the file count small.
            command = [sys.executable, str(ROOT / "benchmarks" / "decode_throughput.py"), "--init-from",
                       run.results["sft"]["checkpoint"], "--train-seconds", "0", "--corpus-mb", "4",
                       "--json", str(args.out / "decode_throughput.json")]
            if args.decode_prompts == "kernels":
                prompts = decode_prompt_files(args.data, split["paths"]["sft"], work / "decode_prompts")
                run.results["decode_prompts"] = prompts
                # kernel files are shorter than library modules: 1,000 characters leave room for 128 + 256 tokens
                command += ["--prompt-corpus", prompts["folder"], "--prompt-min-chars", "1000"]
            if args.tiny:
                command += ["--device", "cpu", "--new-tokens", "16", "--batch-sizes", "1", "--repeats", "1",
                            "--corpus-mb", "0.3", "--window", "128", "--batch1-prompts", "1"]
            done = subprocess.run(command, timeout=decode_budget, capture_output=True,
                                  text=True)
            run.log(done.stdout[-4000:] + done.stderr[-2000:])
            if done.returncode != 0:
                raise RuntimeError(f"decode_throughput.py exited {done.returncode}")
            return done.returncode
        run.phase("decode_benchmark", decode)
    run.save()
    print(json.dumps({"evaluations": run.results["evaluations"], "errors": run.results["errors"],
                      "elapsed_s": run.results["elapsed_s"]}, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Judging still running past the budget (daemon threads, verifier worker pools) must not hold the exit: the
    # results are written, and what was unfinished is recorded as unjudged.
    os._exit(code)
