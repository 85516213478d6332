"""Difficulty of a KernelBench-format task: a documented static score, its 0-3 label (the scale of DICE's RL pool),
the stable easy->hard ordering the RL stages walk, and a loader for external RL task files (such as DICE's
`end_to_end_tasks.json`) that keeps their own labels and rejects bad rows with reason codes.

The score, from the reference's AST (see `ops.py`), is

    score = min(op_count, 30)            operators run by every forward (module calls, torch calls, arithmetic)
          + 0.5 * distinct_ops           variety of operators to fuse
          + 2 * has_convolution + 3 * has_attention + 4 * has_recurrence
          + 2 * has_loop                 per-step or repeated work in forward
          + 3 * (level - 1)              KernelBench level, when the task comes from KernelBench

and the label is 0 below 2.5 (one cheap elementwise op), 1 below 6 (one heavy op or a short chain), 2 below 16
(fusion chains of several ops, a conv or attention with extras), 3 from 16 on (whole networks, recurrences).
The cut points were chosen so that KernelBench level 1, 2 and 3 tasks fall mostly in labels 0-1, 1-2 and 3
(`tests/dice_pipeline/cuke/test_difficulty.py` checks that on the real task set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from dice_pipeline.cuke.ops import analyze_reference, op_family
from dice_pipeline.kernelbench import task_format_problems

DIFFICULTY_LABELS = (0, 1, 2, 3)
LABEL_CUT_POINTS = (2.5, 6.0, 16.0)  # score below cut i -> label i; at or above the last -> 3
OP_COUNT_CAP = 30


@dataclass(frozen=True)
class Difficulty:
    score: float
    label: int
    op_family: str
    op_count: int
    distinct_ops: int


def difficulty_label(score: float) -> int:
    for label, cut in enumerate(LABEL_CUT_POINTS):
        if score < cut:
            return label
    return DIFFICULTY_LABELS[-1]


def score_difficulty(pytorch_code: str, level: int | None = None) -> Difficulty:
    """The documented difficulty score and label of a reference (module docstring). Unparseable code gets the
    hardest label: nothing is known about it, and walking easy->hard should meet it last."""
    ops = analyze_reference(pytorch_code)
    if ops.parse_error:
        return Difficulty(
            score=float("inf"), label=DIFFICULTY_LABELS[-1], op_family="other", op_count=0, distinct_ops=0
        )
    score = (
        min(ops.op_count, OP_COUNT_CAP)
        + 0.5 * ops.distinct_ops
        + 2.0 * ops.has_convolution
        + 3.0 * ops.has_attention
        + 4.0 * ops.has_recurrence
        + 2.0 * ops.has_loop
        + (3.0 * (level - 1) if level else 0.0)
    )
    return Difficulty(score, difficulty_label(score), op_family(ops), ops.op_count, ops.distinct_ops)


def easy_to_hard(rows, label_column: str = "difficulty", score_column: str | None = "difficulty_score"):
    """Rows ordered easy->hard by label, then by score where a score column is present; ties keep their input
    order (a stable sort), so an externally sorted pool such as DICE's keeps its order within a label.
    Takes and returns a polars DataFrame or a list of dicts."""
    if isinstance(rows, list):

        def key(row: dict) -> tuple:
            score = row.get(score_column) if score_column else None
            return (row[label_column], score if score is not None else 0.0)

        return sorted(rows, key=key)  # sorted() is stable
    columns = [label_column] + ([score_column] if score_column and score_column in rows.columns else [])
    return rows.sort(columns, maintain_order=True, nulls_last=True)


# --- external RL task files

RL_TASK_REQUIRED_FIELDS = ("idx", "level", "pytorch_code")


@dataclass(frozen=True)
class RlTaskReject:
    position: int  # index of the row in the file
    idx: str | None
    reason_code: str
    message: str


def _parse_label(value: Any) -> int | None:
    """DICE stores labels as strings ("2"); accept ints and integral strings in 0-3."""
    if isinstance(value, bool):
        return None
    try:
        label = int(str(value).strip())
    except ValueError:
        return None
    return label if label in DIFFICULTY_LABELS else None


def load_rl_task_file(path: str | Path, compute_difficulty: bool = True):
    """Load an RL task pool (a JSON list, or JSON lines, of objects with `idx`, `level` = difficulty label 0-3 and
    `pytorch_code`), keeping the file's labels and order (`file_position`); other fields are kept in `extra_json`.
    Returns (tasks DataFrame, rejects DataFrame); every row lands in exactly one of them. With
    `compute_difficulty`, our own score and label are added next to the file's label for comparison."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of task objects, got {type(records).__name__}")

    tasks: list[dict] = []
    rejects: list[RlTaskReject] = []
    seen_idx: set[str] = set()
    for position, record in enumerate(records):
        reject = _validate_rl_record(position, record, seen_idx)
        if reject is not None:
            rejects.append(reject)
            continue
        idx = str(record["idx"])
        seen_idx.add(idx)
        row = {
            "task_id": idx,
            "file_position": position,
            "difficulty": _parse_label(record["level"]),
            "pytorch_code": record["pytorch_code"],
            "extra_json": json.dumps({k: v for k, v in record.items() if k not in RL_TASK_REQUIRED_FIELDS}),
        }
        if compute_difficulty:
            computed = score_difficulty(record["pytorch_code"])
            row.update(
                computed_difficulty_score=computed.score,
                computed_difficulty=computed.label,
                op_family=computed.op_family,
            )
        tasks.append(row)

    schema = {
        "task_id": pl.String,
        "file_position": pl.Int64,
        "difficulty": pl.Int64,
        "pytorch_code": pl.String,
        "extra_json": pl.String,
    }
    if compute_difficulty:
        schema.update(computed_difficulty_score=pl.Float64, computed_difficulty=pl.Int64, op_family=pl.String)
    reject_schema = {"position": pl.Int64, "idx": pl.String, "reason_code": pl.String, "message": pl.String}
    return (
        pl.DataFrame(tasks, schema=schema),
        pl.DataFrame([r.__dict__ for r in rejects], schema=reject_schema),
    )


def _validate_rl_record(position: int, record: Any, seen_idx: set[str]) -> RlTaskReject | None:
    if not isinstance(record, dict):
        return RlTaskReject(position, None, "not_an_object", f"row is a {type(record).__name__}")
    idx = None if record.get("idx") is None else str(record["idx"])
    missing = [name for name in RL_TASK_REQUIRED_FIELDS if record.get(name) is None]
    if missing:
        return RlTaskReject(position, idx, "missing_field", f"missing {missing}")
    if idx in seen_idx:
        return RlTaskReject(position, idx, "duplicate_idx", f"idx {idx} appears earlier in the file")
    if _parse_label(record["level"]) is None:
        return RlTaskReject(position, idx, "bad_difficulty_label", f"level {record['level']!r} is not one of 0-3")
    code = record["pytorch_code"]
    if not isinstance(code, str) or not code.strip():
        return RlTaskReject(position, idx, "empty_code", "pytorch_code is empty or not a string")
    problems = task_format_problems(code)
    if problems:
        return RlTaskReject(position, idx, problems[0], f"not a KernelBench-format task: {problems}")
    return None


__all__ = [
    "DIFFICULTY_LABELS",
    "Difficulty",
    "LABEL_CUT_POINTS",
    "RlTaskReject",
    "difficulty_label",
    "easy_to_hard",
    "load_rl_task_file",
    "score_difficulty",
]
