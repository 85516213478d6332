"""The end-to-end RL task pool and its easy->hard schedule (the paper's data scheduling: walk the pool in order).

A pool comes either from an external task file that carries its own difficulty labels (e.g. DICE's 4,000-task
file, loaded from a path and never copied), or from PyTorch references we hold (ingested ConCuR pairs), labelled
with our documented difficulty score. Either way every task keeps where its label came from.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dice_pipeline.cuke.difficulty import easy_to_hard, load_rl_task_file, score_difficulty

RL_TASK_POOL = pl.Schema(
    {
        "schedule_position": pl.Int64,  # 0 = first task the RL stage sees (easiest)
        "task_id": pl.String,
        "source": pl.String,  # the task file's path, or the ingestion source of the references
        "file_position": pl.Int64,  # position in the source, before scheduling
        "difficulty": pl.Int64,  # the label the schedule sorts by (0 easiest .. 3 hardest)
        "label_source": pl.String,  # file (the task file's own label) | computed (our difficulty score)
        "computed_difficulty": pl.Int64,
        "computed_difficulty_score": pl.Float64,
        "op_family": pl.String,
        "pytorch_code": pl.String,
        "extra_json": pl.String,
    }
)


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
    )
    unlabelled = pool.filter(pl.col("difficulty").is_null())
    if unlabelled.height:
        raise ValueError(f"{path}: {unlabelled.height} tasks have a label outside 0-3 (e.g. {unlabelled['task_id'][0]})")
    return _schedule(pool).select(RL_TASK_POOL.names()).cast(dict(RL_TASK_POOL)), rejects


def pool_from_references(references: pl.DataFrame, source: str) -> pl.DataFrame:
    """A scheduled pool from (task_id, pytorch_code) rows, labelled with our difficulty score."""
    rows = []
    for position, (task_id, code) in enumerate(references.select("task_id", "pytorch_code").iter_rows()):
        difficulty = score_difficulty(code)
        rows.append(
            {
                "task_id": task_id,
                "source": source,
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
