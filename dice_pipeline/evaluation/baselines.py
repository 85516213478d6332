"""Reference times measured on this host: eager and `torch.compile` for every task, through the verifier's
`measure_references` (verifier 0.3: each reference alone in an isolated GPU worker, the verifier's timing method).
Speedups in reports are computed against these rows, never against another machine's numbers. Without a GPU, or
with a verifier that predates `measure_references`, every row is `not_executed` and its message says why.
Standard library only.
"""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Sequence
from typing import Any

from dice_pipeline.kernelbench import KernelBenchTask

BASELINE_FIELDS = ("task_id", "status", "message", "eager_ms_gpu", "eager_ms_host", "compile_ms_gpu", "peak_gpu_mb",
                   "input_draw", "provenance")
BASELINE_STATUSES = ("measured", "not_executed", "runtime_error", "timeout", "infrastructure_error")


def _not_executed(task_id: str, message: str) -> dict[str, Any]:
    return {"task_id": task_id, "status": "not_executed", "message": message, "eager_ms_gpu": None,
            "eager_ms_host": None, "compile_ms_gpu": None, "peak_gpu_mb": None, "input_draw": None,
            "provenance": {"host": platform.node(),
                           "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}}


def normalise_baseline_row(row: dict[str, Any]) -> dict[str, Any]:
    """A measure_references row with every field present and a known status (an unknown status is an error)."""
    out = {name: row.get(name) for name in BASELINE_FIELDS}
    if out["status"] not in BASELINE_STATUSES:
        raise ValueError(f"baseline row for {out['task_id']!r} has unknown status {out['status']!r}")
    out["provenance"] = dict(out["provenance"] or {})
    return out


def measure_baselines(tasks: Sequence[KernelBenchTask], config, baselines: Sequence[str] = ("eager", "compile"),
                      measure=None) -> list[dict[str, Any]]:
    """One row per task, in order. `measure` defaults to `dice_pipeline.verify.measure_references`."""
    jobs = [(task.key, task.code) for task in tasks]
    if measure is None:
        from dice_pipeline import verify

        measure = getattr(verify, "measure_references", None)
        if measure is None:
            return [_not_executed(task_id, "this verifier has no measure_references (verifier >= 0.3 measures "
                                           "reference baselines); nothing was timed") for task_id, _ in jobs]
    rows = [normalise_baseline_row(row) for row in measure(jobs, config, baselines=tuple(baselines))]
    by_id = {row["task_id"]: row for row in rows}
    if set(by_id) != {task_id for task_id, _ in jobs} or len(rows) != len(jobs):
        raise ValueError(f"measure_references returned {len(rows)} rows for {len(jobs)} tasks (or other task ids)")
    return [by_id[task_id] for task_id, _ in jobs]


def timed_alone(row: dict[str, Any]) -> bool:
    """Whether a sweep row's timings ran with the GPU to itself."""
    if row.get("lanes_per_gpu") == 1:
        return True
    share = (row.get("provenance") or {}).get("gpu_share") or {}
    return bool(share.get("timed_alone"))


def baselines_from_sweep(rows: Sequence[dict[str, Any]], task_ids: Sequence[str],
                         gpu: str | None = None) -> dict[str, dict[str, Any]]:
    """Baseline rows (keyed by task id, in the evaluation's state format) from a full-size sweep's rows
    (`benchmarks/kernelbench_sweep.py`): the same `measure_references` measurement. Only rows of the given tasks
    whose timing had the GPU to itself (one lane, or several lanes whose timed sections ran alone, stated in
    provenance["gpu_share"]; older multi-lane sweeps timed side by side and are skipped) and finished (measured, or
    a reference that failed on its own) are taken; compile numbers only where the sweep timed torch.compile too.
    With `gpu` (the local GPU's name), only rows measured on a GPU of that name: a sweep state can hold rows of
    several machines, and speedups are never computed against another GPU's times. The last row of a task wins."""
    wanted = set(task_ids)
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("task_id") not in wanted or not timed_alone(row):
            continue
        if gpu is not None and (row.get("provenance") or {}).get("gpu") != gpu:
            continue
        if row.get("status") not in ("measured", "runtime_error", "timeout"):
            continue
        seeded = normalise_baseline_row(row)
        if row["status"] == "measured" and "compile" in (row.get("baselines") or []):
            compiled = row.get("compile_ms_gpu")
            seeded.update(compile_status="measured" if compiled else "runtime_error",
                          compile_message=None if compiled else (row.get("compile_error") or "no compiled time"))
        out[row["task_id"]] = seeded
    return out


def speedup_over(baseline_ms: float | None, candidate_ms: float | None) -> float | None:
    """baseline time / candidate time, both measured here; None unless both are positive numbers."""
    if not baseline_ms or not candidate_ms or baseline_ms <= 0 or candidate_ms <= 0:
        return None
    return baseline_ms / candidate_ms
