"""KernelBench evaluation of one checkpoint on one level, on a GPU host (torch + transformers + stdlib only):
generate with the paper's protocol for every task, judge every answer with the verifier, measure the eager (and,
time allowing, torch.compile) baselines of every task here, and write per-task results, metrics and the comparison
report. Time-boxed: it stops starting new work at --budget-s and always writes what it has; the generations,
verdicts and baselines it finished are kept in --state-dir, so running the same command again continues where it
stopped and never generates or judges a finished task twice.

    python benchmarks/kernelbench_eval_gpu.py OUT_DIR --checkpoint PATH --level 1 --tasks-file tasks.jsonl \
        --budget-s 400

OUT_DIR receives 7 files: results.jsonl (one line per task: answer, verdict, speedups, baseline), metrics.json
(both tolerances), baselines.json, sanity.json, report.md, summary.json, log.txt. Without a GPU (the CPU dry run)
nothing executes and every file says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dice_pipeline.evaluation.baselines import baselines_from_sweep, measure_baselines  # noqa: E402
from dice_pipeline.evaluation.evaluate import (  # noqa: E402
    can_execute,
    evaluation_verify_config,
    result_row,
    verifier_judge,
)
from dice_pipeline.evaluation.generation import CheckpointGenerator, EvalGenerationSettings  # noqa: E402
from dice_pipeline.evaluation.metrics import FAST_P_CONVENTION, evaluation_metrics  # noqa: E402
from dice_pipeline.evaluation.report import comparison_markdown  # noqa: E402
from dice_pipeline.evaluation.runner import run_evaluation, state_key  # noqa: E402
from dice_pipeline.evaluation.sanity import judge_sanity, sanity_cases, sanity_jobs  # noqa: E402
from dice_pipeline.kernelbench import load_kernelbench_tasks  # noqa: E402
from dice_pipeline.settings import VERIFY_CACHE  # noqa: E402

FORBIDDEN_ON_GPU_HOST = ("dagster", "polars", "duckdb", "datasets")
SANITY_ESTIMATE_S = 180.0
# Tasks measured per call: torch.compile costs ~10-60 s a task, so its chunks stay small (the deadline is checked
# between chunks, against the longest chunk so far).
BASELINE_CHUNK = {"eager": 10, "compile": 2}


class Log:
    def __init__(self, path: Path):
        self.file = path.open("a")

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def _write(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


def _needs_baseline(row: dict | None, kind: str, executes: bool) -> bool:
    """Whether a task's baseline of this kind is still to measure: never tried, or not executed (while a GPU is
    here), or lost to an infrastructure error. Runtime errors and timeouts of the reference stand."""
    if kind == "compile":  # only where eager was measured, and once (a failed compile is recorded, not retried)
        return bool(row) and row.get("status") == "measured" and "compile_status" not in row
    return not row or row.get("status") == "infrastructure_error" or (executes and row.get("status") == "not_executed")


def _baseline_rows(tasks, config, kinds, state_path: Path, deadline: float, executes: bool, log) -> dict[str, dict]:
    """Baselines of every task, kept in `state_path` between runs; eager first for all tasks, then compile. Each
    chunk holds only as many tasks as the seconds a task has taken so far (kept between runs beside the state)
    say fit before the deadline, so a chunk is not cut off and lost by the run's time limit."""
    rows: dict[str, dict] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    state_path.parent.mkdir(parents=True, exist_ok=True)
    pace_path = state_path.with_name(state_path.stem + "_seconds_per_task.json")
    pace: dict[str, float] = json.loads(pace_path.read_text()) if pace_path.is_file() else {}
    for kind in kinds:
        todo = [t for t in tasks if _needs_baseline(rows.get(t.key), kind, executes)]
        chunk = BASELINE_CHUNK[kind] if executes else max(1, len(todo))
        start = 0
        while start < len(todo):
            per_task = pace.get(kind, 0.0)
            fits = int((deadline - time.monotonic()) // per_task) if per_task > 0 else chunk
            if fits < 1:
                log(f"baselines ({kind}): deadline reached, {len(todo) - start} tasks left for the next run")
                break
            part = todo[start:start + min(chunk, fits)]
            began = time.monotonic()
            measured = measure_baselines(part, config, baselines=(kind,))
            pace[kind] = max(pace.get(kind, 0.0), (time.monotonic() - began) / len(part))
            _write(pace_path, pace)
            start += len(part)
            for row in measured:
                old = rows.get(row["task_id"]) or {}
                if kind == "compile":  # keep the eager numbers, add the compiled one
                    row = {**old, "compile_ms_gpu": row.get("compile_ms_gpu"),
                           "compile_status": row["status"], "compile_message": row.get("message")}
                rows[row["task_id"]] = row
                log(f"baseline {kind} {row['task_id']}: {row.get('status')} eager_ms_gpu={row.get('eager_ms_gpu')} "
                    f"compile_ms_gpu={row.get('compile_ms_gpu')} {row.get('message') or ''}".rstrip())
            _write(state_path, rows)
    return rows


def _seed_baselines(sweep_path: Path, tasks, state_path: Path, log, gpu: str | None) -> None:
    """Baselines the full-size sweep measured with the GPU to itself, on a GPU named `gpu` (this one), for the
    tasks the state does not hold yet."""
    rows = [json.loads(line) for line in sweep_path.read_text().splitlines() if line.strip()]
    kept: dict[str, dict] = json.loads(state_path.read_text()) if state_path.is_file() else {}
    seeded = {k: v for k, v in baselines_from_sweep(rows, [t.key for t in tasks], gpu=gpu).items()
              if not kept.get(k) or kept[k].get("status") in ("infrastructure_error", "not_executed")}
    if seeded:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        _write(state_path, {**kept, **seeded})
    log(f"baselines: {len(seeded)} taken from {sweep_path} (timed with the GPU to itself on {gpu or 'any GPU'})")


def _stored_results(tasks, state_dir: Path, samples: int, executes: bool):
    """What the state directory holds, judged by nobody: the rows to write when a run was cut short."""
    return run_evaluation(tasks, state_dir=state_dir, generate=None, judge=lambda jobs, on_result: [],
                          samples=samples, can_execute=executes, log=lambda message: None, progress=False)


def _terminated(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--checkpoint", required=True, help="a from_pretrained directory (ours, SDAR, any causal LM)")
    parser.add_argument("--name", default="", help="the model's name in the report (default: the directory name)")
    parser.add_argument("--level", type=int, default=1, choices=[1, 2, 3])
    parser.add_argument("--tasks-file", required=True, help="KernelBench tasks.jsonl or a checkout's KernelBench/")
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="generations, verdicts and baselines kept between runs (default .cache/... in the repo)")
    parser.add_argument("--limit", type=int, default=0, help="first N tasks only (0 = all)")
    parser.add_argument("--decoding", default="auto", choices=["auto", "block_diffusion", "autoregressive"])
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=50, help="tasks decoded together")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--baselines", default="eager,compile")
    parser.add_argument("--judge-chunk", type=int, default=0,
                        help="answers judged per verifier batch, the deadline checked between (default 2 x cores)")
    parser.add_argument("--baselines-from", type=Path, default=None,
                        help="a kernelbench_sweep.py state file: its rows timed alone on the GPU seed the baselines "
                             "not yet kept")
    parser.add_argument("--no-sanity", action="store_true")
    parser.add_argument("--no-execute", action="store_true", help="static checks only, even with a GPU")
    parser.add_argument("--no-generate", action="store_true",
                        help="judge only the answers the state directory holds (none: only sanity rows and "
                             "baselines are run; the metrics then count every task as missing)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    deadline = started + args.budget_s
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = Log(args.out_dir / "log.txt")
    name = args.name or Path(args.checkpoint).name
    identity = {"path": str(Path(args.checkpoint).resolve()), "decoding": args.decoding,
                "max_new_tokens": args.max_new_tokens, "samples": args.samples, "temperature": args.temperature}
    state_dir = args.state_dir or (ROOT / ".cache" / "kernelbench_eval_gpu" / state_key(name, identity)
                                   / f"level{args.level}")
    summary: dict = {"checkpoint": args.checkpoint, "name": name, "level": args.level, "state_dir": str(state_dir),
                     "host": platform.node(), "budget_s": args.budget_s, "phases": {}, "error": None}
    results, metrics, sanity, baselines, tasks, run, executes = [], [], [], {}, [], None, False
    signal.signal(signal.SIGTERM, _terminated)  # a time limit's kill still leaves the files written
    pass_k = [1, args.samples] if args.samples > 1 else []
    try:
        config = evaluation_verify_config(
            execute=False if args.no_execute else None,
            build_without_gpu=False,  # a CPU torch cannot build CUDA extensions: no compile-only stage here
            build_cache_dir=VERIFY_CACHE.get() or str(ROOT / ".cache" / "verify_builds"),
            verdict_store_dir=str(state_dir / "verdict_store"))
        executes = can_execute(config)
        summary["executed"] = executes
        task_set = load_kernelbench_tasks(args.tasks_file, levels=[args.level])
        tasks = task_set.tasks[: args.limit] if args.limit else task_set.tasks
        log(f"{len(tasks)} level-{args.level} tasks from {args.tasks_file}; model {args.checkpoint}; execution "
            f"{'on the GPU' if executes else 'NOT run (no GPU): static checks only'}; budget {args.budget_s:.0f}s")
        settings = EvalGenerationSettings(decoding=args.decoding, max_new_tokens=args.max_new_tokens,
                                          samples=args.samples, temperature=args.temperature,
                                          batch_size=args.batch_size)
        loaded: list = []

        def generate(batch, seed):
            if not loaded:
                t0 = time.monotonic()
                loaded.append(CheckpointGenerator.from_pretrained(args.checkpoint, settings))
                log(f"loaded {args.checkpoint} in {time.monotonic() - t0:.1f}s ({loaded[0].decoding})")
            return loaded[0](batch, seed)

        t0 = time.monotonic()
        chunk = args.judge_chunk or 2 * max(1, config.max_parallel_builds or len(os.sched_getaffinity(0)))
        run = run_evaluation(tasks, state_dir=state_dir, generate=None if args.no_generate else generate, judge=verifier_judge(config),
                             samples=args.samples, can_execute=executes, generation_batch=args.batch_size,
                             judge_chunk=chunk, deadline=deadline, log=log, progress=sys.stderr.isatty())
        summary["phases"]["generate_and_judge_s"] = round(time.monotonic() - t0, 1)
        summary.update(generated_now=run.generated, judged_now=run.judged, stopped_early=run.stopped_early)

        # Sanity rows next (a few builds, ~2-3 min cold on a GPU host), started only with that much time left.
        if not args.no_sanity and time.monotonic() + SANITY_ESTIMATE_S < deadline:
            t0 = time.monotonic()
            cases = sanity_cases(tasks)
            verdicts = verifier_judge(config)(sanity_jobs(cases), lambda job, v: log(f"{job.job_id}: {v.summary()}"))
            sanity = [judge_sanity(case, verdict) for case, verdict in zip(cases, verdicts)]
            summary["phases"]["sanity_s"] = round(time.monotonic() - t0, 1)
        elif not args.no_sanity:
            log("sanity rows: not enough time left in this run; judged by the next run")

        t0 = time.monotonic()
        kinds = [k for k in args.baselines.split(",") if k]
        if args.baselines_from is not None:
            from dice_pipeline.verify.api import gpu_inventory

            local = gpu_inventory()
            _seed_baselines(args.baselines_from, tasks, state_dir / "baselines.json", log,
                            local[0].name if local else None)
        baselines = _baseline_rows(tasks, config, kinds, state_dir / "baselines.json", deadline, executes, log)
        summary["phases"]["baselines_s"] = round(time.monotonic() - t0, 1)
    except BaseException as error:  # noqa: BLE001 - write what there is, whatever stopped us
        summary["error"] = f"{type(error).__name__}: {error}"
        log(traceback.format_exc())
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            if run is None and tasks:
                run = _stored_results(tasks, state_dir, args.samples, executes)
                summary["stopped_early"] = "interrupted: results are what the state directory held"
            if run is not None:
                results = [result_row(name, r, baselines.get(r.task.key)) for r in run.results]
                complete = run.stopped_early is None and summary["error"] is None
                metrics = [{"checkpoint": name, "level": args.level, "executed": executes, "complete": complete, **row}
                           for row in evaluation_metrics(run.outcomes(), pass_k=pass_k)]
        except Exception as error:  # noqa: BLE001
            summary["error"] = (summary["error"] or "") + f"; results not rebuilt: {type(error).__name__}: {error}"
        summary["wall_s"] = round(time.monotonic() - started, 1)
        summary["forbidden_modules_loaded"] = [m for m in FORBIDDEN_ON_GPU_HOST if m in sys.modules]
        summary["fast_p_convention"] = f"speedup_{FAST_P_CONVENTION}"
        summary["sanity_passed"] = all(row["passed"] for row in sanity) if sanity else None
        kinds = [k for k in args.baselines.split(",") if k]
        summary["baselines_pending"] = sum(
            1 for task in tasks if any(_needs_baseline(baselines.get(task.key), kind, executes) for kind in kinds))
        summary["complete"] = (bool(metrics) and all(m["complete"] for m in metrics) and summary["error"] is None
                               and summary["baselines_pending"] == 0 and (bool(sanity) or args.no_sanity))
        with (args.out_dir / "results.jsonl").open("w") as out:
            for row in results:
                out.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        _write(args.out_dir / "metrics.json", metrics)
        _write(args.out_dir / "baselines.json", baselines)
        _write(args.out_dir / "sanity.json", sanity)
        _write(args.out_dir / "report.md", comparison_markdown(metrics) if metrics else "no metrics\n")
        _write(args.out_dir / "summary.json", summary)
        for row in metrics:
            log(f"{name} L{args.level} tol {row['tolerance']}: tasks {row['n_tasks']} compile "
                f"{100 * row['compile_rate']:.0f}% Exec {100 * row['exec_rate']:.0f}% "
                f"fast_1 {100 * row['fast_1']:.0f}% "
                f"fast_2 {100 * row['fast_2']:.0f}% not_executed {row['n_not_executed']} missing {row['n_missing']}")
        log(f"complete={summary['complete']} stopped_early={summary.get('stopped_early')} "
            f"baselines_pending={summary['baselines_pending']} "
            f"sanity_passed={summary['sanity_passed']} wall={summary['wall_s']}s"
            + ("" if summary["complete"] else " -> run the same command again to continue"))
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
