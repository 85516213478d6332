"""Stage 3, speedup filtering: one partition per threshold, so thresholds live side by side in the warehouse.

Add a threshold in the UI (the asset's *Materialize* dialog -> "Add a partition", key such as `1.5`) or with
`dice run --threshold 1.5`, and materialize that partition. Keys are canonical (`2.0`, not `2` or `2.00`): the
command line canonicalises what it is given, and a key added in the UI otherwise is replaced by its canonical
spelling (or deleted when it names no threshold) by the run for it and by the `threshold_partition_keys` sensor.
"""

import hashlib

import dagster as dg
import polars as pl

from assets import keys
from assets.keys import table_out
from assets.metadata import (
    bar_chart_markdown,
    counts_markdown,
    histogram_markdown,
    lineage_query_markdown,
    schema_check,
    table_metadata,
    versioned_output,
)
from dice_pipeline.filtering import filter_by_speedup
from dice_pipeline.schemas import SPEEDUP_FILTER_DECISIONS, SPEEDUP_FILTERED_PAIRS
from dice_pipeline.threshold_partitions import replace_bad_partition
from dice_pipeline.thresholds import SpeedupThreshold, ThresholdError


class FilterConfig(dg.Config):
    """`speedup_convention`: which measured speedup the threshold applies to: "gpu" (flush and call enqueued back
    to back: KernelBench's convention, and ConCuR's recorded speedups'), "host" (host launch latency included), or
    empty for the verifier's configured one."""

    speedup_convention: str = ""


