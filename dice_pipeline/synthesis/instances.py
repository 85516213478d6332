"""Library side of the `structure_instances` asset: generate N candidates per catalogue task, verify them all in one
batch through an injected verifier, and return one row per candidate (kept or not) with its generator, prompt,
code, verdict and the reason it was not kept. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from dice_pipeline.synthesis.candidates import GeneratedCandidate, GenerationError, KernelGenerator
from dice_pipeline.synthesis.catalogue import StructureTask
from dice_pipeline.thresholds import SpeedupThreshold, decide_at_threshold
from dice_pipeline.verify.verdict import Verdict

VerifierFn = Callable[[list[tuple[str, str, str]]], list[Verdict]]

# reject_reason codes of the candidates never judged; a judged one's is the threshold decision's
# (dice_pipeline.thresholds.THRESHOLD_REASONS: failed_verification, not_executed, no_speedup, ...).
GENERATION_FAILED = "generation_failed"
NO_CODE_BLOCK = "no_code_block"
DUPLICATE_CANDIDATE = "duplicate_candidate"

STRUCTURE_INSTANCE_COLUMNS = (
    "task_id", "family", "model_family", "shape_json", "candidate_index", "job_id", "generator_backend",
    "generator_model", "generator_settings_json", "prompt_json", "finish_reason", "latency_s", "candidate_code",
    "verdict_json", "status", "speedup", "kept", "reject_reason", "reject_message", "threshold",
)


def _base_row(task: StructureTask, threshold: SpeedupThreshold) -> dict[str, Any]:
    return {"task_id": task.task_id, "family": task.family, "model_family": task.model_family,
            "shape_json": task.shape_json(), "threshold": threshold.value}


def _candidate_row(task: StructureTask, threshold: SpeedupThreshold, candidate: GeneratedCandidate, index: int) -> dict[str, Any]:
    row = _base_row(task, threshold)
    row.update(
        candidate_index=index,
        job_id=f"{task.task_id}#{index}",
        generator_backend=candidate.backend,
        generator_model=candidate.model,
        generator_settings_json=json.dumps(candidate.variant, sort_keys=True, default=str),
        prompt_json=json.dumps(candidate.prompt_messages, ensure_ascii=False),
        finish_reason=candidate.finish_reason,
        latency_s=float(candidate.latency_s),
        candidate_code=candidate.code,
        verdict_json=None,
        status=None,
        speedup=None,
        kept=False,
        reject_reason=None,
        reject_message=None,
    )
    return row


def judge_verdict(verdict: Verdict, threshold: SpeedupThreshold | float) -> tuple[bool, str | None, str | None]:
    """(kept, reject_reason, message): the one threshold decision (dice_pipeline.thresholds) on a verdict measured
    here; kept only when correct, timed, not overhead-dominated and speedup >= threshold."""
    detail = "; ".join(r.message for r in verdict.reasons) or ",".join(verdict.reason_codes())
    if verdict.status.value == "not_executed" and not detail:
        detail = "verification needs a GPU"
    decision = decide_at_threshold(SpeedupThreshold.parse(threshold, allow_zero=True), status=verdict.status.value,
                                   speedup=verdict.speedup, measured=True, flags=verdict.flags, detail=detail)
    return (True, None, None) if decision.kept else (False, decision.reason_code, decision.message)


def synthesize_structure_instances(
    tasks: Sequence[StructureTask],  # or any task with task_id, family, model_family, pytorch_code, shape_json()
    generator: KernelGenerator,
    verifier_fn: VerifierFn,
    n_per_task: int,
    threshold: SpeedupThreshold | float,
    *,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per candidate (and one per task whose generation failed). Candidates with identical code within a
    task are verified once; later copies are rows with reject_reason `duplicate_candidate`."""
    threshold = SpeedupThreshold.parse(threshold, allow_zero=True)  # 0: every correct one (distillation)
    if n_per_task < 1:
        raise ValueError(f"n_per_task must be >= 1, got {n_per_task}")
    rows: list[dict[str, Any]] = []
    jobs: list[tuple[str, str, str]] = []
    job_rows: dict[str, dict[str, Any]] = {}
    duplicates: list[tuple[dict[str, Any], str]] = []  # (row, job id of the first copy)
    for task in tasks:
        try:
            candidates = generator.generate(task.pytorch_code, n_per_task, seed=seed)
        except GenerationError as exc:
            row = _base_row(task, threshold)
            row.update(generator_backend=getattr(generator, "backend", type(generator).__name__),
                       generator_model=getattr(generator, "model_name", ""), kept=False,
                       reject_reason=GENERATION_FAILED, reject_message=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            continue
        first_job_for_code: dict[str, str] = {}
        for index, candidate in enumerate(candidates):
            row = _candidate_row(task, threshold, candidate, index)
            rows.append(row)
            if not candidate.code:
                row.update(reject_reason=NO_CODE_BLOCK,
                           reject_message=f"the answer has no code block (finish_reason={candidate.finish_reason})")
            elif candidate.code in first_job_for_code:
                duplicates.append((row, first_job_for_code[candidate.code]))
            else:
                first_job_for_code[candidate.code] = row["job_id"]
                jobs.append((row["job_id"], task.pytorch_code, candidate.code))
                job_rows[row["job_id"]] = row

    verdicts = verifier_fn(jobs) if jobs else []
    if len(verdicts) != len(jobs):
        raise RuntimeError(f"verifier returned {len(verdicts)} verdicts for {len(jobs)} jobs")
    for (job_id, _, _), verdict in zip(jobs, verdicts):
        row = job_rows[job_id]
        kept, reason, message = judge_verdict(verdict, threshold)
        row.update(verdict_json=verdict.to_json(), status=verdict.status.value, speedup=verdict.speedup, kept=kept,
                   reject_reason=reason, reject_message=message)
    for row, first_job in duplicates:
        first = job_rows[first_job]
        row.update(verdict_json=first["verdict_json"], status=first["status"], speedup=first["speedup"],
                   kept=False, reject_reason=DUPLICATE_CANDIDATE, reject_message=f"same code as {first_job}")
    for row in rows:
        for column in STRUCTURE_INSTANCE_COLUMNS:
            row.setdefault(column, None)
    return rows
