"""Stage 1, ConCuR ingestion: read pairs from the configured source, validate every row, keep the rejects.

The ingested tables are never replaced by worse without asking: a source with no accepted row, or another source
than the one the warehouse holds, fails the step with the reason (nothing is written, nothing downstream runs)
unless the run config allows it. Every write records the source and its content hash (`lineage.table_sources`).
"""

import hashlib

import dagster as dg
import duckdb

from assets import keys
from assets.keys import table_out
from assets.metadata import (
    bar_chart_markdown,
    counts_markdown,
    histogram_markdown,
    schema_check,
    table_metadata,
    versioned_output,
)
from dice_pipeline import concur
from dice_pipeline.resources import (
    DERIVED_FROM_METADATA_KEY,
    SOURCE_METADATA_KEY,
    SOURCE_SHA256_METADATA_KEY,
    WarehouseResource,
)
from dice_pipeline.schemas import CONCUR_PAIRS, CONCUR_REJECTS
from warehouse import Warehouse, table_for


class ConcurSourceConfig(dg.Config):
    """Where to read ConCuR-format pairs from. Empty `source` means the DICE_CONCUR_SOURCE environment variable,
    else the embedded seed corpus. Forms: `embedded`, `hf:lkongam/ConCuR`, `disk:/dir`, `arrow:/f.arrow`,
    `parquet:/f.parquet`, `jsonl:/f.jsonl`, or a bare path.

    `allow_source_change`: replace pairs ingested from another source (threshold partitions built from the old one
    then show as stale in `lineage.table_sources` until rebuilt). `allow_empty`: write a source with no accepted
    row (its blocking `non_empty` check then fails and stops everything downstream)."""

    source: str = ""
    split: str = "train"
    allow_source_change: bool = False
    allow_empty: bool = False


def previous_source(wh: Warehouse) -> str | None:
    """The source the ingested pairs in the warehouse came from; None when nothing was ingested yet."""
    recorded = wh.provenance("concur_pairs")
    if recorded is not None:
        return recorded.source_name
    # A warehouse written before sources were recorded: the rows still name theirs.
    spec = table_for("concur_pairs")
    try:
        names = wh.query(f"SELECT DISTINCT source_name FROM {spec.qualified_name} WHERE source_name IS NOT NULL "
                         "ORDER BY 1")["source_name"].to_list()
    except duckdb.CatalogException:  # nothing ingested yet
        return None
    return ", ".join(names) or None


def _rejected_by_reason(rejects) -> dict[str, int]:
    return dict(sorted(rejects.group_by("reason_code").len().iter_rows(), key=lambda kv: (-kv[1], kv[0])))


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
        dg.AssetCheckSpec(
            "rows_conserved", asset=keys.CONCUR_PAIRS, blocking=True, description="rows read == accepted + rejected"
        ),
        dg.AssetCheckSpec(
            "non_empty", asset=keys.CONCUR_PAIRS, blocking=True, description="at least one pair was accepted"
        ),
        dg.AssetCheckSpec("unique_uuid", asset=keys.CONCUR_PAIRS, blocking=True, description="uuids are unique"),
        dg.AssetCheckSpec("schema_matches", asset=keys.CONCUR_PAIRS, description="columns and types as declared"),
    ],
)
def concur_ingestion(context: dg.AssetExecutionContext, config: ConcurSourceConfig, warehouse: WarehouseResource):
    """Read ConCuR-format pairs (hub, save_to_disk directory, Arrow, Parquet, JSONL or the embedded seed corpus),
    validate each row, and split them into accepted pairs and reason-coded rejects."""
    try:
        source = concur.ConcurSource.resolve(config.source, split=config.split)
        context.log.info(f"ingesting ConCuR pairs from {source.name}")
        ingested = concur.ingest_source(source)
    except concur.SourceError as exc:
        raise dg.Failure(
            description=f"source error: {exc}",
            metadata={"source": config.source or "(default)"},
            allow_retries=False,
        ) from None
    accepted, rejects, rows_read = ingested.accepted, ingested.rejects, ingested.rows_read
    counts = {
        "source": source.name,
        "source_sha256": ingested.source_sha256,
        "rows_read": rows_read,
        "accepted": accepted.height,
        "rows_rejected": rejects.height,
        "rejected_by_reason": dg.MetadataValue.json(_rejected_by_reason(rejects)),
    }
    previous = previous_source(warehouse.open())
    refusal = concur.overwrite_refusal(
        previous, source.name, accepted.height, rows_read, config.allow_empty, config.allow_source_change
    )
    if refusal is not None:
        # Nothing is written: the tables keep what they held, and no step downstream runs on this source.
        raise dg.Failure(
            description=f"refused to overwrite: {refusal}",
            metadata={**counts, "warehouse_source": previous or "none", "refused": True},
            allow_retries=False,
        )
    data_version = hashlib.sha256("".join(sorted(accepted["content_sha256"].to_list())).encode()).hexdigest()[:16]
    provenance = {SOURCE_METADATA_KEY: source.name, SOURCE_SHA256_METADATA_KEY: ingested.source_sha256}

    yield versioned_output(
        accepted,
        data_version,
        output_name="concur_pairs",
        metadata={
            **table_metadata(accepted, CONCUR_PAIRS, ["uuid", "problem_name", "speedup_over_eager", "source_row"]),
            **counts,
            **provenance,
            "replaced_source": previous if previous and previous != source.name else "no",
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
            **provenance,
            DERIVED_FROM_METADATA_KEY: "concur_pairs",
            "rejections_by_reason": dg.MetadataValue.md(counts_markdown(rejects, "reason_code", "reason")),
            "rejections_by_reason_plot": dg.MetadataValue.md(
                bar_chart_markdown(rejects, "reason_code", "ingestion rejections by reason")
            ),
        },
    )
    conserved = rows_read == accepted.height + rejects.height
    yield dg.AssetCheckResult(
        check_name="rows_conserved",
        asset_key=keys.CONCUR_PAIRS,
        passed=conserved,
        description=None if conserved else
        f"{rows_read} rows read but {accepted.height} accepted + {rejects.height} rejected: rows were lost",
        metadata={"rows_read": rows_read, "accepted": accepted.height, "rejected": rejects.height},
    )
    yield dg.AssetCheckResult(
        check_name="non_empty",
        asset_key=keys.CONCUR_PAIRS,
        passed=accepted.height > 0,
        description=None if accepted.height else
        f"no pair of {source.name} was accepted ({rows_read} rows read): nothing downstream is built from it",
        metadata={"accepted": accepted.height, "rows_read": rows_read,
                  "rejected_by_reason": dg.MetadataValue.json(_rejected_by_reason(rejects))},
    )
    duplicates = accepted.height - accepted["uuid"].n_unique()
    yield dg.AssetCheckResult(
        check_name="unique_uuid",
        asset_key=keys.CONCUR_PAIRS,
        passed=duplicates == 0,
        metadata={"duplicate_uuids": duplicates},
    )
    yield schema_check("schema_matches", keys.CONCUR_PAIRS, accepted, CONCUR_PAIRS)