@dg.multi_asset(
    outs={
        "speedup_filtered_pairs": table_out(
            keys.SPEEDUP_FILTERED_PAIRS,
            "Pairs kept at or above the partition's speedup threshold: the verifier found nothing wrong with them "
            "and speedup_used >= threshold, where speedup_used is the speedup over eager PyTorch our verifier measured "
            "on a GPU, else the one the source recorded (speedup_source says which). Built from concur_pairs and "
            "verified_pairs; one row per kept pair and threshold_key, every threshold side by side in "
            "filter.speedup_filtered_pairs. Each row's verdict: verdict_id, or lineage.filter_lineage.",
        ),
        "speedup_filter_decisions": table_out(
            keys.SPEEDUP_FILTER_DECISIONS,
            "Every ingested pair's decision at the partition's threshold: kept, or the reason it was dropped "
            "(failed_verification, no_speedup, overhead_dominated, below_threshold), with the speedup used and the "
            "verdict it rests on (verdict_id). kept + dropped == concur_pairs. Query across thresholds with "
            "lineage.threshold_summary and lineage.filter_lineage.",
        ),
    },
    ins={
        "concur_pairs": dg.AssetIn(key=keys.CONCUR_PAIRS),
        "verified_pairs": dg.AssetIn(key=keys.VERIFIED_PAIRS),
    },
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_FILTER,
    check_specs=[
        dg.AssetCheckSpec("threshold_respected", asset=keys.SPEEDUP_FILTERED_PAIRS, blocking=True,
                          description="no kept pair is below the threshold (blocks downstream when it fails)"),
        dg.AssetCheckSpec("schema_matches", asset=keys.SPEEDUP_FILTERED_PAIRS,
                          description="columns and types as declared in dice_pipeline/schemas.py"),
        dg.AssetCheckSpec(
            "rows_conserved",
            asset=keys.SPEEDUP_FILTER_DECISIONS,
            blocking=True,
            description="one decision per ingested pair",
        ),
        dg.AssetCheckSpec(
            "non_empty",
            asset=keys.SPEEDUP_FILTERED_PAIRS,
            blocking=False,
            description="warns when a threshold keeps nothing",
        ),
    ],
)
def speedup_filtering(context: dg.AssetExecutionContext, config: FilterConfig, concur_pairs: pl.DataFrame,
                      verified_pairs: pl.DataFrame):
    """Keep pairs whose speedup over eager PyTorch is at least the partition's threshold. Uses the verifier's
    measured speedup where it ran on a GPU (in the timing convention the config names), else the source's recorded
    one; verifier rejects are never kept. Every decision records the convention its speedup was measured in."""
    threshold_key = context.partition_key
    try:
        threshold = SpeedupThreshold.from_partition_key(threshold_key)
    except ThresholdError as exc:
        # One line in the run's log, before anything is written: the tables of every other threshold stay as they
        # are, and the bad key leaves the partition list (replaced by its canonical spelling where it has one).
        message = replace_bad_partition(context.instance, keys.THRESHOLD_PARTITIONS.name, threshold_key, exc)
        raise dg.Failure(description=message, allow_retries=False) from None
    if concur_pairs.height == 0:
        # An empty ingestion was written only on request, and its blocking check stops this step in the same run;
        # a later run of this partition alone must not replace its pairs by nothing either.
        raise dg.Failure(
            description=f"refused to overwrite partition {threshold_key}: concur_pairs is empty (the last ingestion "
            "accepted no pair), so there is nothing to filter",
            metadata={"threshold_key": threshold_key, "ingested_pairs": 0, "refused": True},
            allow_retries=False,
        )
    kept, decisions = filter_by_speedup(concur_pairs, verified_pairs, threshold, config.speedup_convention or None)
    # The data version is the kept set itself: downstream partitions go stale exactly when it changes.
    fingerprint = "\n".join(f"{u}:{s}" for u, s in kept.select("uuid", "speedup_used").iter_rows())
    data_version = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]

    yield versioned_output(
        kept,
        data_version,
        output_name="speedup_filtered_pairs",
        metadata={
            **table_metadata(
                kept,
                SPEEDUP_FILTERED_PAIRS,
                ["uuid", "problem_name", "speedup_used", "speedup_source", "verification_status", "verdict_id"],
            ),
            "threshold": threshold.key,
            "speedup_conventions": measured_conventions_metadata(decisions),
            "rows_to_verdicts": dg.MetadataValue.md(lineage_query_markdown(threshold_key, kept_only=True)),
            "kept_measured": kept.filter(pl.col("speedup_source") == "measured").height,
            "kept_recorded": kept.filter(pl.col("speedup_source") == "recorded").height,
            "speedup_histogram": dg.MetadataValue.md(
                histogram_markdown(
                    decisions["speedup_used"].to_list(), f"speedup used (threshold {threshold.key}x)",
                    threshold=threshold.value
                )
            ),
        },
    )
    yield dg.Output(
        decisions,
        output_name="speedup_filter_decisions",
        metadata={
            **table_metadata(
                decisions, SPEEDUP_FILTER_DECISIONS, ["uuid", "reason_code", "speedup_used", "speedup_source", "verdict_id"]
            ),
            "decisions_by_reason": dg.MetadataValue.md(counts_markdown(decisions, "reason_code", "decision")),
            "decisions_by_reason_plot": dg.MetadataValue.md(
                bar_chart_markdown(decisions, "reason_code", f"decisions at threshold {threshold.key}x")
            ),
            "rows_to_verdicts": dg.MetadataValue.md(lineage_query_markdown(threshold_key, kept_only=False)),
        },
    )
    # Check metadata is keyed by the partition: the UI plots a check's numbers across its evaluations, and one
    # series must not join different thresholds.
    at = threshold.key
    below = kept.filter(pl.col("speedup_used") < threshold.value)
    yield dg.AssetCheckResult(
        check_name="threshold_respected",
        asset_key=keys.SPEEDUP_FILTERED_PAIRS,
        passed=below.height == 0,
        description=None if below.height == 0 else f"{below.height} kept pairs are below the {at}x threshold",
        metadata={f"rows_below_threshold_at_{at}": below.height, "threshold": at},
    )
    conserved = decisions.height == concur_pairs.height and decisions["uuid"].n_unique() == decisions.height
    yield dg.AssetCheckResult(
        check_name="rows_conserved",
        asset_key=keys.SPEEDUP_FILTER_DECISIONS,
        passed=conserved,
        description=None if conserved else
        f"{concur_pairs.height} pairs ingested but {decisions.height} decisions "
        f"({decisions['uuid'].n_unique()} distinct)",
        metadata={f"ingested_at_{at}": concur_pairs.height, f"decisions_at_{at}": decisions.height, "threshold": at},
    )
    yield dg.AssetCheckResult(
        check_name="non_empty",
        asset_key=keys.SPEEDUP_FILTERED_PAIRS,
        passed=kept.height > 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=None if kept.height else f"threshold {at} keeps no pair",
        metadata={f"kept_at_{at}": kept.height, "threshold": at},
    )
    yield schema_check("schema_matches", keys.SPEEDUP_FILTERED_PAIRS, kept, SPEEDUP_FILTERED_PAIRS)


def measured_conventions_metadata(decisions: pl.DataFrame):
    """Which timing convention the measured speedups used, counted; a run that measured nothing says so instead
    of counting the recorded figures (always ConCuR's GPU-time) and the rows without a speedup."""
    measured = decisions.filter(pl.col("speedup_source") == "measured")
    if measured.height == 0:
        recorded = decisions.filter(pl.col("speedup_source") == "recorded").height
        return (f"none measured (no GPU verdict): {recorded} decisions use the source's recorded speedup, "
                f"{decisions.height - recorded} had none")
    return dg.MetadataValue.json(dict(sorted(measured.group_by("speedup_convention").len().iter_rows())))
