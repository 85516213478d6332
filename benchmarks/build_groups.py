"""Cold builds of many candidates, alone against in groups (VerifyConfig.build_batch_size), in one run on one host:
the seed corpus's candidates built twice from empty caches by `verify_batch` with execution off (every build
on the build cores, nothing on the GPU), then, optionally, a few of the grouped builds judged on the GPU.

    python benchmarks/build_groups.py OUT [--batch-size 8] [--limit N] [--judge N]

Prints and writes OUT/build_groups.json: wall seconds of each build phase and their ratio, the build statuses of
both runs side by side (they must agree candidate by candidate), each group's attempts, and the verdicts of the
judged candidates beside the seed corpus's recorded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch  # noqa: E402


def build_phase(jobs: list[VerifyJob], batch_size: int, cache_dir: str) -> tuple[float, list]:
    config = VerifyConfig(build_cache_dir=cache_dir, execute=False, verdict_store_dir=None,
                          build_batch_size=batch_size)
    start = time.perf_counter()
    verdicts = verify_batch(jobs, config)
    return time.perf_counter() - start, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=0, help="only the first N seed pairs (0: all)")
    parser.add_argument("--judge", type=int, default=0, help="judge the first N grouped candidates on the GPU")
    args = parser.parse_args()
    from dice_pipeline.seed_corpus import load_seed_pairs

    args.out.mkdir(parents=True, exist_ok=True)
    pairs = load_seed_pairs()[: args.limit or None]
    jobs = [VerifyJob(p["uuid"], p["pytorch_code"], p["generated_code"]) for p in pairs]
    names = [p["problem_name"] for p in pairs]
    alone_cache = tempfile.mkdtemp(prefix="dice_builds_alone_")
    grouped_cache = tempfile.mkdtemp(prefix="dice_builds_grouped_")
    print(f"{len(jobs)} candidates, {os.cpu_count()} cores; building alone ...", flush=True)
    alone_s, alone = build_phase(jobs, 1, alone_cache)
    print(f"alone: {alone_s:.1f} s; building in groups of up to {args.batch_size} ...", flush=True)
    grouped_s, grouped = build_phase(jobs, args.batch_size, grouped_cache)
    print(f"grouped: {grouped_s:.1f} s", flush=True)
    rows = []
    for name, a, g in zip(names, alone, grouped):
        builds = g.provenance.get("builds") or []
        rows.append({"problem_name": name, "alone": a.status.value, "grouped": g.status.value,
                     "variant": builds[0]["variant"] if builds else None,
                     "alone_compile_s": a.compile_seconds, "grouped_stage_compile_s": g.compile_seconds,
                     "group": g.provenance.get("build_group")})
    groups = {json.dumps(r["group"], sort_keys=True) for r in rows if r["group"]}
    summary = {
        "candidates": len(jobs), "host_cpus": os.cpu_count(), "batch_size": args.batch_size,
        "alone_wall_s": round(alone_s, 1), "grouped_wall_s": round(grouped_s, 1),
        "ratio": round(alone_s / grouped_s, 2),
        "built_in_a_group": sum(r["variant"] == "batched" for r in rows),
        "groups": [json.loads(g) for g in sorted(groups)],
        "statuses_agree": all(r["alone"] == r["grouped"] for r in rows),
        "disagreements": [r for r in rows if r["alone"] != r["grouped"]],
        "rows": rows,
    }
    if args.judge:
        judged = [i for i, r in enumerate(rows) if r["variant"] == "batched" and r["grouped"] == "not_executed"]
        judged = judged[: args.judge]
        recorded = {p["uuid"]: p.get("measurement_status") or p.get("intended_outcome") for p in pairs}
        config = VerifyConfig(build_cache_dir=grouped_cache, verdict_store_dir=None, build_batch_size=args.batch_size)
        start = time.perf_counter()
        verdicts = verify_batch([jobs[i] for i in judged], config)
        summary["judged"] = {
            "wall_s": round(time.perf_counter() - start, 1),
            "rows": [{"problem_name": names[i], "status": v.status.value, "speedup": v.speedup,
                      "recorded": recorded[jobs[i].job_id], "reasons": v.reason_codes(),
                      "builds": v.provenance.get("builds")} for i, v in zip(judged, verdicts)]}
    (args.out / "build_groups.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
