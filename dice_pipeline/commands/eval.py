"""`dice eval`: KernelBench evaluation of registered models, through the Dagster assets (so results, lineage and
the comparison report land in the warehouse and the UI).

    dice eval add-checkpoint NAME PATH          a from_pretrained directory (ours, SDAR, any causal LM)
    dice eval add-endpoint NAME --base-url URL --model M   an OpenAI-compatible endpoint (comparison row)
    dice eval list
    dice eval run NAME [--level 1 --level 2 ...]  tasks + local baselines per level, then NAME x level, then report
    dice eval report                             print the comparison report (artifacts/kernelbench/comparison.md)

Each model is a partition of `eval_checkpoint`; each level a partition of `level`: a new checkpoint evaluates alone,
and an interrupted evaluation (Ctrl-C included) resumes from its state directory without generating or judging a
finished task again: rerun the same command.

The defaults are the paper's protocol (4096 new tokens, batches of 16): hours on a GPU, far more on a CPU. A smoke
test on a CPU: dice eval run NAME --level 1 --max-tasks 3 --max-new-tokens 64 --batch-size 1
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from dice_pipeline.cli import details, summary


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate models on KernelBench (levels 1-3) and compare them",
                                   description=textwrap.fill(summary(__doc__), 100), epilog=details(__doc__),
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
    run = sub.add_parser("run", help="evaluate NAME on the given levels (default 1)",
                         description="Evaluate NAME on each --level (default 1): the level's tasks and baselines, then "
                                     "NAME on them, then the comparison report. Progress bars on stderr; Ctrl-C "
                                     "stops, and the same command resumes where it stopped. The defaults are the "
                                     "paper's protocol; a smoke test on a CPU: --max-tasks 3 --max-new-tokens 64 "
                                     "--batch-size 1.")
    run.add_argument("name")
    run.add_argument("--level", type=int, action="append", choices=[1, 2, 3], default=None)
    run.add_argument("--tasks", default="", help="hf:ScalingIntelligence/KernelBench, a tasks.jsonl or a checkout's "
                                                 "KernelBench/ (default: $DICE_KERNELBENCH_TASKS or the shared copy)")
    run.add_argument("--max-new-tokens", type=_positive_int, default=4096,
                     help="tokens a model may write per answer (default 4096, the paper's; a CPU smoke test: 64)")
    run.add_argument("--samples", type=_positive_int, default=1, help="> 1: pass@k samples at --temperature")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--batch-size", type=_positive_int, default=16, help="tasks decoded together (a CPU: 1)")
    run.add_argument("--max-tasks", type=_positive_int, default=None, metavar="N",
                     help="evaluate only each level's first N tasks (a smoke test; the report marks the level "
                          "incomplete)")
    run.add_argument("--execute", choices=["auto", "always", "never"], default="auto")
    run.add_argument("--skip-baselines", action="store_true", help="reuse the level's tasks and baselines as stored")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="show Dagster's event stream (off by default: progress bars and one line a run)")
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
    try:
        model = EvalModel(args.name, path=str(Path(args.path).resolve()), decoding=args.decoding)
    except ValueError as exc:  # a name that cannot be a partition key
        print(f"dice eval: {exc}", file=sys.stderr)
        return 2
    return _register(model)


def add_endpoint(args: argparse.Namespace) -> int:
    from dice_pipeline.evaluation.registry import EvalModel

    try:
        model = EvalModel(args.name, kind="endpoint", base_url=args.base_url, model=args.model)
    except ValueError as exc:
        print(f"dice eval: {exc}", file=sys.stderr)
        return 2
    return _register(model)


def list_models(args: argparse.Namespace) -> int:
    from dice_pipeline.evaluation.registry import load_registry

    for name, model in sorted(load_registry().items()):
        print(f"{name}\t{model.kind}\t{model.path or model.base_url + ' ' + model.model}\t{model.decoding}")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


_positive_int.__name__ = "positive integer"  # argparse names the type in its one-line error


# The paper's generation length: the default, and on a CPU far too long for anything but a very long wait.
PAPER_MAX_NEW_TOKENS = 4096


def run_evaluation(args: argparse.Namespace) -> int:
    from dice_pipeline.commands.instance import command_line_instance, interrupted, quiet_run_config, tidy_instance
    from dice_pipeline.evaluation.registry import resolve
    from dice_pipeline.paths import ensure_dagster_home

    ensure_dagster_home()
    try:
        model = resolve(args.name)  # fails early, with the command to run, for an unregistered name
    except KeyError as exc:
        print(f"dice eval: {exc.args[0]}", file=sys.stderr)
        return 2
    import dagster as dg

    from dice_pipeline import definitions
    from dice_pipeline.run_health import process_tags

    config = {"max_new_tokens": args.max_new_tokens, "samples": args.samples, "temperature": args.temperature,
              "batch_size": args.batch_size, "max_tasks": args.max_tasks or 0}
    eval_config = definitions.evaluation.EvaluationConfig(**config)
    try:
        settings = eval_config.generation_settings(model)  # a bad combination is one line here, not a failed run
    except ValueError as exc:
        print(f"dice eval: {exc}", file=sys.stderr)
        return 2
    _warn_if_slow_on_this_host(args)
    if not args.verbose:  # the evaluation's own progress bars stay; loaders' bars and Dagster's stream do not
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    instance = command_line_instance()
    for line in tidy_instance(instance):
        print(f"dice eval: {line}")
    run_config = {"resources": {"verifier": {"config": {"execute": args.execute}}},
                  **({} if args.verbose else quiet_run_config())}
    ok = True
    for level in dict.fromkeys(args.level or [1]):
        if not args.skip_baselines:
            result = definitions.defs.resolve_job_def(definitions.kernelbench_level_job.name).execute_in_process(
                run_config={"ops": {"kernelbench_tasks": {"config": {"source": args.tasks}}}, **run_config},
                instance=instance, partition_key=str(level), raise_on_error=False, tags=process_tags())
            if interrupted(result, instance):
                return _say_interrupted(f"level {level} tasks + baselines", None)
            print(f"level {level} tasks + baselines: run {result.run_id} {'succeeded' if result.success else 'FAILED'}"
                  + _first_failure(result))
            ok = ok and result.success
        result = definitions.defs.resolve_job_def(definitions.kernelbench_eval_job.name).execute_in_process(
            run_config={"ops": {"kernelbench_evaluation": {"config": config}}, **run_config}, instance=instance,
            partition_key=dg.MultiPartitionKey({"checkpoint": args.name, "level": str(level)}), raise_on_error=False,
            tags=process_tags())
        if interrupted(result, instance):
            from dice_pipeline.evaluation.runner import default_state_dir

            return _say_interrupted(f"{args.name} level {level}", default_state_dir(model, settings, level))
        print(f"{args.name} level {level}: run {result.run_id} {'succeeded' if result.success else 'FAILED'}"
              + _first_failure(result))
        ok = ok and result.success
    return print_report(args) if ok else 1


def _warn_if_slow_on_this_host(args: argparse.Namespace) -> None:
    """The paper's settings on a host without a GPU: say so, once, with the settings of a smoke test."""
    from dice_pipeline.verify import gpu_inventory

    if args.execute != "always" and not gpu_inventory() and args.max_new_tokens >= PAPER_MAX_NEW_TOKENS \
            and not args.max_tasks:
        print(f"dice eval: no GPU here: at {args.max_new_tokens} new tokens a task takes many minutes on a CPU; a "
              "smoke test: --max-tasks 3 --max-new-tokens 64 --batch-size 1 (Ctrl-C stops, the same command "
              "resumes)", file=sys.stderr, flush=True)


