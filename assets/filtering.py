"""Stage 3, speedup filtering: one partition per threshold, so thresholds live side by side in the warehouse.

Add a threshold in the UI (the asset's Partitions tab -> "Add partition", key such as `2.0`) or with
`dice threshold add 2`, then materialize that partition. Keys must be canonical (`2.0`, not `2` or `2.00`).
"""

import hashlib

import dagster as dg
import polars as pl

from assets import keys
from assets.keys import table_out
from assets.metadata import counts_markdown, histogram_markdown, schema_check, table_metadata
from dice_pipeline.filtering import filter_by_speedup, parse_threshold_key
from dice_pipeline.schemas import SPEEDUP_FILTER_DECISIONS, SPEEDUP_FILTERED_PAIRS


@dg.multi_asset(
    outs={
        "speedup_filtered_pairs": table_out(
            keys.SPEEDUP_FILTERED_PAIRS,
            "Pairs that passed verification with speedup_used >= the partition's threshold.",
        ),
        "speedup_filter_decisions": table_out(
            keys.SPEEDUP_FILTER_DECISIONS,
            "Every ingested pair's decision at this threshold: kept, or the reason it was dropped.",
        ),
    },
    ins={
        "concur_pairs": dg.AssetIn(key=keys.CONCUR_PAIRS),
        "verified_pairs": dg.AssetIn(key=keys.VERIFIED_PAIRS),
    },
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_FILTER,
    check_specs=[
        dg.AssetCheckSpec("threshold_respected", asset=keys.SPEEDUP_FILTERED_PAIRS, blocking=True),
        dg.AssetCheckSpec("schema_matches", asset=keys.SPEEDUP_FILTERED_PAIRS),
        dg.AssetCheckSpec(
            "rows_conserved", asset=keys.SPEEDUP_FILTER_DECISIONS, description="one decision per ingested pair"
        ),
        dg.AssetCheckSpec(
            "non_empty",
            asset=keys.SPEEDUP_FILTERED_PAIRS,
            blocking=False,
            description="warns when a threshold keeps nothing",
        ),
    ],
)
def speedup_filtering(context: dg.AssetExecutionContext, concur_pairs: pl.DataFrame, verified_pairs: pl.DataFrame):
    """Keep pairs whose speedup over eager PyTorch is at least the partition's threshold. Uses the verifier's
    measured speedup where it ran on a GPU, else the source's recorded one; verifier rejects are never kept."""
    threshold_key = context.partition_key
    try:
        threshold = parse_threshold_key(threshold_key)
    except ValueError as exc:
        # One line in the run's log, before anything is written: the tables of every other threshold stay as they are.
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    kept, decisions = filter_by_speedup(concur_pairs, verified_pairs, threshold_key)
    # The data version is the kept set itself: downstream partitions go stale exactly when it changes.
    fingerprint = "\n".join(f"{u}:{s}" for u, s in kept.select("uuid", "speedup_used").iter_rows())
    data_version = dg.DataVersion(hashlib.sha256(fingerprint.encode()).hexdigest()[:16])

    yield dg.Output(
        kept,
        output_name="speedup_filtered_pairs",
        data_version=data_version,
        metadata={
            **table_metadata(
                kept,
                SPEEDUP_FILTERED_PAIRS,
                ["uuid", "problem_name", "speedup_used", "speedup_source", "verification_status"],
            ),
            "threshold": threshold,
            "kept_measured": kept.filter(pl.col("speedup_source") == "measured").height,
            "kept_recorded": kept.filter(pl.col("speedup_source") == "recorded").height,
            "speedup_histogram": dg.MetadataValue.md(
                histogram_markdown(
                    decisions["speedup_used"].to_list(), f"speedup used (threshold {threshold:g}x)", threshold=threshold
                )
            ),
        },
    )
    yield dg.Output(
        decisions,
        output_name="speedup_filter_decisions",
        metadata={
            **table_metadata(decisions, SPEEDUP_FILTER_DECISIONS, ["uuid", "reason_code", "speedup_used"]),
            "decisions_by_reason": dg.MetadataValue.md(counts_markdown(decisions, "reason_code", "decision")),
        },
    )
    below = kept.filter(pl.col("speedup_used") < threshold)
    yield dg.AssetCheckResult(
        check_name="threshold_respected",
        asset_key=keys.SPEEDUP_FILTERED_PAIRS,
        passed=below.height == 0,
        metadata={"rows_below_threshold": below.height},
    )
    yield dg.AssetCheckResult(
        check_name="rows_conserved",
        asset_key=keys.SPEEDUP_FILTER_DECISIONS,
        passed=decisions.height == concur_pairs.height and decisions["uuid"].n_unique() == decisions.height,
        metadata={"ingested": concur_pairs.height, "decisions": decisions.height},
    )
    yield dg.AssetCheckResult(
        check_name="non_empty",
        asset_key=keys.SPEEDUP_FILTERED_PAIRS,
        passed=kept.height > 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"kept": kept.height},
    )
    yield schema_check("schema_matches", keys.SPEEDUP_FILTERED_PAIRS, kept, SPEEDUP_FILTERED_PAIRS)
