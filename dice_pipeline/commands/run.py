"""`dice run`: materialize the main job (ingest -> verify -> filter -> curate) into the persistent Dagster instance,
so the runs, partitions and lineage it makes are there when you open `dice dev`.

Prints a short summary (rows in, accepted, rejected by reason, kept per threshold, checks failed, what was refused
or not run). Exit status: 0 when every step ran and every check passed; 1 when a step failed, a check failed, an
overwrite was refused or no pair was accepted; 2 when the command line is wrong (a threshold that is not a
positive number) or the source cannot be read (missing, unreadable, an unknown format): one line says why, and no
run is started.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from dice_pipeline.thresholds import PAPER_THRESHOLD, SpeedupThreshold, ThresholdError

EXIT_OK, EXIT_FAILED, EXIT_SOURCE_ERROR = 0, 1, 2
EXIT_USAGE = 2  # a wrong argument: the same status argparse gives
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run the main job (default: embedded seed corpus, threshold 2.0)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="",
                        help="ConCuR source: embedded (default), hf:lkongam/ConCuR, or a path to .arrow/.parquet/"
                             ".jsonl/a save_to_disk dir (default: $DICE_CONCUR_SOURCE or embedded)")
    parser.add_argument("--threshold", action="append", default=None, metavar="X",
                        help=f"speedup threshold(s) to filter at, a positive number; repeat for several (default "
                             f"{PAPER_THRESHOLD}). Each is named by its canonical key: 2 and 2.00 are partition 2.0")
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
    parser.add_argument("--allow-source-change", action="store_true",
                        help="replace pairs ingested from another source (partitions built from the old one are "
                             "then marked stale in lineage.table_sources until rebuilt)")
    parser.add_argument("--allow-empty", action="store_true",
                        help="write a source with no accepted pair (its blocking check still stops downstream)")
    parser.add_argument("--force", action="store_true", help="both --allow-source-change and --allow-empty")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show Dagster's event stream and warnings (off by default: a summary is printed)")
    parser.set_defaults(func=run_main_job)


@dataclass
class RunSummary:
    """What the runs of one `dice run` did, gathered from their Dagster events."""

    source: str = ""
    source_sha256: str = ""
    rows_read: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    kept: dict[str, tuple[int, int]] = field(default_factory=dict)  # threshold -> (kept, decisions)
    cuke_samples: dict[str, int] = field(default_factory=dict)
    cuke_by_source: dict[str, dict[str, int]] = field(default_factory=dict)
    synthetic: dict[str, int] = field(default_factory=dict)  # judged, from stored verdicts, executed here
    failed_checks: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    source_errors: list[str] = field(default_factory=list)
    step_failures: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    runs: list[tuple[str, str, bool]] = field(default_factory=list)  # (threshold, run id, success)

    def add(self, threshold: str, result, instance, partitioned_assets=()) -> None:
        """Add one run's events; `partitioned_assets` (asset keys) are named with the run's threshold."""
        self.runs.append((threshold, result.run_id, result.success))
        for event in result.get_asset_materialization_events():
            self._add_materialization(event.asset_key.to_user_string(), event.partition,
                                      event.materialization.metadata)
        for evaluation in result.get_asset_check_evaluations():
            if not evaluation.passed:
                partition = getattr(evaluation, "partition", None) or (
                    threshold if evaluation.asset_key in partitioned_assets else None)
                where = evaluation.asset_key.to_user_string() + (f"[{partition}]" if partition else "")
                kind = "blocking" if evaluation.blocking else evaluation.severity.value.lower()
                self.failed_checks.append(f"{where} {evaluation.check_name} ({kind})"
                                          + (f": {evaluation.description}" if evaluation.description else ""))
        for event in result.get_step_failure_events():
            self._add_failure(event.step_key, event.step_failure_data)
        planned = instance.get_execution_plan_snapshot(result.dagster_run.execution_plan_snapshot_id)
        finished = {e.step_key for e in result.all_events if e.is_step_success or e.is_step_failure}
        self.not_run += [step for step in planned.step_keys_to_execute or [] if step not in finished]

    def _add_materialization(self, asset: str, partition: str | None, metadata) -> None:
        def value(key, default=None):
            item = metadata.get(key)
            return default if item is None else getattr(item, "value", item)

        if asset == "concur_pairs":
            self._add_counts(value)
        elif asset == "speedup_filtered_pairs" and partition is not None:
            previous = self.kept.get(partition, (0, 0))
            self.kept[partition] = (int(value("dagster/row_count", 0)), previous[1])
        elif asset == "speedup_filter_decisions" and partition is not None:
            previous = self.kept.get(partition, (0, 0))
            self.kept[partition] = (previous[0], int(value("dagster/row_count", 0)))
        elif asset == "cuke_sft_samples" and partition is not None:
            self.cuke_samples[partition] = int(value("dagster/row_count", 0))
            self.cuke_by_source[partition] = dict((value("counts", {}) or {}).get("samples_by_source", {}))
        elif asset == "synthetic_operator_pairs":
            self.synthetic = {key: int(value(key, 0)) for key in ("judged", "from_verdict_store", "executed")}

    def _add_counts(self, value) -> None:
        if value("rows_read") is None:
            return
        self.source, self.source_sha256 = str(value("source", "")), str(value("source_sha256", ""))
        self.rows_read, self.accepted = int(value("rows_read")), int(value("accepted"))
        self.rejected = int(value("rows_rejected"))
        self.rejected_by_reason = dict(value("rejected_by_reason", {}) or {})

    def _add_failure(self, step_key: str, failure) -> None:
        user = failure.user_failure_data
        if user is not None:
            metadata = user.metadata or {}
            if "rows_read" in metadata:
                self._add_counts(lambda k, d=None: getattr(metadata.get(k), "value", d) if k in metadata else d)
            text = " ".join((user.description or "").split())
            if text.startswith("source error: "):
                self.source_errors.append(text.removeprefix("source error: "))
            elif text.startswith("refused to overwrite: "):
                self.refusals.append(f"{step_key}: {text.removeprefix('refused to overwrite: ')}")
            elif "refused" in metadata:
                self.refusals.append(f"{step_key}: {text}")
            else:
                self.step_failures.append(f"{step_key}: {text}")
            return
        error = failure.error
        message = error.message.strip() if error is not None else "unknown error"
        if error is not None and error.cause is not None and "DagsterExecutionStepExecutionError" in error.cls_name:
            message = error.cause.message.strip()
        if "blocking asset check" in message:
            return  # already listed under the failed checks
        self.step_failures.append(f"{step_key}: {message.splitlines()[0] if message else 'failed'}")

    @property
    def nothing_accepted(self) -> bool:
        return self.accepted == 0

    @property
    def exit_code(self) -> int:
        if self.source_errors:
            return EXIT_SOURCE_ERROR
        if (self.failed_checks or self.refusals or self.step_failures or self.nothing_accepted
                or not all(ok for _, _, ok in self.runs)):
            return EXIT_FAILED
        return EXIT_OK

    def lines(self) -> list[str]:
        out = []
        if self.rows_read is not None:
            source = self.source + (f" (content sha256 {self.source_sha256[:12]})" if self.source_sha256 else "")
            reasons = ", ".join(f"{reason} {count}" for reason, count in self.rejected_by_reason.items())
            out.append(f"source: {source}")
            out.append(f"ingest: {self.rows_read} rows read, {self.accepted} accepted, {self.rejected} rejected"
                       + (f" ({reasons})" if reasons else ""))
        if self.synthetic:
            out.append(f"synthetic operator pairs: {self.synthetic['executed']} of {self.synthetic['judged']} "
                       f"(the training split) have a GPU verdict, {self.synthetic['from_verdict_store']} of them "
                       "read from stored verdicts")
        for threshold, (kept, decisions) in self.kept.items():
            samples = self.cuke_samples.get(threshold)
            by_source = ", ".join(f"{source} {n}" for source, n in sorted(self.cuke_by_source.get(threshold, {}).items()))
            out.append(f"threshold {threshold}: {kept} of {decisions} pairs kept"
                       + (f", {samples} CuKe samples" if samples is not None else "")
                       + (f" ({by_source})" if by_source else ""))
        out.append("checks failed: " + ("none" if not self.failed_checks else str(len(self.failed_checks))))
        out += [f"  {check}" for check in self.failed_checks]
        out += [f"refused: {refusal}" for refusal in self.refusals]
        out += [f"failed: {failure}" for failure in self.step_failures]
        if self.not_run:
            out.append("not run (upstream failed or blocked): " + ", ".join(dict.fromkeys(self.not_run)))
        for threshold, run_id, ok in self.runs:
            out.append(f"threshold {threshold}: run {run_id} {'succeeded' if ok else 'FAILED'}")
        return out


def run_main_job(args: argparse.Namespace) -> int:
    from dice_pipeline.concur import ConcurSource, SourceError

    try:
        # One canonical rule, as in the UI: 2 and 2.00 are the threshold keyed 2.0.
        thresholds = list(dict.fromkeys(SpeedupThreshold.parse(t).key
                                        for t in (args.threshold or [PAPER_THRESHOLD])))
    except ThresholdError as exc:
        print(f"dice run: --threshold: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # Fail before any run starts: a missing, unreadable or unknown source is one line, not a failed run in the UI.
        source = ConcurSource.resolve(args.source)
        source.check_readable()
    except SourceError as exc:
        print(f"dice run: source error: {exc}", file=sys.stderr)
        return EXIT_SOURCE_ERROR
    if args.verdict_store and not os.path.isdir(args.verdict_store):
        print(f"dice run: --verdict-store {args.verdict_store}: no such directory", file=sys.stderr)
        return EXIT_USAGE
    verdict_store = os.path.abspath(args.verdict_store) if args.verdict_store else ""  # "" = the default store
    if not args.verbose:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

    from dice_pipeline import definitions
    from dice_pipeline.commands.instance import command_line_instance, interrupted, quiet_run_config, tidy_instance
    from dice_pipeline.paths import dagster_home
    from dice_pipeline.run_health import process_tags

    instance = command_line_instance()
    home = dagster_home()
    partitions = definitions.keys.THRESHOLD_PARTITIONS
    for line in tidy_instance(instance):
        print(f"dice run: {line}")
    existing = set(instance.get_dynamic_partitions(partitions.name))
    new = [t for t in thresholds if t not in existing]
    if new:
        instance.add_dynamic_partitions(partitions.name, new)

    job = definitions.defs.resolve_job_def(definitions.main_job.name)
    overrides = {"build_without_gpu": args.compile_without_gpu, "accept_verdicts_from": list(args.accept_verdicts_from),
                 **({"verdict_store_dir": verdict_store} if verdict_store else {})}
    resources = {"verifier": {"config": {"execute": args.execute, "overrides": overrides}}}
    ingestion = {"source": args.source,
                 "allow_source_change": args.allow_source_change or args.force,
                 "allow_empty": args.allow_empty or args.force}
    logging = {} if args.verbose else quiet_run_config()
    print(f"dice run: ingesting {source.name}, thresholds {', '.join(thresholds)}", flush=True)
    summary = RunSummary()
    for index, threshold in enumerate(thresholds):
        # Ingestion and verification do not depend on the threshold: run them once, then only the partitioned part.
        run_config = {"resources": resources, **logging}
        if index == 0:
            run_config["ops"] = {"concur_ingestion": {"config": ingestion}}
        result = job.execute_in_process(
            run_config=run_config,
            instance=instance,
            tags=process_tags(),  # so a later `dice run` or the UI can tell if this process was killed mid-run
            partition_key=threshold,
            asset_selection=None if index == 0 else definitions.THRESHOLD_DEPENDENT_ASSETS,
            raise_on_error=False,
        )
        if interrupted(result, instance):
            # Ctrl-C: every table holds what it held or what a finished step wrote (writes are transactional).
            print(f"dice run: interrupted at threshold {threshold}; the warehouse keeps what finished steps wrote; "
                  "run again to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
        summary.add(threshold, result, instance, definitions.THRESHOLD_DEPENDENT_ASSETS)
        if index == 0 and not result.success and len(thresholds) > 1:
            # The other thresholds would filter what is in the warehouse, not what this run was asked to ingest.
            summary.not_run.append(f"thresholds {', '.join(thresholds[1:])}")
            break
    if summary.source_errors:
        # The source turned out unreadable once opened (e.g. not a Parquet file): that one line is the news.
        for error in summary.source_errors:
            print(f"dice run: source error: {error}", file=sys.stderr)
        return summary.exit_code
    for line in summary.lines():
        print(line)
    print(f"Dagster home: {home}  (open the UI with `dice dev`)")
    return summary.exit_code