def _say_interrupted(what: str, state_dir) -> int:
    from dice_pipeline.evaluation.runner import stored_progress

    kept = ""
    if state_dir is not None:
        generations, verdicts = stored_progress(state_dir)
        kept = f": {generations} generations and {verdicts} verdicts are kept in {state_dir}"
    print(f"dice eval: interrupted during {what}{kept}; rerun the same command to resume", file=sys.stderr)
    return 130  # the shell's status for a process stopped by Ctrl-C


def _first_failure(result) -> str:
    """The first failed step's own message, so a failed run says why in its one line."""
    for event in result.get_step_failure_events():
        data = event.step_failure_data
        error = data.user_failure_data.description if data.user_failure_data else None
        if error is None and data.error is not None:
            error = (data.error.cause or data.error).message
        if error:
            return f": {event.step_key}: {error.strip().splitlines()[0]}"
    return ""


def print_report(args: argparse.Namespace) -> int:
    from dice_pipeline import definitions
    from dice_pipeline.commands.instance import command_line_instance, quiet_run_config
    from dice_pipeline.paths import artifacts_dir

    result = definitions.defs.resolve_job_def(definitions.kernelbench_report_job.name).execute_in_process(
        instance=command_line_instance(), raise_on_error=False,
        run_config={} if getattr(args, "verbose", False) else quiet_run_config())
    if not result.success:
        print("dice eval: the report run failed", file=sys.stderr)
        return 1
    print((artifacts_dir() / "kernelbench" / "comparison.md").read_text())
    return 0
