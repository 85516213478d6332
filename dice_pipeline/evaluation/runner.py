"""Run one evaluation (one model, one task list) resumably: every generation and every verdict is written to a
state directory as soon as it exists, so an interrupted evaluation picks up where it stopped and never generates or
judges a finished task again. A progress bar and a status line per task show where it is. Standard library only
(tqdm where installed: it comes with transformers).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dice_pipeline.evaluation.metrics import INFRASTRUCTURE_ERROR, TaskOutcome, status_value
from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.verify.config import VerifyJob
from dice_pipeline.verify.verdict import Reason, Status, Verdict

# generate(tasks, seed) -> per task, its samples as dicts (text, code, finish_reason, latency_s, usage, ...)
GenerateFn = Callable[[Sequence[KernelBenchTask], int], list[list[dict[str, Any]]]]
# judge(jobs, on_result) -> one verdict per job; on_result(job, verdict) is called as each verdict arrives
JudgeFn = Callable[[list[VerifyJob], Callable[[VerifyJob, Verdict], None]], list[Verdict]]


def state_key(name: str, identity: dict[str, Any]) -> str:
    """A state directory name for one model and generation setup: `name-<hash>`, so re-registering a name with
    another checkpoint, or changing the decoding settings, never reuses the old generations."""
    import hashlib

    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{name}-{digest}"


def state_key_settings(settings) -> dict[str, Any]:
    """The generation settings (EvalGenerationSettings) as the state key hashes them: `confidence_threshold` under
    its earlier name `threshold`, so an evaluation interrupted before the rename resumes in the same directory."""
    values = settings.to_dict()
    values["threshold"] = values.pop("confidence_threshold")
    return values


def default_state_dir(model, settings, level: int, checkpoint_path: str = "") -> Path:
    """Where an evaluation of `model` (an EvalModel) at `settings` on `level` keeps its generations and verdicts:
    <cache>/kernelbench_eval/<name>-<hash of the model, its path and the settings>/level<N>."""
    import dataclasses

    from dice_pipeline.paths import cache_dir

    identity = {**dataclasses.asdict(model), "path": checkpoint_path or model.path,
                "settings": state_key_settings(settings)}
    return cache_dir() / "kernelbench_eval" / state_key(model.name, identity) / f"level{level}"


def stored_progress(state_dir: str | os.PathLike) -> tuple[int, int]:
    """(generations, verdicts) an evaluation's state directory holds: what a rerun will not redo."""
    root = Path(state_dir)
    return tuple(len(list((root / part).glob("*.json"))) if (root / part).is_dir() else 0  # type: ignore[return-value]
                 for part in ("generations", "verdicts"))


def _file_name(task_key: str, sample_index: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "__", task_key) + f"__s{sample_index}.json"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(data, out, sort_keys=True)
    os.replace(tmp, path)  # atomic: an interrupted write never leaves half a file behind


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # absent, or damaged by a crash: the work is done again


def no_code_verdict() -> Verdict:
    """The verdict of an answer with no code block: nothing to build, a compile failure as KernelBench counts it."""
    return Verdict(status=Status.COMPILE_ERROR,
                   reasons=[Reason("no_code_block", "the answer holds no python code block to judge", "static")])


def verdict_is_final(verdict: Verdict, can_execute: bool) -> bool:
    """Whether a stored verdict stands: infrastructure errors are retried, and a `not_executed` verdict is judged
    again once a GPU is there to execute it."""
    if status_value(verdict) == INFRASTRUCTURE_ERROR:
        return False
    return not (verdict.status == Status.NOT_EXECUTED and can_execute)


