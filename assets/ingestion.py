"""Stage 1, ConCuR ingestion: read pairs from the configured source, validate every row, keep the rejects."""

import hashlib

import dagster as dg

from assets import keys
from assets.keys import table_out
from assets.metadata import bar_chart_markdown, counts_markdown, histogram_markdown, schema_check, table_metadata
from dice_pipeline import concur
from dice_pipeline.schemas import CONCUR_PAIRS, CONCUR_REJECTS


class ConcurSourceConfig(dg.Config):
    """Where to read ConCuR-format pairs from. Empty `source` means the DICE_CONCUR_SOURCE environment variable,
    else the embedded seed corpus. Forms: `embedded`, `hf:lkongam/ConCuR`, `disk:/dir`, `arrow:/f.arrow`,
    `parquet:/f.parquet`, `jsonl:/f.jsonl`, or a bare path."""

    source: str = ""
    split: str = "train"


@dg.multi_asset(
    outs={
        "concur_pairs": table_out(
            keys.CONCUR_PAIRS,
            "Validated PyTorch->CUDA pairs in ConCuR's schema, read from the configured source: the run's `source`, "
            "else DICE_CONCUR_SOURCE, else the embedded seed corpus (the `source` metadata names the one used). "
            "source_name + source_row trace each row back; extra source columns are kept in extra_json.",
        ),
        "concur_rejects": table_out(
            keys.CONCUR_REJECTS,
            "Rows of the same source that failed validation (no ModelNew, unparsable code, duplicate uuid, ...), each "
            "with a reason code, a message and the row as read; never silently dropped. All rejections of every "
            "stage: lineage.rejections.",
        ),
    },
    group_name=keys.GROUP_INGEST,
    check_specs=[
        dg.AssetCheckSpec("rows_conserved", asset=keys.CONCUR_PAIRS, description="rows read == accepted + rejected"),
        dg.AssetCheckSpec("non_empty", asset=keys.CONCUR_PAIRS, description="at least one pair was accepted"),
        dg.AssetCheckSpec("unique_uuid", asset=keys.CONCUR_PAIRS, description="uuids are unique"),
        dg.AssetCheckSpec("schema_matches", asset=keys.CONCUR_PAIRS, description="columns and types as declared"),
    ],
)
def concur_ingestion(context: dg.AssetExecutionContext, config: ConcurSourceConfig):
    """Read ConCuR-format pairs (hub, save_to_disk directory, Arrow, Parquet, JSONL or the embedded seed corpus),
    validate each row, and split them into accepted pairs and reason-coded rejects."""
    try:
        source = concur.ConcurSource.resolve(config.source, split=config.split)
        context.log.info(f"ingesting ConCuR pairs from {source.name}")
        accepted, rejects, rows_read = concur.ingest(source)
    except concur.SourceError as exc:
        # A source that cannot be read is one line in the run's log, and nothing is written over the last ingestion.
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    data_version = hashlib.sha256("".join(sorted(accepted["content_sha256"].to_list())).encode()).hexdigest()[:16]

    yield dg.Output(
        accepted,
        output_name="concur_pairs",
        data_version=dg.DataVersion(data_version),
        metadata={
            **table_metadata(accepted, CONCUR_PAIRS, ["uuid", "problem_name", "speedup_over_eager", "source_row"]),
            "source": source.name,
            "rows_read": rows_read,
            "rows_rejected": rejects.height,
            "recorded_speedup_histogram": dg.MetadataValue.md(
                histogram_markdown(accepted["speedup_over_eager"].to_list(), "recorded speedup_over_eager")
            ),
        },
    )
    yield dg.Output(
        rejects,
        output_name="concur_rejects",
        metadata={
            **table_metadata(rejects, CONCUR_REJECTS, ["source_row", "uuid", "reason_code", "message"]),
            "rejections_by_reason": dg.MetadataValue.md(counts_markdown(rejects, "reason_code", "reason")),
            "rejections_by_reason_plot": dg.MetadataValue.md(
                bar_chart_markdown(rejects, "reason_code", "ingestion rejections by reason")
            ),
        },
    )
    yield dg.AssetCheckResult(
        check_name="rows_conserved",
        asset_key=keys.CONCUR_PAIRS,
        passed=rows_read == accepted.height + rejects.height,
        metadata={"rows_read": rows_read, "accepted": accepted.height, "rejected": rejects.height},
    )
    yield dg.AssetCheckResult(
        check_name="non_empty",
        asset_key=keys.CONCUR_PAIRS,
        passed=accepted.height > 0,
        metadata={"accepted": accepted.height},
    )
    yield dg.AssetCheckResult(
        check_name="unique_uuid",
        asset_key=keys.CONCUR_PAIRS,
        passed=accepted["uuid"].n_unique() == accepted.height,
    )
    yield schema_check("schema_matches", keys.CONCUR_PAIRS, accepted, CONCUR_PAIRS)
