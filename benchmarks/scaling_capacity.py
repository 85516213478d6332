"""Capacity figures for scaling verification out (docs/scaling.md): compile throughput per core and verify
throughput per GPU, measured with the verifier as the pipeline runs it, on the seed corpus. Run on a GPU host
(torch with CUDA, nvcc; no Dagster needed):

    python benchmarks/scaling_capacity.py --out DIR --budget-s 170

Phase "compile": P distinct seed candidates built cold side by side (P = the compile pool this host gets: cores
left after the GPU workers', capped by memory), nothing executed: wall time, builds a minute, builds a minute per
build slot, each build's seconds, and the host memory the builds took at their peak (sampled from /proc/meminfo).
Phase "judge_1gpu": the built candidates judged on one GPU (builds are cache hits now, so this is the GPU stage
alone, prestarted workers, all checks, adaptive timing): candidates a minute per GPU and each one's GPU-worker
seconds. Phase "judge_all_gpus" (hosts with 2+ GPUs): the same over every GPU. Each phase is sized to what is left
of --budget-s; DIR/scaling_capacity.json is rewritten after every phase and a log goes to DIR/scaling_capacity.log,
so a run cut short still leaves what it measured. `--dry-run` (any host) runs the plumbing with static checks only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.gpu_pool import available_memory_mb, compile_workers  # noqa: E402
from dice_pipeline.seed_corpus import load_seed_pairs  # noqa: E402
from dice_pipeline.verify import (  # noqa: E402
    VerifyConfig,
    VerifyJob,
    check_candidate_source,
    gpu_inventory,
    verify_batch,
)
from dice_pipeline.verify.inventory import choose_parallelism  # noqa: E402

# GPU-stage seconds a seed candidate took on the H200 (benchmarks/RESULTS.md, 2026-12-04: 386 s for 40): used only
# to size the judge phases to the budget before this run has measured its own.
PRIOR_JUDGE_SECONDS = 9.7


class MemorySampler:
    """Peak of (MemTotal - MemAvailable) above its value at start, sampled every `period_s`."""

    def __init__(self, period_s: float = 0.5):
        self.period_s = period_s
        self.base = self._used()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _used() -> int | None:
        available = available_memory_mb()
        try:
            total = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                             if line.startswith("MemTotal:"))) // 1024
        except (OSError, StopIteration):
            return None
        return None if available is None else total - available

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            used = self._used()
            if used is not None and (self.peak is None or used > self.peak):
                self.peak = used

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak_above_start_mb(self) -> int | None:
        return None if self.base is None or self.peak is None else self.peak - self.base


def _seconds_summary(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"n": len(values), "median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "sum": round(sum(values), 3)}


def _statuses(verdicts) -> dict[str, int]:
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.status.value] = counts.get(verdict.status.value, 0) + 1
    return dict(sorted(counts.items()))


def plan_judge_jobs(built: list[dict], devices: list[int], seconds_left: float,
                    seconds_per_candidate: float) -> list[VerifyJob]:
    """The judge phase's jobs: as many as the GPUs get through in 85% of the time left, whole rounds of one
    candidate a GPU, cycling over the built candidates (a repeat is judged again, under its own job id)."""
    if not built or not devices:
        return []
    count = int(0.85 * seconds_left / seconds_per_candidate) * len(devices)
    jobs = []
    for i in range(count):
        pair = built[i % len(built)]
        jobs.append(VerifyJob(f"{pair['uuid']}#{i // len(built)}", pair["pytorch_code"], pair["generated_code"]))
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=170.0, help="wall-clock budget for all phases")
    parser.add_argument("--build-workers", type=int, default=0, help="0 = the compile pool this host gets")
    parser.add_argument("--dry-run", action="store_true", help="static checks only (plumbing check, any host)")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "scaling_capacity.log").open("a")
    start = time.monotonic()

    def left() -> float:
        return args.budget_s - (time.monotonic() - start)

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - start:6.1f}s] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    gpus = [] if args.dry_run else gpu_inventory()
    # The cores verify_batch keeps for GPU workers (inventory.split_cpus): builds get the rest.
    reserved = choose_parallelism(VerifyConfig(), gpus, bool(gpus)).gpu_worker_cpus * len(gpus)
    reserved = reserved if reserved and len(os.sched_getaffinity(0)) >= 4 * reserved else 0
    workers = args.build_workers or compile_workers(reserved_cores=reserved)
    report: dict = {
        "script": "benchmarks/scaling_capacity.py", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(), "cpu_cores": len(os.sched_getaffinity(0)),
        "memory_available_mb": available_memory_mb(),
        "gpus": [{"index": g.index, "name": g.name, "driver": g.driver, "arch": g.compute_capability} for g in gpus],
        "budget_s": args.budget_s, "dry_run": args.dry_run, "build_workers": workers,
        "cores_reserved_for_gpu_workers": reserved, "phases": {},
    }

    def save() -> None:
        (out / "scaling_capacity.json").write_text(json.dumps(report, indent=1, sort_keys=True))

    try:
        import torch

        report["torch"] = torch.__version__
        report["torch_cuda"] = torch.version.cuda
    except ImportError:
        report["torch"] = None
    save()

    pairs = [p for p in load_seed_pairs()
             if check_candidate_source(p["pytorch_code"], p["generated_code"]).status is None]
    cache_dir = tempfile.mkdtemp(prefix="dice_scaling_cache_")  # cold: nothing built before this run
    base = VerifyConfig(build_cache_dir=cache_dir, verdict_store_dir=None, max_parallel_builds=workers)

    # Phase 1: one wave of cold builds, as many as the compile pool runs at once.
    # verify_batch builds the torch/extension.h PCH in one of the slots beside 4+ builds: leave it that slot, so
    # the candidates go in a single wave.
    pch_slot = 1 if base.build_profile == "fast" and base.use_precompiled_header and workers >= 5 else 0
    chosen = pairs[:workers - pch_slot] if not args.dry_run else pairs[:3]
    built: list[dict] = []
    try:
        compile_limit = max(60.0, 0.6 * left())
        config = VerifyConfig(**{**base.to_dict(), "execute": False, "build_without_gpu": not args.dry_run,
                                 "compile_timeout_s": compile_limit})
        jobs = [VerifyJob(p["uuid"], p["pytorch_code"], p["generated_code"]) for p in chosen]
        log(f"compile: {len(jobs)} cold builds, {workers} at a time (time limit {compile_limit:.0f} s each)")
        phase_start = time.perf_counter()
        with MemorySampler() as memory:
            verdicts = verify_batch(jobs, config,
                                    on_result=lambda job, v: log(f"  built {job.job_id[:8]}: {v.summary()}"))
        wall = time.perf_counter() - phase_start
        compiled = [v for v in verdicts if v.compile_seconds is not None and not v.build_cache_hit]
        slots = min(workers - pch_slot, len(jobs)) or 1
        peak = memory.peak_above_start_mb()
        report["phases"]["compile"] = {
            "candidates": len(jobs), "parallel_builds": slots, "wall_seconds": round(wall, 2),
            "builds_per_minute": round(60 * len(compiled) / wall, 3) if wall > 0 else None,
            "builds_per_minute_per_slot": round(60 * len(compiled) / wall / slots, 3) if wall > 0 else None,
            # What a slot sustains once the wave's ramp is gone: one build every mean compile_seconds.
            "builds_per_minute_per_slot_steady": (round(60 / statistics.mean(v.compile_seconds for v in compiled), 3)
                                                  if compiled else None),
            "pch_slot": pch_slot,
            "compile_seconds": _seconds_summary([v.compile_seconds for v in compiled]),
            "memory_peak_above_start_mb": peak,
            "memory_per_build_mb": round(peak / slots) if peak is not None else None,
            "statuses": _statuses(verdicts), "static_only": args.dry_run,
        }
        built = [p for p, v in zip(chosen, verdicts) if v.status.value == "not_executed"]
        log(f"compile: {report['phases']['compile']}")
    except Exception:  # noqa: BLE001 - record and go on to what can still be measured
        report["phases"]["compile"] = {"error": traceback.format_exc()[-3000:]}
        log(f"compile phase failed:\n{traceback.format_exc()}")
    save()

    def judge_phase(name: str, devices: list[int]) -> None:
        per_candidate = PRIOR_JUDGE_SECONDS
        if "judge_1gpu" in report["phases"] and report["phases"]["judge_1gpu"].get("seconds_per_candidate"):
            per_candidate = report["phases"]["judge_1gpu"]["seconds_per_candidate"]
        if not gpus:
            report["phases"][name] = {"skipped": "no GPU here" if not args.dry_run else "dry run"}
            return
        jobs = plan_judge_jobs(built, devices, left(), per_candidate)
        if not jobs:
            report["phases"][name] = {"skipped": f"{left():.0f} s of budget left and {len(built)} built: "
                                                 "too little for one candidate a GPU"}
            return
        config = VerifyConfig(**{**base.to_dict(), "execute": True, "devices": devices,
                                 "run_timeout_s": max(30.0, left())})
        log(f"{name}: {len(jobs)} candidates on GPU(s) {devices}")
        phase_start = time.perf_counter()
        verdicts = verify_batch(jobs, config,
                                on_result=lambda job, v: log(f"  judged {job.job_id[:10]}: {v.summary()}"))
        wall = time.perf_counter() - phase_start
        run_seconds = [v.provenance.get("run_seconds") for v in verdicts]
        report["phases"][name] = {
            "gpus": len(devices), "candidates": len(jobs), "wall_seconds": round(wall, 2),
            "candidates_per_minute": round(60 * len(jobs) / wall, 3),
            "candidates_per_minute_per_gpu": round(60 * len(jobs) / wall / len(devices), 3),
            "seconds_per_candidate": round(wall * len(devices) / len(jobs), 3),
            "gpu_worker_seconds": _seconds_summary(run_seconds), "statuses": _statuses(verdicts),
        }
        log(f"{name}: {report['phases'][name]}")

    for name, devices in (("judge_1gpu", [g.index for g in gpus[:1]]),
                          ("judge_all_gpus", [g.index for g in gpus] if len(gpus) > 1 else [])):
        if not devices and name == "judge_all_gpus":
            report["phases"][name] = {"skipped": "one GPU on this host" if gpus else "no GPU here"}
            continue
        try:
            judge_phase(name, devices)
        except Exception:  # noqa: BLE001
            report["phases"][name] = {"error": traceback.format_exc()[-3000:]}
            log(f"{name} failed:\n{traceback.format_exc()}")
        save()

    report["wall_seconds"] = round(time.monotonic() - start, 1)
    save()
    compile_phase = report["phases"].get("compile", {})
    judge = report["phases"].get("judge_1gpu", {})
    build_seconds = (compile_phase.get("compile_seconds") or {}).get("median")
    print(f"SUMMARY compile: {compile_phase.get('builds_per_minute_per_slot_steady')} builds/min per slot "
          f"({compile_phase.get('parallel_builds')} slots, median {build_seconds} s, "
          f"{compile_phase.get('memory_per_build_mb')} MB each); verify: {judge.get('candidates_per_minute_per_gpu')} "
          f"candidates/min per GPU ({judge.get('skipped', '')}); total {report['wall_seconds']} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
