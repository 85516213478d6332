"""`dice eval`: KernelBench evaluation of registered models, through the Dagster assets (so results, lineage and
the comparison report land in the warehouse and the UI).

    dice eval add-checkpoint NAME PATH          a from_pretrained directory (ours, SDAR, any causal LM)
    dice eval add-endpoint NAME --base-url URL --model M   an OpenAI-compatible endpoint (comparison row)
    dice eval list
    dice eval run NAME [--level 1 --level 2 ...]  tasks + local baselines per level, then NAME x level, then report
    dice eval report                             print the comparison report (artifacts/kernelbench/comparison.md)

Each model is a partition of `eval_checkpoint`; each level a partition of `level`: a new checkpoint evaluates alone,
and an interrupted evaluation resumes from its state directory without judging finished tasks again.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate models on KernelBench (levels 1-3) and compare them",
                                   description=__doc__.splitlines()[0], epilog=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="eval_command", required=True, metavar="ACTION")
    add = sub.add_parser("add-checkpoint", help="register a from_pretrained directory under NAME")
    add.add_argument("name")
    add.add_argument("path")
    add.add_argument("--decoding", choices=["auto", "block_diffusion", "autoregressive"], default="auto")
    add.set_defaults(func=add_checkpoint)
    endpoint = sub.add_parser("add-endpoint", help="register an OpenAI-compatible endpoint under NAME")
    endpoint.add_argument("name")
    endpoint.add_argument("--base-url", required=True)
    endpoint.add_argument("--model", required=True)
    endpoint.set_defaults(func=add_endpoint)
    listing = sub.add_parser("list", help="registered models")
    listing.set_defaults(func=list_models)
    run = sub.add_parser("run", help="evaluate NAME on the given levels (default 1)")
    run.add_argument("name")
    run.add_argument("--level", type=int, action="append", choices=[1, 2, 3], default=None)
    run.add_argument("--tasks", default="", help="hf:ScalingIntelligence/KernelBench, a tasks.jsonl or a checkout's "
                                                 "KernelBench/ (default: $DICE_KERNELBENCH_TASKS or the shared copy)")
    run.add_argument("--max-new-tokens", type=int, default=4096)
    run.add_argument("--samples", type=int, default=1, help="> 1: pass@k samples at --temperature")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--batch-size", type=int, default=16)
    run.add_argument("--execute", choices=["auto", "always", "never"], default="auto")
    run.add_argument("--skip-baselines", action="store_true", help="reuse the level's tasks and baselines as stored")
    run.set_defaults(func=run_evaluation)
    report = sub.add_parser("report", help="materialize and print the comparison report")
    report.set_defaults(func=print_report)


def _register(model) -> int:
    from dice_pipeline.evaluation.registry import register
    from dice_pipeline.paths import ensure_dagster_home

    ensure_dagster_home()
    import dagster as dg

    from dice_pipeline import definitions

    path = register(model)
    instance = dg.DagsterInstance.get()
    partitions = definitions.keys.EVAL_CHECKPOINT_PARTITIONS
    if model.name not in set(instance.get_dynamic_partitions(partitions.name)):
        instance.add_dynamic_partitions(partitions.name, [model.name])
    print(f"registered {model.name} ({model.kind}) in {path}; partition {model.name} added")
    return 0


def add_checkpoint(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dice_pipeline.evaluation.registry import EvalModel

    if not Path(args.path).is_dir():
        print(f"dice eval: {args.path} is not a directory", file=sys.stderr)
        return 2
    return _register(EvalModel(args.name, path=str(Path(args.path).resolve()), decoding=args.decoding))


def add_endpoint(args: argparse.Namespace) -> int:
    from dice_pipeline.evaluation.registry import EvalModel

    return _register(EvalModel(args.name, kind="endpoint", base_url=args.base_url, model=args.model))


def list_models(args: argparse.Namespace) -> int:
    from dice_pipeline.evaluation.registry import load_registry

    for name, model in sorted(load_registry().items()):
        print(f"{name}\t{model.kind}\t{model.path or model.base_url + ' ' + model.model}\t{model.decoding}")
    return 0


def run_evaluation(args: argparse.Namespace) -> int:
    from dice_pipeline.evaluation.registry import resolve
    from dice_pipeline.paths import ensure_dagster_home

    ensure_dagster_home()
    resolve(args.name)  # fails early, with the command to run, for an unregistered name
    import dagster as dg

    from dice_pipeline import definitions

    instance = dg.DagsterInstance.get()
    resources = {"resources": {"verifier": {"config": {"execute": args.execute}}}}
    ok = True
    for level in dict.fromkeys(args.level or [1]):
        if not args.skip_baselines:
            result = definitions.defs.resolve_job_def(definitions.kernelbench_level_job.name).execute_in_process(
                run_config={"ops": {"kernelbench_tasks": {"config": {"source": args.tasks}}}, **resources},
                instance=instance, partition_key=str(level), raise_on_error=False)
            print(f"level {level} tasks + baselines: run {result.run_id} {'succeeded' if result.success else 'FAILED'}")
            ok = ok and result.success
        config = {"max_new_tokens": args.max_new_tokens, "samples": args.samples, "temperature": args.temperature,
                  "batch_size": args.batch_size}
        result = definitions.defs.resolve_job_def(definitions.kernelbench_eval_job.name).execute_in_process(
            run_config={"ops": {"kernelbench_evaluation": {"config": config}}, **resources}, instance=instance,
            partition_key=dg.MultiPartitionKey({"checkpoint": args.name, "level": str(level)}), raise_on_error=False)
        print(f"{args.name} level {level}: run {result.run_id} {'succeeded' if result.success else 'FAILED'}")
        ok = ok and result.success
    return print_report(args) if ok else 1


def print_report(args: argparse.Namespace) -> int:
    from dice_pipeline.paths import artifacts_dir, ensure_dagster_home

    ensure_dagster_home()
    import dagster as dg

    from dice_pipeline import definitions

    result = definitions.defs.resolve_job_def(definitions.kernelbench_report_job.name).execute_in_process(
        instance=dg.DagsterInstance.get(), raise_on_error=False)
    if not result.success:
        print("dice eval: the report run failed", file=sys.stderr)
        return 1
    print((artifacts_dir() / "kernelbench" / "comparison.md").read_text())
    return 0
