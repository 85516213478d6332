"""Every warehouse table: its DuckDB location and declared schema, keyed by the asset (or output) that writes it.

One DuckDB schema per pipeline stage: `ingest`, `verify`, `filter`, `synthesis`, `cuke`, `rl`, `eval`; `lineage` holds views.
"""

from __future__ import annotations

import polars as pl

from dice_pipeline import schemas
from dice_pipeline.schemas import TableSpec

THRESHOLD_PARTITION_COLUMN = "threshold_key"
# CuKe tables carry the threshold partition they were built for in their own column: a sample's `threshold_key`
# is the floor its own source applied (structure instances use theirs), not necessarily the build's.
CUKE_PARTITION_COLUMN = "cuke_threshold_key"
# KernelBench evaluation: tasks and baselines per level partition, results per checkpoint x level partition.
LEVEL_PARTITION_COLUMN = "level_key"
EVAL_PARTITION_COLUMN = "eval_partition_key"


def _cuke(table_name: str, schema: pl.Schema) -> TableSpec:
    return TableSpec("cuke", table_name, pl.Schema({CUKE_PARTITION_COLUMN: pl.String, **schema}), CUKE_PARTITION_COLUMN)


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
    "structure_instances": TableSpec("synthesis", "structure_instances", schemas.STRUCTURE_INSTANCES),
    "synthetic_operator_candidates": TableSpec("synthesis", "synthetic_operator_candidates",
                                               schemas.SYNTHETIC_OPERATOR_CANDIDATES),
    "synthetic_operator_pairs": TableSpec("synthesis", "synthetic_operator_pairs", schemas.SYNTHETIC_OPERATOR_PAIRS),
    "distilled_pairs": TableSpec("synthesis", "distilled_pairs", schemas.DISTILLED_PAIRS),
    "cuke_sft_samples": _cuke("cuke_sft_samples", schemas.CUKE_SFT_SAMPLES),
    "cuke_sft_rejects": _cuke("cuke_sft_rejects", schemas.CUKE_SFT_REJECTS),
    "cuke_decontamination_drops": _cuke("cuke_decontamination_drops", schemas.DECONTAMINATION_DROPS),
    "cuke_infilling_tasks": _cuke("cuke_infilling_tasks", schemas.STAGE1_TASK_SCHEMA),
    "cuke_infilling_rejects": _cuke("cuke_infilling_rejects", schemas.INFILLING_REJECTS),
    "rl_end_to_end_tasks": TableSpec("rl", "rl_end_to_end_tasks", schemas.RL_TASK_POOL),
    "kernelbench_tasks": TableSpec("eval", "kernelbench_tasks", schemas.KERNELBENCH_TASKS, LEVEL_PARTITION_COLUMN),
    "kernelbench_baselines": TableSpec(
        "eval", "kernelbench_baselines", schemas.KERNELBENCH_BASELINES, LEVEL_PARTITION_COLUMN
    ),
    "kernelbench_eval_results": TableSpec(
        "eval", "kernelbench_eval_results", schemas.KERNELBENCH_EVAL_RESULTS, EVAL_PARTITION_COLUMN
    ),
    "kernelbench_eval_sanity": TableSpec(
        "eval", "kernelbench_eval_sanity", schemas.KERNELBENCH_EVAL_SANITY, EVAL_PARTITION_COLUMN
    ),
    "kernelbench_eval_metrics": TableSpec(
        "eval", "kernelbench_eval_metrics", schemas.KERNELBENCH_EVAL_METRICS, EVAL_PARTITION_COLUMN
    ),
}


def table_for(name: str) -> TableSpec:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no warehouse table is declared for {name!r}; declare it in warehouse/tables.py") from None
