"""RL tasks and their easy->hard schedule (DICE's data scheduling): what a task holds, the order the stages walk
them in, and how a stage's rows become tasks. Shared by the RL loop (training/rl.py) and the rewards
(training/rewards.py), which need the task but not the loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from training.data import chat_prompt


@dataclass
class RLTask:
    """A task: the chat prompt the model answers, the KernelBench-format reference its kernel is judged against, and
    a difficulty label (number, or numeric string) for easy->hard scheduling. Stage 1 (infilling) tasks also hold the
    `prefix` and `suffix` of the file: the reward judges prefix + generated middle + suffix."""

    task_id: str
    messages: list[dict]
    reference_src: str
    difficulty: int | float | str = 0
    prefix: str | None = None
    suffix: str | None = None


def difficulty_key(task: RLTask) -> float:
    try:
        return float(task.difficulty)
    except (TypeError, ValueError):
        raise ValueError(f"task {task.task_id}: difficulty {task.difficulty!r} is not a number") from None


def order_easy_to_hard(tasks: Sequence[RLTask]) -> list[RLTask]:
    """Tasks by increasing difficulty; ties keep their input order (a stable sort)."""
    return sorted(tasks, key=difficulty_key)


def tasks_for_step(ordered: Sequence[RLTask], step: int, tasks_per_step: int) -> list[RLTask]:
    """The tasks of step `step` (1-based) when walking `ordered` in order, `tasks_per_step` at a time, starting
    over from the beginning when the walk runs off the end. Depends on the step index alone: a restarted run
    gets exactly the tasks the interrupted one would have."""
    if not ordered:
        raise ValueError("no tasks")
    start = (step - 1) * tasks_per_step
    return [ordered[(start + i) % len(ordered)] for i in range(tasks_per_step)]


def schedule(tasks: Sequence[RLTask], steps: int, tasks_per_step: int) -> list[list[RLTask]]:
    """The whole easy->hard walk: for each step 1..steps, its tasks (`tasks_for_step` on the sorted tasks)."""
    ordered = order_easy_to_hard(tasks)
    return [tasks_for_step(ordered, step, tasks_per_step) for step in range(1, steps + 1)]


def task_order_fingerprint(tasks: Sequence[RLTask]) -> str:
    """A hash of the scheduled order of task ids: a resumed run must walk the same list."""
    ids = "\n".join(t.task_id for t in order_easy_to_hard(tasks))
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


def rl_tasks_from_rows(rows: Sequence[dict], stage: str) -> list[RLTask]:
    """`RLTask`s in the order the stage walks them: stage 1 (infilling) in file order, prompts holding prefix and
    suffix; stage 2 (end-to-end) by `schedule_position` (easy -> hard), the KernelBench-style generation prompt."""
    from dice_pipeline.prompts import kernel_generation_messages

    if stage == "rl_infilling":
        return [RLTask(task_id=str(r["task_id"]), messages=chat_prompt(r), reference_src=r["pytorch_code"],
                       difficulty=_difficulty(r), prefix=r["prefix"], suffix=r["suffix"]) for r in rows]
    if stage == "rl_end_to_end":
        ordered = sorted(rows, key=lambda r: r.get("schedule_position", 0))
        return [RLTask(task_id=str(r["task_id"]), messages=kernel_generation_messages(r["pytorch_code"]),
                       reference_src=r["pytorch_code"], difficulty=_difficulty(r)) for r in ordered]
    raise ValueError(f"stage must be rl_infilling or rl_end_to_end, got {stage!r}")


def _difficulty(row: dict) -> int:
    return 0 if row.get("difficulty") is None else int(row["difficulty"])  # unlabelled rows count as easiest
