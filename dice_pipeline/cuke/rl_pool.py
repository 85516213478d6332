"""The end-to-end RL task pool and its easy->hard schedule (the paper's data scheduling: walk the pool in order).

A pool comes either from an external task file that carries its own difficulty labels (e.g. DICE's 4,000-task
file, loaded from a path and never copied), or from PyTorch references we hold (ingested ConCuR pairs, synthetic
operator tasks), labelled with our documented difficulty score. Either way every task keeps where its label came
from and its operator family, and `without_families` takes the held-out families out (with a count).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dice_pipeline.cuke.difficulty import easy_to_hard, load_rl_task_file, score_difficulty
from dice_pipeline.schemas import RL_TASK_POOL  # declared there, used from here too


def _catalogue_family(code: str) -> str:
    from dice_pipeline.synthesis.operators import operator_family

    return operator_family(code or "") or "other"


def without_families(pool: pl.DataFrame, families: tuple[str, ...]) -> tuple[pl.DataFrame, dict[str, int]]:
    """The pool without tasks of `families` (rescheduled positions), and how many each family lost."""
    dropped = pool.filter(pl.col("family").is_in(list(families)))
    kept = pool.filter(~pl.col("family").is_in(list(families))).sort("schedule_position")
    kept = kept.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("schedule_position"))
    return kept, dict(dropped.group_by("family").len().iter_rows())


def _schedule(pool: pl.DataFrame) -> pl.DataFrame:
    """Easy->hard by label, then by our score where the label came from it; stable, so a file's own order
    within a label is kept (DICE's file is already sorted)."""
    score = "computed_difficulty_score" if (pool["label_source"] == "computed").all() else None
    ordered = easy_to_hard(pool, label_column="difficulty", score_column=score)
    return ordered.with_row_index("schedule_position").with_columns(pl.col("schedule_position").cast(pl.Int64))


def pool_from_task_file(path: str | Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(scheduled pool, rejects) from an external task file, keeping its labels."""
    tasks, rejects = load_rl_task_file(path, compute_difficulty=True)
    pool = tasks.with_columns(
        pl.lit(str(path)).alias("source"),
        pl.lit("file").alias("label_source"),
        # computed in this thread, not through map_elements (see cuke.samples: ast.parse off the main thread)
        pl.Series("family", [_catalogue_family(code) for code in tasks["pytorch_code"].to_list()], dtype=pl.String),
    )
    unlabelled = pool.filter(pl.col("difficulty").is_null())
    if unlabelled.height:
        raise ValueError(f"{path}: {unlabelled.height} tasks have a label outside 0-3 (e.g. {unlabelled['task_id'][0]})")
    return _schedule(pool).select(RL_TASK_POOL.names()).cast(dict(RL_TASK_POOL)), rejects


def pool_from_references(references: pl.DataFrame, source: str) -> pl.DataFrame:
    """A scheduled pool from (task_id, pytorch_code) rows, labelled with our difficulty score. Optional `source`
    and `family` columns name a row's own source and family (synthetic tasks); else `source` and what the
    reference computes."""
    rows = []
    sources = references["source"].to_list() if "source" in references.columns else [source] * references.height
    families = references["family"].to_list() if "family" in references.columns else [None] * references.height
    for position, (task_id, code) in enumerate(references.select("task_id", "pytorch_code").iter_rows()):
        difficulty = score_difficulty(code)
        rows.append(
            {
                "task_id": task_id,
                "source": sources[position],
                "family": families[position] or _catalogue_family(code),
                "file_position": position,
                "difficulty": difficulty.label,
                "label_source": "computed",
                "computed_difficulty": difficulty.label,
                "computed_difficulty_score": difficulty.score,
                "op_family": difficulty.op_family,
                "pytorch_code": code,
                "extra_json": "{}",
            }
        )
    pool = pl.DataFrame(rows, schema={k: v for k, v in RL_TASK_POOL.items() if k != "schedule_position"})
    return _schedule(pool).select(RL_TASK_POOL.names())
