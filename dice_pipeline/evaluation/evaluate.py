"""One evaluation of one model on one level, end to end: generate (resumably), judge the answers and the sanity
rows with the verifier, join the locally measured baselines, and compute the metrics. Returns plain rows (dicts),
so the Dagster assets, `dice eval` and the GPU script share it. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dice_pipeline.evaluation.baselines import speedup_over
from dice_pipeline.evaluation.metrics import (
    FAST_P_CONVENTION,
    correct_at,
    evaluation_metrics,
    speedup_of,
    status_value,
)
from dice_pipeline.evaluation.runner import EvaluationRun, GenerateFn, JudgeFn, run_evaluation
from dice_pipeline.evaluation.sanity import judge_sanity, sanity_cases, sanity_jobs
from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.verdict import Status, Verdict


def evaluation_verify_config(**overrides: Any) -> VerifyConfig:
    """The verifier config for KernelBench-compatible evaluation: atol=rtol=1e-2 decides the status (both
    tolerances are recorded), and a candidate whose own kernels do a minor share of the work is flagged
    `baseline_kernel`, not rejected (verifier 0.3's `baseline_kernel_policy="report"`, where that field exists)."""
    fields = {f.name for f in dataclasses.fields(VerifyConfig)}
    settings = {"tolerance_policy": "v0.1", **overrides}
    if "baseline_kernel_policy" in fields:
        settings.setdefault("baseline_kernel_policy", "report")
    return VerifyConfig(**{k: v for k, v in settings.items() if k in fields})


def verifier_judge(config: VerifyConfig) -> JudgeFn:
    from dice_pipeline.verify.api import verify_batch

    return lambda jobs, on_result: verify_batch(jobs, config, on_result=on_result)


def can_execute(config: VerifyConfig) -> bool:
    if config.execute is not None:
        return bool(config.execute)
    from dice_pipeline.verify.api import gpu_inventory

    return bool(gpu_inventory())


@dataclass
class LevelEvaluation:
    checkpoint: str
    level: int
    results: list[dict[str, Any]] = field(default_factory=list)  # one row per task sample
    sanity: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one row per tolerance
    run: EvaluationRun | None = None
    executed: bool = False

    @property
    def complete(self) -> bool:
        return self.run is not None and self.run.stopped_early is None


def _timing_ms(verdict: Verdict | None, name: str) -> float | None:
    timing = getattr(verdict, name, None) if verdict is not None else None
    return None if timing is None else timing.median_ms


def result_row(checkpoint: str, result, baseline: dict[str, Any] | None) -> dict[str, Any]:
    task, verdict, sample = result.task, result.verdict, result.generation or {}
    candidate_ms = _timing_ms(verdict, "candidate_timing")
    baseline = baseline or {}
    usage = sample.get("usage") or {}
    provenance = (verdict.provenance or {}) if verdict is not None else {}
    return {
        "checkpoint": checkpoint, "level": task.level, "task_key": task.key, "problem_id": task.problem_id,
        "name": task.name, "sample_index": result.sample_index, "known_issues": task.known_issues,
        "generator_backend": sample.get("backend"), "generator_model": sample.get("model"),
        "generation_settings_json": json.dumps(sample.get("settings") or {}, sort_keys=True),
        "finish_reason": sample.get("finish_reason"), "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"), "latency_s": sample.get("latency_s"),
        "has_code": bool(sample.get("code")), "candidate_code": sample.get("code"), "answer_text": sample.get("text"),
        "status": "missing" if verdict is None else status_value(verdict),
        # ran on a GPU (as verified_pairs counts it): correctness trials were run
        "executed": verdict is not None and verdict.status != Status.NOT_EXECUTED and verdict.trials_run is not None,
        "reason_codes": [] if verdict is None else verdict.reason_codes(),
        "flags": [] if verdict is None else list(verdict.flags),
        "correct_at_1e2": correct_at(verdict, "1e-2"), "correct_at_1e4": correct_at(verdict, "1e-4"),
        "speedup": None if verdict is None else verdict.speedup,
        "speedup_gpu": None if verdict is None else speedup_of(verdict, "gpu"),
        "speedup_host": None if verdict is None else speedup_of(verdict, "host"),
        "reference_ms": _timing_ms(verdict, "reference_timing"), "candidate_ms": candidate_ms,
        "baseline_status": baseline.get("status"), "baseline_eager_ms_gpu": baseline.get("eager_ms_gpu"),
        "baseline_compile_ms_gpu": baseline.get("compile_ms_gpu"),
        "speedup_vs_eager_baseline": speedup_over(baseline.get("eager_ms_gpu"), candidate_ms),
        "speedup_vs_compile": speedup_over(baseline.get("compile_ms_gpu"), candidate_ms),
        "verdict_json": None if verdict is None else verdict.to_json(),
        "gpu_name": provenance.get("gpu"), "verifier_version": provenance.get("verifier_version"),
        "reused_verdict": result.reused_verdict,
    }


def evaluate_level(tasks: Sequence[KernelBenchTask], *, checkpoint: str, level: int, generate: GenerateFn | None,
                   config: VerifyConfig, state_dir: str, samples: int = 1, seed: int = 0,
                   baselines: Sequence[dict[str, Any]] = (), judge: JudgeFn | None = None, sanity: bool = True,
                   generation_batch: int = 16, judge_chunk: int = 0, deadline: float | None = None,
                   log: Callable[[str], None] = print, progress: bool = True,
                   pass_k: Sequence[int] = ()) -> LevelEvaluation:
    """Evaluate `tasks` (one level) for one model. `baselines`: measure_references rows (task_id = task key)."""
    tasks = [task for task in tasks if task.level == level]
    judge = judge or verifier_judge(config)
    executes = can_execute(config)
    log(f"evaluating {checkpoint} on level {level}: {len(tasks)} tasks, {samples} sample(s) each, "
        f"execution {'on the GPU' if executes else 'not run (no GPU): static checks only, verdicts not_executed'}")
    run = run_evaluation(tasks, state_dir=state_dir, generate=generate, judge=judge, samples=samples, seed=seed,
                         can_execute=executes, generation_batch=generation_batch, judge_chunk=judge_chunk,
                         deadline=deadline, log=log, progress=progress)
    by_task = {row["task_id"]: row for row in baselines}
    evaluation = LevelEvaluation(checkpoint, level, run=run, executed=executes)
    evaluation.results = [result_row(checkpoint, r, by_task.get(r.task.key)) for r in run.results]
    if sanity:
        cases = sanity_cases(tasks)
        verdicts = judge(sanity_jobs(cases), lambda job, verdict: log(f"{job.job_id}: {verdict.summary()}"))
        evaluation.sanity = [judge_sanity(case, verdict) for case, verdict in zip(cases, verdicts)]
        for row in evaluation.sanity:
            log(f"sanity {row['check']} on {row['subject']}: {'ok' if row['passed'] else 'FAILED'} "
                f"({row['asserted']}; {row['summary']})")
    for row in evaluation_metrics(run.outcomes(), convention=FAST_P_CONVENTION, pass_k=pass_k):
        evaluation.metrics.append({"checkpoint": checkpoint, "level": level, "executed": executes,
                                   "complete": evaluation.complete, **row})
    return evaluation
