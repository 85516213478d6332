"""The GPU training run in one call, time-boxed by --budget-s: SmolLM2-135M-Instruct (GGUF) converted to block
diffusion keeping its prediction shift and trained on local CUDA/C++ source (SDAR's conversion step,
training/convert.py) -> block-diffusion SFT on the given CuKe (training/sft.py: over-length rows dropped, the
small-model recipe) -> the decoding benchmark on the SFT checkpoint (benchmarks/decode_throughput.py on KernelBench
chat prompts: dynamic vs autoregressive at batch 1 and 16, tokens a forward, agreement of dynamic with static
decoding; run while nothing else uses the GPU, so its timings are clean) -> all KernelBench level-1 tasks with the
paper's protocol (one greedy answer, static decoding, block 4, 4 steps; dice_pipeline.evaluation), judged by the
verifier in the background while -> a few steps of BiC-RL stage 1 (kernel infilling, the verifier's reward) train.
Exec is reported overall and split by the families SFT saw and those held out (--family-of, --held-out-families).

Inputs are files (the GPU image has no DuckDB): `dice export-training-data DATA_DIR` writes sft_samples.jsonl,
infilling_tasks.jsonl (and end_to_end_tasks.jsonl, kernelbench_tasks.jsonl) there; --sft-jsonl, --infilling-jsonl
and --kernelbench-tasks name other files. OUT receives results.json (rewritten after every phase, so a kill leaves
what was done), log.txt, kernelbench_results.jsonl (one line per task) and decode_throughput.json. Checkpoints and
the evaluation's state stay in --work-dir (default .cache/train_pipeline_gpu in the checkout, kept between calls on a
warm machine): the same command again resumes every phase where it stopped (a finished conversion or SFT is only
re-saved, generated answers and verdicts are reused) and judges what the first call left unjudged.

    python3 benchmarks/train_pipeline_gpu.py OUT --data training_data --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf \
        --budget-s 570 --family-of families.json --held-out-families fam_a fam_b
    python3 benchmarks/train_pipeline_gpu.py OUT --data DIR --tiny --budget-s 120   # CPU dry run, tiny random model

The GGUF needs the `gguf` package (and `accelerate`); any Llama/Qwen2/Qwen3 GGUF converts (a Qwen2.5-Coder one:
benchmarks/fetch_qwen_coder_gguf.py, RESULTS.md). Phase time boxes default to shares of --budget-s
(--convert-seconds 20 %, --sft-seconds 20 % of training time each, --decode-budget-s 14 %, --eval-generate-s 12 %);
RL stage 1 then gets what is left but 45 s (--rl-seconds caps it) while the level-1 answers are judged beside it,
and the judging ends 15 s before the budget. A second call finds the conversion and SFT done (their time boxes
spent), the decoding measured and the answers generated, so its budget goes to judging and RL.
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

from dice_pipeline.evaluation.evaluate import can_execute, evaluation_verify_config, verifier_judge  # noqa: E402
from dice_pipeline.evaluation.generation import CheckpointGenerator, EvalGenerationSettings  # noqa: E402
from dice_pipeline.evaluation.metrics import evaluation_metrics, status_value  # noqa: E402
from dice_pipeline.evaluation.runner import run_evaluation  # noqa: E402
from dice_pipeline.kernelbench import load_kernelbench_tasks  # noqa: E402
from dice_pipeline.paths import kernelbench_tasks_path  # noqa: E402
from training.convert import ConversionConfig, load_base, run_conversion_stage  # noqa: E402
from training.data import read_rows, training_texts, write_jsonl  # noqa: E402
from training.rl import run_rl_stage  # noqa: E402
from training.sft import SFTConfig, run_sft_stage  # noqa: E402

# Shares of --budget-s for the phases not given their own seconds (~70 %: the conversion's and SFT's are training
# time, their loading comes on top); RL then takes what is left but 45 s, while the answers are judged beside it.
SHARES = {"convert": 0.2, "sft": 0.2, "decode": 0.14, "generate": 0.12}
# Candidates are judged for correctness; a few timing samples keep `correct` verdicts cheap (fast_p is indicative).
FAST_VERIFY = dict(timing_samples=10, timing_max_samples=20, timing_budget_s=1.0, run_timeout_s=120.0)


class Run:
    """The run's clock, log and results file: every phase records into `results` and rewrites results.json."""

    def __init__(self, out_dir: Path, budget_s: float) -> None:
        self.out_dir = out_dir
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.results: dict = {"budget_s": budget_s, "phases": {}, "errors": []}
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
        with self.lock:  # the judging thread saves too
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

    def skip(self, name: str, why: str) -> None:
        self.log(f"== {name}: skipped ({why})")
        self.results["phases"][name] = {"seconds": 0.0, "ok": False, "skipped": why}
        self.save()


