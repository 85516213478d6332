"""Full-size sweep: every KernelBench task of the chosen levels through the verifier's correctness and timing path
on this host's GPU, each reference judged against itself (the trusted control of `measure_references`), at the
task's real size. Says whether the verifier can judge every task: no infrastructure_error, every task inside its
limit, peak GPU memory per task, how inputs were drawn, and the control's speedup (should be ~1.0).

    python benchmarks/kernelbench_sweep.py OUT_DIR --tasks ../shared/data/kernelbench/tasks.jsonl --levels 1 2 3 \\
        [--budget-s 480] [--lanes 2] [--baselines eager,compile] [--state FILE]

Writes OUT_DIR/kernelbench_sweep.jsonl (one row per task) and OUT_DIR/kernelbench_sweep_summary.json, and prints
a summary. Stops starting tasks once --budget-s is spent (the rows say which tasks were not reached). With --state
the rows are also appended to FILE and a second run (other levels, other lanes) skips the tasks FILE already holds
(an infrastructure_error is tried again); the summary covers every row of FILE for the levels asked. `--lanes N`
judges N tasks on the GPU at once (VerifyConfig.gpu_lanes): their untimed work overlaps and every timed section
has the GPU to itself, so with `--baselines eager,compile` the rows are this host's KernelBench baselines at any
lane count: `kernelbench_eval_gpu.py --baselines-from FILE` takes them instead of measuring again. torch and the
standard library only (runs on a bare CUDA+PyTorch image).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dice_pipeline.kernelbench import load_kernelbench_tasks  # noqa: E402
from dice_pipeline.verify import VerifyConfig, gpu_inventory, measure_references  # noqa: E402


def sweep_config(args: argparse.Namespace) -> VerifyConfig:
    """The default VerifyConfig (limits, draws, both conventions) with a shorter timing budget per task: the sweep
    checks that every task can be judged, not the last percent of its speed."""
    return VerifyConfig(timing_samples=args.timing_samples, timing_budget_s=args.timing_budget_s,
                        warmup_seconds=0.2, gpu_memory_fraction=0.9,  # split between the lanes
                        # Each lane gets two cores (the sweep builds nothing beside them).
                        gpu_worker_cpus=2 * max(1, args.lanes),
                        build_cache_dir=str(Path(args.out) / "build_cache"))


def read_state(path: Path | None) -> list[dict]:
    """The rows an earlier run kept (the last row of a task wins); an infrastructure_error is dropped, so the task
    (or one not executed, as on a host without a GPU) is judged again. A torn last line (a run killed mid-write) is skipped."""
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [row for row in latest_rows(rows) if row.get("status") not in ("infrastructure_error", "not_executed")]


def latest_rows(rows: list[dict]) -> list[dict]:
    by_task: dict[str, dict] = {}
    for row in rows:
        by_task[row["task_id"]] = row
    return list(by_task.values())


def summarize(rows: list[dict], skipped: list[dict], wall_s: float, config: VerifyConfig, lanes: int) -> dict:
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[row["status"]] = by_status.get(row["status"], 0) + 1
    peaks = sorted(((row["peak_gpu_mb"] or 0.0), row["task_id"]) for row in rows)
    controls = [row["control_speedup_gpu"] for row in rows if row["control_speedup_gpu"]]
    gpu_draws = [row["task_id"] for row in rows if "CUDA device context" in (row["input_draw"] or "")]
    limits = [row["provenance"].get("run_limit_s") for row in rows if row["provenance"].get("run_limit_s")]
    seconds = [(row["provenance"].get("run_seconds"), row["provenance"].get("run_limit_s"), row["task_id"])
               for row in rows if row["provenance"].get("run_seconds") is not None]
    over = [task_id for used, limit, task_id in seconds if limit and used > limit]
    phases: dict[str, list[float]] = {}
    for row in rows:
        for phase, spent in (row["provenance"].get("phase_seconds") or {}).items():
            phases.setdefault(phase, []).append(spent)
    gpus = gpu_inventory()
    return {
        "tasks_judged": len(rows), "tasks_not_reached": len(skipped), "by_status": by_status,
        "infrastructure_errors": [r["task_id"] for r in rows if r["status"] == "infrastructure_error"],
        "timeouts": [r["task_id"] for r in rows if r["status"] == "timeout"],
        "runtime_errors": {r["task_id"]: r["message"][:300] for r in rows if r["status"] == "runtime_error"},
        "peak_gpu_mb_max": peaks[-1] if peaks else None, "peak_gpu_mb_median": statistics.median(p for p, _ in peaks) if peaks else None,
        "inputs_drawn_on_gpu": gpu_draws,
        "control_speedup_gpu_median": statistics.median(controls) if controls else None,
        "control_speedup_gpu_range": [min(controls), max(controls)] if controls else None,
        "run_limit_s_range": [min(limits), max(limits)] if limits else None,
        "run_seconds_max": max(seconds)[:3:2] if seconds else None,
        "run_seconds_median": statistics.median(used for used, _, _ in seconds) if seconds else None,
        "tasks_over_their_limit": over,
        # where a task's judgement went (median seconds a phase), and how often a lane needed the whole GPU
        "phase_seconds_median": {phase: round(statistics.median(v), 3) for phase, v in phases.items()},
        "whole_gpu_from_the_start": [r["task_id"] for r in rows if r["provenance"].get("whole_gpu_from_the_start")],
        "judged_again_after_running_out_of_memory": [r["task_id"] for r in rows
                                                     if r["provenance"].get("first_attempt_out_of_memory")],
        "gpus_of_rows": sorted({r["provenance"].get("gpu") or "?" for r in rows}),
        "compile_baseline_errors": {r["task_id"]: (r.get("compile_error") or "")[:200] for r in rows
                                    if "compile" in (r.get("baselines") or []) and r["status"] == "measured"
                                    and r.get("compile_ms_gpu") is None},
        "wall_s": round(wall_s, 1), "lanes_per_gpu": lanes,
        "gpu": gpus[0].name if gpus else None, "driver": gpus[0].driver if gpus else None,
        "config": {k: v for k, v in config.to_dict().items() if k in (
            "timing_samples", "timing_budget_s", "timing_min_samples", "speedup_convention", "correctness_trials",
            "run_timeout_s", "max_run_timeout_s", "gpu_memory_fraction")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--tasks", required=True, help="KernelBench tasks.jsonl or a checkout's KernelBench/ folder")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting new tasks after this")
    parser.add_argument("--lanes", type=int, default=2, help="tasks on the GPU at once")
    parser.add_argument("--timing-samples", type=int, default=20)
    parser.add_argument("--timing-budget-s", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks (0: all)")
    parser.add_argument("--baselines", default="eager", help="eager, or eager,compile (torch.compile'd too)")
    parser.add_argument("--state", type=Path, default=None, help="rows kept between runs (JSONL; resumable)")
    args = parser.parse_args(argv)
    baselines = tuple(name for name in args.baselines.split(",") if name)
    if "eager" not in baselines:
        raise SystemExit("--baselines must include eager (the reference itself)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task_set = load_kernelbench_tasks(args.tasks, levels=args.levels)
    tasks = [(task.key, task.code) for task in task_set.tasks]
    if args.limit:
        tasks = tasks[: args.limit]
    asked = {task_id for task_id, _ in tasks}
    earlier = [row for row in read_state(args.state) if row["task_id"] in asked]
    done = {row["task_id"] for row in earlier}
    tasks = [(task_id, code) for task_id, code in tasks if task_id not in done]
    if earlier:
        print(f"{len(done)} tasks already in {args.state}; {len(tasks)} to judge", flush=True)
    config = sweep_config(args)
    started = time.monotonic()
    rows: list[dict] = []
    log = (out / "kernelbench_sweep.jsonl").open("w")
    state = args.state.open("a") if args.state else None

    def on_result(row: dict) -> None:
        row = {**row, "elapsed_s": round(time.monotonic() - started, 1), "lanes_per_gpu": args.lanes,
               "baselines": list(baselines), "timing_budget_s": args.timing_budget_s}
        rows.append(row)
        for sink in (log, state):
            if sink is not None:
                sink.write(json.dumps(row, default=str) + "\n")
                sink.flush()
        print(f"[{len(rows)}/{len(tasks)} {row['elapsed_s']:.0f}s] {row['task_id']}: {row['status']} "
              f"gpu={row['eager_ms_gpu']} host={row['eager_ms_host']} peak={row['peak_gpu_mb']} "
              f"{(row['message'] or '')[:120]}", flush=True)

    # Tasks are handed out in slices so the budget is checked between them (a task once started runs to its end).
    skipped: list[dict] = []
    slice_size = max(4, 4 * args.lanes)
    for begin in range(0, len(tasks), slice_size):
        if time.monotonic() - started > args.budget_s:
            skipped = [{"task_id": task_id} for task_id, _ in tasks[begin:]]
            break
        measure_references(tasks[begin:begin + slice_size], config, baselines, on_result=on_result,
                           lanes_per_gpu=args.lanes)
    log.close()
    if state is not None:
        state.close()
    judged_now = len(rows)
    rows = latest_rows(earlier + rows)
    summary = summarize(rows, skipped, time.monotonic() - started, config, args.lanes)
    summary["judged_this_run"] = judged_now
    summary["lanes_by_task"] = {n: sum(1 for r in rows if r.get("lanes_per_gpu") == n)
                                for n in sorted({r.get("lanes_per_gpu") for r in rows}, key=str)}
    summary["not_reached"] = [s["task_id"] for s in skipped]
    summary["levels"] = args.levels
    summary["skipped_by_loader"] = [{"origin": s.origin, "reason": s.reason_code} for s in task_set.skipped
                                    if s.reason_code != "level_not_requested"]
    (out / "kernelbench_sweep_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "runtime_errors"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
