"""Cold builds of many candidates, two ways in one run on one host: the candidates built twice from empty caches by
`verify_batch` with execution off (every build on the build cores, nothing on the GPU), then, optionally, a few of
the grouped builds judged on the GPU.

    python benchmarks/build_groups.py OUT [--compare alone|light] [--candidates seed|seed+structures]
                                          [--batch-size 8] [--limit N] [--judge N]

--compare alone (default): each candidate alone (build_batch_size=1) against groups of --batch-size.
--compare light: groups of --batch-size both times, without and then with the light CUDA headers
(VerifyConfig.light_cuda_headers; build_cache.light_cuda_sources).
Prints and writes OUT/build_groups.json: wall seconds of each build phase and their ratio, the build statuses of
both runs side by side (they must agree candidate by candidate), the variant each candidate was built as, each
group's attempts, and the verdicts of the judged candidates beside the seed corpus's recorded ones.
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


def build_phase(jobs: list[VerifyJob], batch_size: int, cache_dir: str, light: bool = True) -> tuple[float, list]:
    config = VerifyConfig(build_cache_dir=cache_dir, execute=False, verdict_store_dir=None,
                          build_batch_size=batch_size, light_cuda_headers=light)
    start = time.perf_counter()
    verdicts = verify_batch(jobs, config)
    return time.perf_counter() - start, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=0, help="only the first N seed pairs (0: all)")
    parser.add_argument("--judge", type=int, default=0, help="judge the first N grouped candidates on the GPU")
    parser.add_argument("--compare", choices=("alone", "light"), default="alone")
    parser.add_argument("--candidates", choices=("seed", "seed+structures"), default="seed")
    args = parser.parse_args()
    from dice_pipeline.seed_corpus import load_seed_pairs

    args.out.mkdir(parents=True, exist_ok=True)
    pairs = load_seed_pairs()
    if args.candidates == "seed+structures":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from verify_throughput import structure_pairs

        pairs += structure_pairs()
    pairs = pairs[: args.limit or None]
    jobs = [VerifyJob(p["uuid"], p["pytorch_code"], p["generated_code"]) for p in pairs]
    names = [p["problem_name"] for p in pairs]
    # The two phases: (label, batch size, light headers); the second is the one under test.
    phases = ([("alone", 1, True), ("grouped", args.batch_size, True)] if args.compare == "alone" else
              [("trimmed", args.batch_size, False), ("light", args.batch_size, True)])
    walls, verdicts, caches = {}, {}, {}
    print(f"{len(jobs)} candidates, {os.cpu_count()} cores", flush=True)
    for label, batch_size, light in phases:
        print(f"building: {label} (groups of up to {batch_size}, light headers {light}) ...", flush=True)
        caches[label] = tempfile.mkdtemp(prefix=f"dice_builds_{label}_")
        walls[label], verdicts[label] = build_phase(jobs, batch_size, caches[label], light)
        print(f"{label}: {walls[label]:.1f} s", flush=True)
    (first, _, _), (second, _, _) = phases
    rows = []
    for name, a, g in zip(names, verdicts[first], verdicts[second]):
        builds = g.provenance.get("builds") or []
        group = g.provenance.get("build_group") or {}
        rows.append({"problem_name": name, first: a.status.value, second: g.status.value,
                     "variant": builds[0]["variant"] if builds else None,
                     "group_variant": next((x.get("variant") for x in group.get("attempts", []) if x.get("built")),
                                           None),
                     f"{first}_compile_s": a.compile_seconds, f"{second}_stage_compile_s": g.compile_seconds,
                     "group": group or None})
    groups = {json.dumps(r["group"], sort_keys=True) for r in rows if r["group"]}
    summary = {
        "candidates": len(jobs), "candidates_set": args.candidates, "host_cpus": os.cpu_count(),
        "batch_size": args.batch_size, "compare": args.compare,
        f"{first}_wall_s": round(walls[first], 1), f"{second}_wall_s": round(walls[second], 1),
        "ratio": round(walls[first] / walls[second], 2),
        "built_in_a_group": sum(r["variant"] == "batched" for r in rows),
        "groups": [json.loads(g) for g in sorted(groups)],
        "statuses_agree": all(r[first] == r[second] for r in rows),
        "disagreements": [r for r in rows if r[first] != r[second]],
        "rows": rows,
    }
    if args.judge:
        judged = [i for i, r in enumerate(rows) if r["variant"] == "batched" and r[second] == "not_executed"]
        judged = judged[: args.judge]
        recorded = {p["uuid"]: p.get("measurement_status") or p.get("intended_outcome") for p in pairs}
        config = VerifyConfig(build_cache_dir=caches[second], verdict_store_dir=None, build_batch_size=args.batch_size)
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
