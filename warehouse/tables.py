"""Every warehouse table: its DuckDB location and declared schema, keyed by the asset (or output) that writes it.

One DuckDB schema per pipeline stage: `ingest`, `verify`, `filter`, `synthesis`, `cuke`; `lineage` holds views.
"""

from __future__ import annotations

from dice_pipeline import schemas
from dice_pipeline.schemas import TableSpec

THRESHOLD_PARTITION_COLUMN = "threshold_key"

TABLES: dict[str, TableSpec] = {
    "concur_pairs": TableSpec("ingest", "concur_pairs", schemas.CONCUR_PAIRS),
    "concur_rejects": TableSpec("ingest", "concur_rejects", schemas.CONCUR_REJECTS),
    "verified_pairs": TableSpec("verify", "verified_pairs", schemas.VERIFIED_PAIRS),
    "speedup_filter_decisions": TableSpec(
        "filter", "speedup_filter_decisions", schemas.SPEEDUP_FILTER_DECISIONS, THRESHOLD_PARTITION_COLUMN
    ),
    "speedup_filtered_pairs": TableSpec(
        "filter", "speedup_filtered_pairs", schemas.SPEEDUP_FILTERED_PAIRS, THRESHOLD_PARTITION_COLUMN
    ),
}


def table_for(name: str) -> TableSpec:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no warehouse table is declared for {name!r}; declare it in warehouse/tables.py") from None
