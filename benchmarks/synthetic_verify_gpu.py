"""Judge the synthetic operator pairs on a GPU host and pack the verdicts for the project to ship.

    python benchmarks/synthetic_verify_gpu.py OUT [--seed 0] [--scale 1.0] [--families a,b] [--lanes N]
                                              [--batch-size 24] [--include-held-out] [--limit N]

Generates the catalogue for the seed (dice_pipeline.synthesis.operators), judges every training-split pair with
the verifier at the synthetic settings (operators.verification: the same verdict-store keys the
`synthetic_operator_pairs` asset looks up), and writes OUT/store (the verdict store; rerunning with the same OUT
reuses it, so a run cut short continues), OUT/synthetic_verdicts.jsonl.gz (the packed store: copy it to
dice_pipeline/synthesis/operators/verdicts/), OUT/verdicts.jsonl (one line a verdict as it lands) and
OUT/summary.json (counts by family and status, speedups, throughput, where the time went). Torch and the standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.synthesis.operators import generate_operator_instances  # noqa: E402
from dice_pipeline.synthesis.operators.verification import (  # noqa: E402
    SYNTHETIC_VERIFY_OVERRIDES,
    synthetic_verify_config,
    verification_jobs,
)
from dice_pipeline.verify import VerifyConfig, VerifyJob, gpu_inventory, verify_batch  # noqa: E402
from dice_pipeline.verify.store import pack_verdict_store  # noqa: E402


def default_lanes() -> int:
    """A lane a core, keeping two for the builds and the parent, at most 14."""
    return max(1, min(14, (os.cpu_count() or 4) - 2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply each family's default instance count")
    parser.add_argument("--families", default="", help="comma-separated families (default: all)")
    parser.add_argument("--lanes", type=int, default=0, help="judging lanes on the GPU (0: a core each, at most 14)")
    parser.add_argument("--batch-size", type=int, default=24, help="extensions built together in one library")
    parser.add_argument("--include-held-out", action="store_true", help="judge the held-out families too")
    parser.add_argument("--limit", type=int, default=0, help="judge only the first N jobs (a smoke run)")
    parser.add_argument("--warmup-min-seconds", type=float, default=0.05)
    return parser.parse_args(argv)


def verify_config_for(args: argparse.Namespace, out: Path) -> VerifyConfig:
    """The synthetic settings (the keys the asset looks up) with this host's lanes, a core a lane for the GPU
    workers as the KernelVerifier resource gives them (the default keeps 2 for all lanes), and OUT's store."""
    lanes = args.lanes or default_lanes()
    return synthetic_verify_config(VerifyConfig(
        verdict_store_dir=str(out / "store"), gpu_lanes=lanes, gpu_worker_cpus=lanes,
        build_batch_size=args.batch_size, warmup_min_seconds=args.warmup_min_seconds,
        build_cache_dir=str(out / "builds")))


def judging_order(instances):
    """A sort key for the jobs: families take turns, so a run cut short by its time limit has judged a share of
    every family; within a family's turn, all instances of one CUDA design together, so a build group holds few
    distinct extensions and the first verdicts come after a short build (instances of a design share their
    extension byte-for-byte)."""
    design_rank: dict[tuple[str, str], int] = {}
    designs_seen: Counter = Counter()  # a family's designs ranked by their first instance
    for instance in sorted(instances, key=lambda i: (i.family, i.index)):
        key = (instance.family, instance.design_id)
        if key not in design_rank:
            design_rank[key] = designs_seen[instance.family]
            designs_seen[instance.family] += 1
    turn = {i.task_id: (design_rank[i.family, i.design_id], i.family, i.index) for i in instances}
    return lambda job: turn[job.job_id]


def summarize(rows: list[dict], wall_s: float, config: VerifyConfig) -> dict:
    by_family: dict[str, Counter] = defaultdict(Counter)
    speedups: dict[str, list[float]] = defaultdict(list)
    phases: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_family[row["family"]][row["status"]] += 1
        if row["status"] == "correct" and row["speedup"] is not None:
            speedups[row["family"]].append(row["speedup"])
        for phase, seconds in (row.get("phase_seconds") or {}).items():
            if isinstance(seconds, (int, float)):
                phases[phase].append(seconds)
    families = {}
    for family in sorted(by_family):
        values = sorted(speedups[family])
        families[family] = {
            "judged": sum(by_family[family].values()), "by_status": dict(by_family[family]),
            "correct_at_or_above_2x": sum(v >= 2.0 for v in values), "correct_at_or_above_1x": sum(v >= 1.0 for v in values),
            "speedup_median": round(statistics.median(values), 3) if values else None,
            "speedup_p10_p90": [round(values[len(values) // 10], 3), round(values[(9 * len(values)) // 10], 3)]
            if values else None}
    gpus = gpu_inventory()
    return {
        "gpu": gpus[0].name if gpus else None, "judged": len(rows), "wall_s": round(wall_s, 1),
        "candidates_per_minute": round(60 * len(rows) / wall_s, 1) if wall_s else None,
        "from_store": sum(1 for r in rows if r.get("from_store")),
        "by_status": dict(Counter(r["status"] for r in rows)),
        "correct_at_or_above_2x": sum(f["correct_at_or_above_2x"] for f in families.values()),
        "families": families,
        "phase_seconds": {k: {"n": len(v), "sum": round(sum(v), 1), "median": round(statistics.median(v), 3)}
                          for k, v in sorted(phases.items())},
        "settings": {**SYNTHETIC_VERIFY_OVERRIDES, "gpu_lanes": config.gpu_lanes,
                     "build_batch_size": config.build_batch_size, "warmup_min_seconds": config.warmup_min_seconds},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = [f for f in args.families.split(",") if f] or None
    instances = generate_operator_instances(args.seed, families=families, scale=args.scale)
    family_of = {i.task_id: i.family for i in instances}
    jobs = [VerifyJob(*job) for job in verification_jobs(instances, args.include_held_out)]
    jobs.sort(key=judging_order(instances))
    if args.limit:
        jobs = jobs[:args.limit]
    config = verify_config_for(args, out)
    print(f"{len(jobs)} jobs from {len(instances)} instances, {config.gpu_lanes} lanes", flush=True)
    rows: list[dict] = []
    start = time.perf_counter()
    log = (out / "verdicts.jsonl").open("a")

    def record(job: VerifyJob, verdict) -> None:
        provenance = verdict.provenance or {}
        row = {"job_id": job.job_id, "family": family_of[job.job_id], "status": verdict.status.value,
               "speedup": verdict.speedup, "reasons": verdict.reason_codes(), "flags": list(verdict.flags),
               "from_store": bool(provenance.get("from_verdict_store")),
               "phase_seconds": provenance.get("phase_seconds"), "at_s": round(time.perf_counter() - start, 2)}
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(f"[{len(rows)}/{len(jobs)} {row['at_s']:.0f}s] {job.job_id}: {verdict.summary()}", flush=True)

    verify_batch(jobs, config, on_result=record)
    wall = time.perf_counter() - start
    packed = pack_verdict_store(out / "store", out / "synthetic_verdicts.jsonl.gz")
    summary = {**summarize(rows, wall, config), "packed_verdicts": packed, "seed": args.seed, "scale": args.scale}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "families"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