class EvaluationState:
    """The state directory of one evaluation: `generations/` and `verdicts/`, one JSON file per task sample."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def generation(self, task_key: str, sample_index: int) -> dict[str, Any] | None:
        return _read_json(self.root / "generations" / _file_name(task_key, sample_index))

    def put_generation(self, task_key: str, sample_index: int, sample: dict[str, Any]) -> None:
        _write_json(self.root / "generations" / _file_name(task_key, sample_index), sample)

    def verdict(self, task_key: str, sample_index: int) -> Verdict | None:
        data = _read_json(self.root / "verdicts" / _file_name(task_key, sample_index))
        try:
            return None if data is None else Verdict.from_dict(data)
        except (ValueError, TypeError, KeyError):
            return None  # written by another verifier version (a status this one lacks): judged again

    def put_verdict(self, task_key: str, sample_index: int, verdict: Verdict) -> None:
        _write_json(self.root / "verdicts" / _file_name(task_key, sample_index), verdict.to_dict())


@dataclass
class SampleResult:
    task: KernelBenchTask
    sample_index: int
    generation: dict[str, Any] | None
    verdict: Verdict | None
    reused_generation: bool = False
    reused_verdict: bool = False


@dataclass
class EvaluationRun:
    results: list[SampleResult] = field(default_factory=list)
    generated: int = 0  # samples generated by this call (not read back from the state directory)
    judged: int = 0  # verdicts produced by this call
    stopped_early: str | None = None  # why work was left undone (the deadline), None when every task is finished

    def outcomes(self) -> list[TaskOutcome]:
        by_task: dict[str, TaskOutcome] = {}
        for result in self.results:
            outcome = by_task.setdefault(result.task.key, TaskOutcome(result.task.key, [], result.task.known_issues))
            outcome.verdicts.append(result.verdict)
        return list(by_task.values())


class _Progress:
    """tqdm where it is installed, else plain log lines; always a status line per task through `log`."""

    def __init__(self, total: int, description: str, log: Callable[[str], None], enabled: bool = True):
        self.log, self.description, self.total, self.done = log, description, total, 0
        self.bar = None
        if enabled and total:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=description, unit="task", leave=True)
            except ImportError:
                pass

    def step(self, message: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(message[:60])
        self.log(f"[{self.description} {self.done}/{self.total}] {message}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Budget:
    """Starts a batch or chunk only if the longest one so far would still end before the deadline, so a time-boxed
    run stops in time to write its results instead of being killed in the middle of a step."""

    def __init__(self, deadline: float | None):
        self.deadline, self.longest, self.started = deadline, 0.0, None

    def allows_another(self) -> bool:
        return self.deadline is None or time.monotonic() + self.longest < self.deadline

    def start(self) -> None:
        self.started = time.monotonic()

    def finish(self) -> None:
        self.longest = max(self.longest, time.monotonic() - self.started)


def _budgeted_chunks(items: list, size: int, deadline: float | None, run: EvaluationRun, what: str):
    """Consecutive chunks of `items`, each started only if the longest chunk so far still ends before the deadline
    (the time a chunk takes is the caller's work on it between two yields); when one is refused,
    `run.stopped_early` says how many items were left `what` (e.g. "tasks not generated")."""
    budget = _Budget(deadline)
    size = max(1, size)
    for start in range(0, len(items), size):
        if not budget.allows_another():
            run.stopped_early = f"deadline reached with {len(items) - start} {what}"
            return
        budget.start()
        yield items[start:start + size]
        budget.finish()


def run_evaluation(tasks: Sequence[KernelBenchTask], *, state_dir: str | os.PathLike, generate: GenerateFn | None,
                   judge: JudgeFn, samples: int = 1, seed: int = 0, can_execute: bool = False,
                   generation_batch: int = 16, judge_chunk: int = 0, deadline: float | None = None,
                   log: Callable[[str], None] = print, progress: bool = True) -> EvaluationRun:
    """Generate `samples` answers per task (what the state directory lacks), then judge every answer without a
    final verdict. `generate=None` judges stored generations only. `judge_chunk` > 0 judges in chunks of that many
    jobs. With a `deadline` (a time.monotonic() value), no generation batch or judging chunk starts that would end
    after it, judged by the longest one so far."""
    state = EvaluationState(state_dir)
    run = EvaluationRun()
    generations: dict[tuple[str, int], dict[str, Any]] = {}
    missing: list[KernelBenchTask] = []
    for task in tasks:
        stored = [state.generation(task.key, k) for k in range(samples)]
        for k, sample in enumerate(stored):
            if sample is not None:
                generations[(task.key, k)] = sample
        if any(sample is None for sample in stored):
            missing.append(task)
    reused = set(generations)

    if missing and generate is not None:
        bar = _Progress(len(missing), "generate", log, progress)
        try:
            for batch in _budgeted_chunks(missing, generation_batch, deadline, run, "tasks not generated"):
                answers = generate(batch, seed)
                for task, task_samples in zip(batch, answers):
                    for k, sample in enumerate(task_samples[:samples]):
                        state.put_generation(task.key, k, sample)
                        generations[(task.key, k)] = sample
                        run.generated += 1
                    codes = sum(1 for s in task_samples if s.get("code"))
                    bar.step(f"{task.key}: {len(task_samples)} sample(s), {codes} with code, "
                             f"finish={task_samples[0].get('finish_reason') if task_samples else None}")
        finally:
            bar.close()
    elif missing:
        run.stopped_early = f"{len(missing)} tasks have no stored generation and no generator was given"

    verdicts: dict[tuple[str, int], Verdict] = {}
    reused_verdicts: set[tuple[str, int]] = set()
    jobs: list[VerifyJob] = []
    job_keys: dict[str, tuple[KernelBenchTask, int]] = {}
    for task in tasks:
        for k in range(samples):
            sample = generations.get((task.key, k))
            if sample is None:
                continue
            stored = state.verdict(task.key, k)
            if stored is not None and verdict_is_final(stored, can_execute):
                verdicts[(task.key, k)] = stored
                reused_verdicts.add((task.key, k))
            elif not sample.get("code"):
                verdict = no_code_verdict()
                state.put_verdict(task.key, k, verdict)
                verdicts[(task.key, k)] = verdict
            else:
                job_id = f"{task.key}#s{k}"
                jobs.append(VerifyJob(job_id, task.code, sample["code"]))
                job_keys[job_id] = (task, k)

    if jobs:
        bar = _Progress(len(jobs), "judge", log, progress)

        def on_result(job: VerifyJob, verdict: Verdict) -> None:
            task, k = job_keys[job.job_id]
            state.put_verdict(task.key, k, verdict)
            verdicts[(task.key, k)] = verdict
            run.judged += 1
            bar.step(f"{job.job_id}: {verdict.summary()}")

        chunk = judge_chunk if judge_chunk > 0 else len(jobs)
        try:
            for part in _budgeted_chunks(jobs, chunk, deadline, run, "answers not judged"):
                returned = judge(part, on_result)
                for job, verdict in zip(part, returned):  # a judge that never called on_result still counts
                    task, k = job_keys[job.job_id]
                    if (task.key, k) not in verdicts:
                        on_result(job, verdict)
        finally:
            bar.close()

    for task in tasks:
        for k in range(samples):
            run.results.append(SampleResult(task, k, generations.get((task.key, k)), verdicts.get((task.key, k)),
                                            (task.key, k) in reused, (task.key, k) in reused_verdicts))
    return run
