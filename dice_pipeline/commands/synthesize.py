"""`dice synthesize --out DIR`: structure synthesis outside Dagster (e.g. on a GPU host with torch alone): generate
candidates for the Attention/MLP catalogue, verify each, and write every candidate row (kept or not, and why) to
DIR/structure_instances.jsonl with a summary. With `--verdict-store`, the executed verdicts land in a store that
`dice run --verdict-store` on another host reuses, so its `structure_instances` asset gets the same verdicts.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from dice_pipeline import settings
from dice_pipeline.cli import summary


def register(subparsers) -> None:
    from dice_pipeline.synthesis.backends import BACKENDS

    parser = subparsers.add_parser("synthesize", help="generate and verify structure-catalogue kernels (no Dagster)",
                                   description=summary(__doc__))
    parser.add_argument("--out", type=Path, required=True, help="directory for structure_instances.jsonl")
    parser.add_argument("--family", action="append", default=None, help="catalogue family (repeatable; default all)")
    parser.add_argument("--n-per-task", type=int, default=1, help="candidates per task (default 1, as the asset)")
    parser.add_argument("--min-speedup", type=float, default=1.0, help="keep correct candidates at least this fast")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=BACKENDS, default="templates")
    parser.add_argument("--base-url", default="", help="openai backend (default $DICE_GENERATOR_BASE_URL)")
    parser.add_argument("--model", default="", help="openai backend (default $DICE_GENERATOR_MODEL)")
    parser.add_argument("--checkpoint", default="", help="checkpoint backend: model directory")
    parser.add_argument("--verdict-store", default="", help="verdict store directory to reuse and fill")
    parser.add_argument("--cache-dir", default=None, help="build cache (default $DICE_VERIFY_CACHE or ~/.cache/...)")
    parser.add_argument("--no-execute", action="store_true", help="do not run candidates, even with a GPU")
    parser.add_argument("--compile-without-gpu", action="store_true",
                        help="where nothing runs, still build every candidate with nvcc (default: static checks only)")
    parser.set_defaults(func=run_synthesize)


def run_synthesize(args: argparse.Namespace) -> int:
    from dice_pipeline.synthesis import structure_catalogue, synthesize_structure_instances
    from dice_pipeline.synthesis.backends import make_generator
    from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch

    try:
        tasks = structure_catalogue(args.family)
        generator = make_generator(args.backend, base_url=args.base_url, model=args.model,
                                   api_key=settings.GENERATOR_API_KEY.get(),
                                   checkpoint_path=args.checkpoint)
    except ValueError as error:  # unknown family, backend settings missing
        print(f"dice synthesize: {error}", file=sys.stderr)
        return 2
    overrides = {"build_cache_dir": args.cache_dir} if args.cache_dir else {}
    config = VerifyConfig(execute=False if args.no_execute else None, build_without_gpu=args.compile_without_gpu,
                          verdict_store_dir=args.verdict_store or None, **overrides)

    def verify(jobs):
        def report(job, verdict):
            print(f"{job.job_id}: {verdict.summary()}", flush=True)

        return verify_batch([VerifyJob(*job) for job in jobs], config, on_result=report)

    started = time.perf_counter()
    print(f"{len(tasks)} catalogue tasks x {args.n_per_task} candidates from {args.backend}", flush=True)
    rows = synthesize_structure_instances(tasks, generator, verify, args.n_per_task, args.min_speedup, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "structure_instances.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    kept = [r for r in rows if r["kept"]]
    summary = {
        "tasks": len(tasks), "candidates": len(rows), "kept": len(kept),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "statuses": dict(collections.Counter(r["status"] or r["reject_reason"] for r in rows)),
        "reject_reasons": dict(collections.Counter(r["reject_reason"] for r in rows if not r["kept"])),
        "kept_by_family": dict(collections.Counter(r["family"] for r in kept)),
        "speedups": {r["job_id"]: r["speedup"] for r in rows if r["speedup"] is not None},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(json.dumps({k: v for k, v in summary.items() if k != "speedups"}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    from dice_pipeline.cli import main

    sys.exit(main(["synthesize", *sys.argv[1:]]))