# ------------------------------------------------------------------------------------------------------------ data
def strip_reasoning(response: str) -> str:
    """The answer without its <think>...</think> trace: with a few thousand tokens to answer in, the model must learn
    to write the kernel file first."""
    return re.sub(r"^\s*<think>.*?</think>\s*", "", response, flags=re.DOTALL)


def prepare_data(args, work: Path) -> dict:
    """The SFT rows (reasoning stripped unless --keep-reasoning; any row whose reference IS a KernelBench level-1
    task dropped, a last guard against training on the test), the infilling tasks, and the level-1 tasks."""
    sft_path = args.sft_jsonl or args.data / "sft_samples.jsonl"
    rows = read_rows(sft_path)
    if not rows:
        raise ValueError(f"{sft_path} is empty: run `dice run` then `dice export-training-data`")
    tasks_file = args.kernelbench_tasks or (args.data / "kernelbench_tasks.jsonl"
                                            if (args.data / "kernelbench_tasks.jsonl").is_file()
                                            else kernelbench_tasks_path())
    if tasks_file is None:
        raise FileNotFoundError("no KernelBench tasks: pass --kernelbench-tasks or set DICE_KERNELBENCH_TASKS")
    tasks = load_kernelbench_tasks(tasks_file, levels=[1]).tasks
    if args.kernelbench_limit:
        tasks = tasks[:args.kernelbench_limit]
    task_code = {task.code.strip() for task in tasks}
    kept = [r for r in rows if str(r.get("pytorch_code", "")).strip() not in task_code]
    if not args.keep_reasoning:
        kept = [{**r, "response": strip_reasoning(r["response"])} for r in kept]
    infilling_path = args.infilling_jsonl or args.data / "infilling_tasks.jsonl"
    infilling = [r for r in (read_rows(infilling_path) if infilling_path.is_file() else [])
                 if str(r.get("pytorch_code", "")).strip() not in task_code]
    return {"sft": write_jsonl(kept, work / "data" / "sft_train.jsonl"),
            "infilling": write_jsonl(infilling, work / "data" / "infilling_train.jsonl"),
            "sft_texts": training_texts(kept), "tasks": tasks, "tasks_file": str(tasks_file),
            "counts": {"sft_rows": len(rows), "sft_rows_equal_to_a_kernelbench_task": len(rows) - len(kept),
                       "sft_train": len(kept), "infilling_train": len(infilling), "kernelbench_l1": len(tasks)}}


def family_groups(tasks, family_of: dict[str, str], held_out: set[str]) -> dict[str, str]:
    """task key -> "held_out" / "seen" / "no_family", matching --family-of by task key (`L1/19_ReLU`) or name."""
    groups = {}
    for task in tasks:
        family = family_of.get(task.key, family_of.get(task.name))
        groups[task.key] = "no_family" if family is None else "held_out" if family in held_out else "seen"
    return groups


