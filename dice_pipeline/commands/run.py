"""`dice run`: materialize the main job (ingest -> verify -> filter -> curate) into the persistent Dagster instance,
so the runs, partitions and lineage it makes are there when you open `dice dev`."""

from __future__ import annotations

import argparse

from dice_pipeline.filtering import PAPER_THRESHOLD, canonical_threshold_key


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run the main job (default: embedded seed corpus, threshold 2.0)",
                                   description=__doc__)
    parser.add_argument("--source", default="",
                        help="ConCuR source: embedded (default), hf:lkongam/ConCuR, or a path to .arrow/.parquet/"
                             ".jsonl/a save_to_disk dir (default: $DICE_CONCUR_SOURCE or embedded)")
    parser.add_argument("--threshold", action="append", default=None, metavar="X",
                        help=f"speedup threshold(s) to filter at; repeat for several (default {PAPER_THRESHOLD})")
    parser.add_argument("--execute", choices=["auto", "always", "never"], default="auto",
                        help="run candidates on a GPU: auto (if one is present), always, never")
    parser.add_argument("--compile-without-gpu", action="store_true",
                        help="where no GPU is present, still build every candidate with nvcc (1-3 min each on a "
                             "2-core machine); default: static checks only there")
    parser.add_argument("--verdict-store", default="", metavar="DIR",
                        help="reuse executed verdicts from this store (e.g. one filled by the verifier on a GPU "
                             "host) and add new ones to it (default: the project cache's store)")
    parser.add_argument("--accept-verdicts-from", action="append", default=[], metavar="VERSION",
                        help="where the store has no verdict of this verifier version, use one of this older "
                             "version (e.g. 0.2.0); such verdicts are flagged older_verifier_version")
    parser.set_defaults(func=run_main_job)


def run_main_job(args: argparse.Namespace) -> int:
    from dice_pipeline.paths import ensure_dagster_home

    home = ensure_dagster_home()
    import dagster as dg

    from dice_pipeline import definitions

    thresholds = [canonical_threshold_key(t) for t in (args.threshold or [PAPER_THRESHOLD])]
    instance = dg.DagsterInstance.get()
    partitions = definitions.keys.THRESHOLD_PARTITIONS
    existing = set(instance.get_dynamic_partitions(partitions.name))
    new = [t for t in dict.fromkeys(thresholds) if t not in existing]
    if new:
        instance.add_dynamic_partitions(partitions.name, new)

    job = definitions.defs.resolve_job_def(definitions.main_job.name)
    run_config = {
        "ops": {"concur_ingestion": {"config": {"source": args.source}}},
        "resources": {"verifier": {"config": {"execute": args.execute,
                                              "compile_without_gpu": args.compile_without_gpu,
                                              "verdict_store_dir": _verdict_store_dir(args.verdict_store),
                                              "accept_verdicts_from": list(args.accept_verdicts_from)}}},
    }
    ok = True
    for index, threshold in enumerate(dict.fromkeys(thresholds)):
        # Ingestion and verification do not depend on the threshold: run them once, then only the partitioned part.
        selection = None if index == 0 else definitions.THRESHOLD_DEPENDENT_ASSETS
        result = job.execute_in_process(
            run_config=run_config if index == 0 else {"resources": run_config["resources"]},
            instance=instance,
            partition_key=threshold,
            asset_selection=selection,
            raise_on_error=False,
        )
        print(f"threshold {threshold}: run {result.run_id} {'succeeded' if result.success else 'FAILED'}")
        ok = ok and result.success
    print(f"Dagster home: {home}  (open the UI with `dice dev`)")
    return 0 if ok else 1


def _verdict_store_dir(path: str) -> str:
    """The --verdict-store directory as an absolute path (it must exist), or "" for the default store."""
    from pathlib import Path

    if path and not Path(path).is_dir():
        raise SystemExit(f"dice run: --verdict-store {path}: no such directory")
    return str(Path(path).resolve()) if path else ""
