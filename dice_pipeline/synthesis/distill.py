"""Distillation, ConCuR's own recipe: reference tasks -> N candidates each from a generator backend -> verified ->
ConCuR-format rows (uuid, problem_name, pytorch_code, generated_code, generated_think, speedup_over_eager, plus the
generator, its sampling settings and the verdict on each row) that ingestion takes as one more source.

Reference tasks come from a JSON task file (the RL pool's format: a list of {idx, level, pytorch_code}), a JSONL
file of {task_id, pytorch_code}, a folder of KernelBench-format `.py` files, or any iterable of ReferenceTask
(the synthetic operator tasks). Generation and verification reuse the structure-synthesis loop (dedupe, one
verifier batch, a row per candidate with its reason). Standard library only.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dice_pipeline.synthesis.candidates import KernelGenerator
from dice_pipeline.synthesis.instances import VerifierFn, synthesize_structure_instances


class TaskSourceError(ValueError):
    """The reference tasks cannot be read (missing path, unknown format, a file that is not a task)."""


@dataclass(frozen=True)
class ReferenceTask:
    task_id: str
    pytorch_code: str
    source: str  # where it came from (a path, "synthetic", ...)
    family: str = ""
    model_family: str = ""

    def shape_json(self) -> str:
        return "{}"


def _is_reference(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    names = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    return {"Model", "get_inputs", "get_init_inputs"} <= names


def load_reference_tasks(path: str | Path, limit: int | None = None) -> list[ReferenceTask]:
    """Reference tasks from a JSON task file, a JSONL file or a folder of `.py` files, in file order. A task that
    is not a KernelBench-format reference (no Model / get_inputs / get_init_inputs) is an error naming it."""
    path = Path(path)
    if not path.exists():
        raise TaskSourceError(f"reference tasks {path} do not exist")
    entries: list[tuple[str, str]] = []
    if path.is_dir():
        entries = [(p.stem, p.read_text()) for p in sorted(path.glob("*.py"))]
    elif path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        if not isinstance(data, list):
            raise TaskSourceError(f"{path}: expected a JSON list of tasks, got {type(data).__name__}")
        for position, item in enumerate(data):
            if not isinstance(item, dict) or "pytorch_code" not in item:
                raise TaskSourceError(f"{path}: task {position} has no pytorch_code")
            entries.append((str(item.get("idx", item.get("task_id", position))), item["pytorch_code"]))
    elif path.suffix == ".jsonl":
        for line_number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskSourceError(f"{path}:{line_number}: not JSON ({exc.msg})") from None
            if "pytorch_code" not in item:
                raise TaskSourceError(f"{path}:{line_number}: no pytorch_code")
            entries.append((str(item.get("task_id", item.get("idx", line_number))), item["pytorch_code"]))
    else:
        raise TaskSourceError(f"{path}: unknown task format (use a .json task file, a .jsonl file or a folder of .py)")
    if not entries:
        raise TaskSourceError(f"{path}: no reference tasks")
    tasks = []
    for task_id, code in entries[:limit] if limit else entries:
        if not _is_reference(code):
            raise TaskSourceError(f"{path}: task {task_id} is not a KernelBench-format reference "
                                  "(needs class Model, get_inputs and get_init_inputs)")
        tasks.append(ReferenceTask(task_id=task_id, pytorch_code=code, source=str(path)))
    return tasks


# ConCuR's documented columns first; the rest are kept by ingestion in extra_json.
CONCUR_COLUMNS = ("uuid", "problem_name", "pytorch_code", "generated_code", "generated_think", "speedup_over_eager")


def concur_rows(candidate_rows: Sequence[dict[str, Any]], tasks: Sequence[ReferenceTask],
                only_correct: bool = True) -> list[dict[str, Any]]:
    """ConCuR-format rows from the synthesis loop's candidate rows: `speedup_over_eager` is the measured speedup
    of a correct candidate (None otherwise); generator, settings, status and verdict travel with each row."""
    source_of = {task.task_id: task.source for task in tasks}
    out = []
    for row in candidate_rows:
        if row.get("candidate_code") is None or row.get("reject_reason") == "duplicate_candidate":
            continue  # no code, or the same file as a sample already written
        if only_correct and row.get("status") != "correct":
            continue
        correct = row.get("status") == "correct"
        out.append({
            "uuid": f"distilled:{row['job_id']}",
            "problem_name": row["task_id"],
            "pytorch_code": row["pytorch_code"],
            "generated_code": row["candidate_code"],
            "generated_think": None,
            "speedup_over_eager": row.get("speedup") if correct else None,
            "generator_backend": row.get("generator_backend"),
            "generator_model": row.get("generator_model"),
            "generator_settings_json": row.get("generator_settings_json"),
            "finish_reason": row.get("finish_reason"),
            "candidate_index": row.get("candidate_index"),
            "verification_status": row.get("status"),
            "verdict_json": row.get("verdict_json"),
            "task_source": source_of.get(row["task_id"]),
        })
    return out


def distill(tasks: Sequence[ReferenceTask], generator: KernelGenerator, verifier_fn: VerifierFn, n_per_task: int,
            *, seed: int = 0) -> list[dict[str, Any]]:
    """One row per candidate (and per task whose generation failed), verified in one batch; see
    synthesis.instances for the columns and reject reasons. Threshold 0: every correct candidate counts."""
    rows = synthesize_structure_instances(tasks, generator, verifier_fn, n_per_task, 0.0, seed=seed)
    code_of = {task.task_id: task.pytorch_code for task in tasks}
    for row in rows:
        row["pytorch_code"] = code_of[row["task_id"]]
    return rows


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def yield_summary(candidate_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tasks, candidates, statuses, how many were correct / faster, and the yield (distinct correct candidates per
    candidate sampled)."""
    # A duplicate carries its first copy's verdict; it is counted once, as `duplicates`.
    judged = [r for r in candidate_rows if r.get("status") and r.get("reject_reason") != "duplicate_candidate"]
    statuses: dict[str, int] = {}
    for row in judged:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    correct = [r for r in judged if r["status"] == "correct"]
    tasks_with_correct = len({r["task_id"] for r in correct})
    return {
        "tasks": len({r["task_id"] for r in candidate_rows}),
        "candidates": len(candidate_rows),
        "judged": len(judged),
        "by_status": statuses,
        "no_code": sum(1 for r in candidate_rows if r.get("reject_reason") in ("no_code_block", "generation_failed")),
        "duplicates": sum(1 for r in candidate_rows if r.get("reject_reason") == "duplicate_candidate"),
        "compile_errors": statuses.get("compile_error", 0),
        "correct": len(correct),
        "faster_than_eager": sum(1 for r in correct if (r.get("speedup") or 0) > 1.0),
        "tasks_with_a_correct_candidate": tasks_with_correct,
        "yield": round(len(correct) / len(candidate_rows), 4) if candidate_rows else 0.0,
    }


__all__ = ["CONCUR_COLUMNS", "ReferenceTask", "TaskSourceError", "concur_rows", "distill", "load_reference_tasks",
           "write_jsonl", "yield_summary"]