# ----------------------------------------------------------------------------------------------- the four stages
def convert_base(args, work: Path, data: dict, on_gpu: bool, run: Run) -> dict:
    """The base, converted and (with seconds to spend) trained on the conversion corpus: the conversion stage."""
    base = "preset:tiny" if args.tiny else str(args.gguf)
    if args.convert_seconds <= 0:  # conversion only: the AR weights as they are, the shift kept
        out = work / "base"
        model, tokenizer = load_base(base, data["sft_texts"], vocab_size=1024)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return {"checkpoint": str(out), "steps": 0, "prediction_shift": model.config.prediction_shift}
    fields = dict(max_seconds=args.convert_seconds, corpus_mb=args.convert_corpus_mb, window=args.convert_window,
                  learning_rate=args.convert_lr, save_every=10**9)
    if args.convert_corpus:
        fields["corpus_roots"] = [str(p) for p in args.convert_corpus]
    if args.tiny:
        fields.update(rows_per_step=2, warmup_steps=2, tokenizer_vocab_size=1024, min_chars=500,
                      corpus_mb=min(args.convert_corpus_mb, 0.3))
    result = run_conversion_stage(base, work / "convert", ConversionConfig(**fields), resume=True,
                                  device=torch.device("cuda" if on_gpu else "cpu"),
                                  tokenizer_texts=data["sft_texts"] if args.tiny else (),
                                  on_step=lambda r: r["step"] % 50 == 0 and run.log(f"convert {r}"))
    history = result.pop("history")
    result["loss_curve"] = [(r["step"], round(r["loss"], 4)) for r in history[::max(1, len(history) // 50)]]
    return result


def train_sft(args, work: Path, base: str, data: dict, run: Run) -> dict:
    fields = dict(max_seconds=args.sft_seconds, epochs=100, samples_per_step=args.sft_samples_per_step,
                  max_length_cap=args.sft_max_length, save_every=None, attention_backend="dense")
    if args.sft_lr is not None:
        fields["learning_rate"] = args.sft_lr
    if args.tiny:
        fields.update(learning_rate=1e-3, samples_per_step=2, max_length_cap=min(args.sft_max_length, 4096))
    result = run_sft_stage(base, data["sft"], work / "sft", SFTConfig(recipe=args.sft_recipe, **fields),
                           resume=True, on_step=lambda r: r["step"] % 20 == 0 and run.log(f"sft {r}"))
    history = result.pop("history")
    result["loss_curve"] = [(r["step"], round(r["loss"], 4)) for r in history]
    return result


def decode_benchmark(args, checkpoint: str, tasks_file: str, work: Path, run: Run) -> dict:
    """benchmarks/decode_throughput.py on the SFT checkpoint, in a child process with its own time limit; a
    checkpoint already measured (a second call) is not measured again."""
    out = args.out / "decode_throughput.json"
    kept = work / "decode" / f"{_key(checkpoint, args)}.json"
    if kept.is_file():
        run.log(f"decoding benchmark of {checkpoint}: measured by an earlier call ({kept})")
    else:
        command = [sys.executable, str(ROOT / "benchmarks" / "decode_throughput.py"), "--init-from", checkpoint,
                   "--train-seconds", "0", "--kernelbench-prompts", tasks_file, "--new-tokens",
                   str(args.decode_tokens), "--batch-sizes", "1", "16", "--repeats", "1", "--sweep-thresholds", "0.7",
                   "0.8", "--json", str(kept)]
        if args.tiny:
            command += ["--device", "cpu", "--new-tokens", "8", "--batch-sizes", "1", "2", "--batch1-prompts", "1",
                        "--sweep-thresholds", "--window", "128"]
        kept.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(command, timeout=args.decode_budget_s, capture_output=True, text=True)
        run.log(done.stdout[-4000:] + done.stderr[-2000:])
        if done.returncode != 0:
            raise RuntimeError(f"decode_throughput.py exited {done.returncode}")
    out.write_text(kept.read_text())
    report = json.loads(out.read_text())
    rows = {(r["batch"], r["decoder"]): r for r in report["results"]}
    return {"model": report["model"], "device": report["device"], "by_batch": {
        str(ratio["batch"]): {"dynamic_vs_ar": ratio["dynamic_vs_ar"], "static_vs_ar": ratio["static_vs_ar"],
                              "dynamic_tokens_per_forward": rows[(ratio["batch"], "dynamic")]["tokens_per_forward"],
                              "ar_tokens_per_s": rows[(ratio["batch"], "autoregressive")]["tokens_per_s"],
                              "dynamic_tokens_per_s": rows[(ratio["batch"], "dynamic")]["tokens_per_s"],
                              "dynamic_same_token_as_static": ratio["agreement"]["dynamic=static"]}
        for ratio in report["ratios"]}, "threshold_sweep": report["threshold_sweep"]}


class KernelBenchEval:
    """All level-1 tasks with the paper's protocol: generate now (the GPU to itself), judge in a background thread
    (builds on the CPU cores) while RL trains; the state directory keeps answers and verdicts between calls."""

    def __init__(self, run: Run, tasks, groups: dict[str, str], state_dir: Path, args) -> None:
        self.run, self.tasks, self.groups, self.state_dir, self.args = run, tasks, groups, state_dir, args
        self.config = evaluation_verify_config(build_without_gpu=False, verdict_store_dir=str(state_dir / "verdicts"),
                                               **FAST_VERIFY)
        self.executes = can_execute(self.config)
        self.thread: threading.Thread | None = None

    def generate(self, checkpoint: str, deadline: float) -> dict:
        settings = EvalGenerationSettings(decoding="block_diffusion", block_size=4, steps=4, strategy="static",
                                          max_new_tokens=self.args.max_new_tokens, temperature=0.0,
                                          batch_size=self.args.eval_batch_size)
        generator = CheckpointGenerator.from_pretrained(checkpoint, settings)
        try:
            done = run_evaluation(self.tasks, state_dir=self.state_dir, generate=generator,
                                  judge=lambda jobs, on_result: [], can_execute=self.executes,
                                  generation_batch=self.args.eval_batch_size, deadline=deadline, log=self.run.log,
                                  progress=False)
        finally:
            del generator
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return {"generated_now": done.generated, "answered": sum(r.generation is not None for r in done.results),
                "with_code": sum(bool(r.generation and r.generation.get("code")) for r in done.results),
                "stopped_early": done.stopped_early, "settings": settings.to_dict()}

    def judge_in_background(self, deadline: float) -> None:
        def judge() -> None:
            try:
                run_evaluation(self.tasks, state_dir=self.state_dir, generate=None, judge=verifier_judge(self.config),
                               can_execute=self.executes, judge_chunk=2 * max(1, self.config.max_parallel_builds or len(os.sched_getaffinity(0))),
                               deadline=deadline, log=self.run.log, progress=False)
            except Exception:  # noqa: BLE001 - recorded; the summary reads whatever verdicts were stored
                self.run.log(traceback.format_exc())
                with self.run.lock:
                    self.run.results["errors"].append("kernelbench judging: " + traceback.format_exc(limit=1))
            self.record()

        self.thread = threading.Thread(target=judge, daemon=True)
        self.thread.start()

    def wait(self, seconds: float) -> None:
        if self.thread is not None:
            self.thread.join(max(1.0, seconds))

    def record(self) -> dict:
        """Metrics from the answers and verdicts stored so far (a task without a verdict counts as failed and is
        reported as missing), overall and by family group; one line a task in kernelbench_results.jsonl."""
        stored = run_evaluation(self.tasks, state_dir=self.state_dir, generate=None,
                                judge=lambda jobs, on_result: [], can_execute=self.executes,
                                log=lambda message: None, progress=False)
        outcomes = {o.task_key: o for o in stored.outcomes()}
        lines = []
        for result in stored.results:
            verdict = result.verdict
            lines.append({"task": result.task.key, "group": self.groups.get(result.task.key),
                          "has_code": bool(result.generation and result.generation.get("code")),
                          "status": None if verdict is None else status_value(verdict),
                          "reasons": [] if verdict is None else verdict.reason_codes(),
                          "code": (result.generation or {}).get("code")})
        summary = {"executed": self.executes, "tasks": len(self.tasks), "overall": _compact(evaluation_metrics(
            list(outcomes.values()))), "by_group": {}}
        for group in sorted(set(self.groups.values())):
            members = [outcomes[key] for key, g in self.groups.items() if g == group and key in outcomes]
            summary["by_group"][group] = _compact(evaluation_metrics(members))
        with self.run.lock:
            (self.run.out_dir / "kernelbench_results.jsonl").write_text(
                "".join(json.dumps(line, default=str) + "\n" for line in lines))
            self.run.results["kernelbench"] = {**self.run.results.get("kernelbench", {}), **summary}
        self.run.save()
        return summary


def _compact(metrics: list[dict]) -> dict:
    """The rates that answer the run's questions, at each tolerance (1e-2 first, KernelBench's)."""
    keys = ("n_tasks", "n_judged", "n_missing", "n_not_executed", "compile_rate", "exec_rate", "n_correct",
            "deceptive_rate", "fast_1")
    return {row["tolerance"]: {k: row.get(k) for k in keys} for row in metrics}


def train_rl(args, work: Path, checkpoint: str, data: dict, on_gpu: bool, seconds: float, run: Run) -> dict:
    config = dict(steps=args.rl_steps, tasks_per_step=2 if args.tiny else args.rl_tasks_per_step,
                  samples_per_task=2 if args.tiny else args.rl_samples_per_task, learning_rate=1e-6,
                  max_new_tokens=16 if args.tiny else args.rl_max_new_tokens, max_seconds=seconds,
                  checkpoint_every=10**6, rollout_batch_size=64, attention_backend="dense")
    reward = "verifier" if on_gpu else "static"
    verify_config = dict(FAST_VERIFY, build_without_gpu=False)
    result = run_rl_stage(checkpoint, data["infilling"], work / "rl_infilling", "rl_infilling", config, reward,
                          verify_config, resume=True, reward_timeout_s=max(20.0, 0.6 * seconds),
                          on_step=lambda r: run.log(
                              f"rl_infilling step {r['step']}: reward {r['reward_mean']} rewarded {r['rewarded']} "
                              f"groups used {r['groups_used']} statuses {r['status_counts']} update {r['update']}"))
    keep = ("step", "reward_mean", "rewarded", "groups_used", "groups_dropped", "optimizer_steps", "update", "kl",
            "loss", "status_counts", "deceptive", "seconds_rollout", "seconds_reward", "seconds_update")
    history = result.pop("history")
    return {**result, "rollouts_rewarded": sum(r.get("rewarded") or 0 for r in history),
            "steps": [{k: r.get(k) for k in keep} for r in history]}


# ------------------------------------------------------------------------------------------------------------ main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="results folder (JSON + logs only, no checkpoints)")
    parser.add_argument("--data", type=Path, default=ROOT / "training_data", help="dice export-training-data folder")
    parser.add_argument("--sft-jsonl", type=Path, default=None, help="CuKe SFT rows (default DATA/sft_samples.jsonl)")
    parser.add_argument("--infilling-jsonl", type=Path, default=None,
                        help="RL stage 1 tasks (default DATA/infilling_tasks.jsonl)")
    parser.add_argument("--kernelbench-tasks", type=Path, default=None,
                        help="KernelBench tasks.jsonl (default DATA/kernelbench_tasks.jsonl, else "
                             "DICE_KERNELBENCH_TASKS or ../shared/data/kernelbench/tasks.jsonl)")
    parser.add_argument("--kernelbench-limit", type=int, default=0, help="first N level-1 tasks only (0 = all)")
    parser.add_argument("--family-of", type=Path, default=None,
                        help="JSON object: KernelBench task key (L1/19_ReLU, or its name) -> family name")
    parser.add_argument("--held-out-families", nargs="*", default=[], help="families SFT did not train on")
    parser.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct.Q4_1.gguf, a Qwen2.5-Coder GGUF "
                        "(benchmarks/fetch_qwen_coder_gguf.py) or a checkpoint")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: a tiny random model, a few steps")
    parser.add_argument("--budget-s", type=float, default=570.0)
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".cache" / "train_pipeline_gpu",
                        help="checkpoints and the evaluation's state, kept for the next call")
    parser.add_argument("--convert-seconds", type=float, default=None, help="0: convert without training")
    parser.add_argument("--convert-corpus", type=Path, nargs="+", default=None,
                        help="folders of the conversion corpus (default training.corpus.kernel_code_roots())")
    parser.add_argument("--convert-corpus-mb", type=float, default=16.0)
    parser.add_argument("--convert-lr", type=float, default=1e-4)
    parser.add_argument("--convert-window", type=int, default=512)
    parser.add_argument("--sft-seconds", type=float, default=None)
    parser.add_argument("--sft-recipe", default="small", help="training.sft.SFT_RECIPES: small or dice_8b")
    parser.add_argument("--sft-lr", type=float, default=None, help="override the recipe's learning rate")
    parser.add_argument("--sft-max-length", type=int, default=6144, help="longer rows are dropped (DICE: 6144)")
    parser.add_argument("--sft-samples-per-step", type=int, default=4,
                        help="global batch; 4 x 6144-token rows are ~30 GB of activations for the 135M model")
    parser.add_argument("--keep-reasoning", action="store_true", help="train on the <think> traces too")
    parser.add_argument("--decode-budget-s", type=float, default=None)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--eval-generate-s", type=float, default=None, help="the level-1 answers' time box")
    parser.add_argument("--max-new-tokens", type=int, default=4096, help="evaluation answers (DICE: 4096)")
    parser.add_argument("--eval-batch-size", type=int, default=100, help="tasks decoded together")
    parser.add_argument("--rl-seconds", type=float, default=None,
                        help="RL's time box (default: what is left but 45 s; the judging runs beside it)")
    parser.add_argument("--rl-steps", type=int, default=3)
    parser.add_argument("--rl-tasks-per-step", type=int, default=8)
    parser.add_argument("--rl-samples-per-task", type=int, default=4)
    parser.add_argument("--rl-max-new-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    if not args.tiny and args.gguf is None:
        parser.error("--gguf is required unless --tiny")
    for name, share in SHARES.items():
        attribute = {"convert": "convert_seconds", "sft": "sft_seconds", "decode": "decode_budget_s",
                     "generate": "eval_generate_s"}[name]
        if getattr(args, attribute) is None:
            setattr(args, attribute, share * args.budget_s)
    if args.tiny:
        args.max_new_tokens, args.eval_batch_size = 16, 4
        args.kernelbench_limit = args.kernelbench_limit or 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.budget_s)
    on_gpu = torch.cuda.is_available()
    run.results.update(device=torch.cuda.get_device_name(0) if on_gpu else "cpu", torch=torch.__version__,
                       tiny=args.tiny, work_dir=str(work), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       args={k: str(v) for k, v in vars(args).items()})
    data = run.phase("data", prepare_data, args, work)
    if data is None:
        return 1
    family_of, held_out = {}, set(args.held_out_families)
    if args.family_of:
        family_of = json.loads(args.family_of.read_text())
    elif (args.data / "kernelbench_families.json").is_file():
        # `dice export-training-data` writes each task's family and the held-out families beside the tasks
        exported = json.loads((args.data / "kernelbench_families.json").read_text())
        family_of, held_out = exported["family_of"], held_out or set(exported["held_out_families"])
    groups = family_groups(data["tasks"], family_of, held_out)
    run.results["data_counts"] = {**data["counts"], "kernelbench_by_group": {
        g: sum(1 for v in groups.values() if v == g) for g in sorted(set(groups.values()))},
        "held_out_families": sorted(held_out), "tasks_file": data["tasks_file"]}

    base = run.phase("convert", convert_base, args, work, data, on_gpu, run)
    if base:
        run.results["convert"] = base
    sft = run.phase("sft", train_sft, args, work, base["checkpoint"], data, run) if base else None
    if sft is None:
        run.save()
        return 1
    run.results["sft"] = sft
    checkpoint = sft["checkpoint"]
    if run.left() > 30:
        run.results["decode"] = run.phase("decode_benchmark", decode_benchmark, args, checkpoint,
                                          data["tasks_file"], work, run)
    else:
        run.skip("decode_benchmark", f"{run.left():.0f} s left")

    kernelbench = KernelBenchEval(run, data["tasks"], groups, work / "kernelbench_state" / _key(checkpoint, args),
                                  args)
    generated = run.phase("kernelbench_generate", kernelbench.generate, checkpoint,
                          time.monotonic() + min(args.eval_generate_s, max(0.0, run.left() - 30)))
    run.results["kernelbench"] = {"generation": generated, "state_dir": str(kernelbench.state_dir)}
    kernelbench.judge_in_background(time.monotonic() + max(10.0, run.left() - 15))

    if data["counts"]["infilling_train"] and run.left() > 60:
        seconds = min(args.rl_seconds or float("inf"), run.left() - 45)
        run.results["rl_infilling"] = run.phase("rl_infilling", train_rl, args, work, checkpoint, data, on_gpu,
                                                seconds, run)
    else:
        run.skip("rl_infilling", f"no infilling tasks or {run.left():.0f} s left")
    run.log(f"waiting for the judging ({run.left():.0f} s left)")
    kernelbench.wait(run.left() - 10)
    run.phase("kernelbench_record", kernelbench.record)
    print(json.dumps({"kernelbench": run.results.get("kernelbench", {}).get("by_group"),
                      "overall": run.results.get("kernelbench", {}).get("overall"),
                      "errors": run.results["errors"], "elapsed_s": run.results.get("elapsed_s")}, indent=1))
    return 0


def _key(checkpoint: str, args) -> str:
    """The evaluation state's folder: one per checkpoint and generation settings."""
    text = json.dumps([str(Path(checkpoint).resolve()), args.max_new_tokens, args.kernelbench_limit])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Judging still running past the budget (daemon threads, verifier worker pools) must not hold the exit: the
    # results are written, and what was unfinished is recorded as missing, to judge on the next call.
    os._exit(code)
