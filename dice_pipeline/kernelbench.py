"""KernelBench tasks and scores: load the task set (the Hugging Face dataset, a jsonl export or a checkout's
`levelN/*.py` folders), name the tasks known to be broken, and compute KernelBench's metrics (Exec and fast_p per
level) from verifier verdicts. Standard library only at import (`datasets` is imported only to read the Hugging Face
dataset), so evaluation workers on a GPU host can import it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dice_pipeline.verify.verdict import Status, Verdict

# KernelBench's fast_p thresholds: a task counts when it is correct and its speedup is strictly greater than p.
FAST_P_THRESHOLDS = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
# Level 4 builds models with `from_pretrained`: it needs hub weights and network access, which our hosts lack.
SKIPPED_LEVELS = {4: ("level4_needs_hub_weights", "level 4 loads Hugging Face weights over the network")}
# The Hugging Face copy: one split per level ("level_1" ...), columns code, level, name, problem_id.
HF_DATASET_ID = "ScalingIntelligence/KernelBench"
HF_SOURCE_PREFIX = "hf:"
# Tasks whose reference itself misbehaves, or that a degenerate answer passes (NOTES.md section 2 and 3). They stay
# in every evaluation and every denominator; their results carry these codes so a reader can discount them.
KNOWN_TASK_ISSUES: dict[tuple[int, int], tuple[tuple[str, str], ...]] = {
    (1, 23): (("zeros_pass_at_1e2", "all-zeros output passes at atol=rtol=1e-2 (Softmax)"),),
    (1, 37): (("zeros_pass_at_1e2", "all-zeros output passes at atol=rtol=1e-2 (Frobenius norm)"),),
    (1, 39): (("zeros_pass_at_1e2", "all-zeros output passes at atol=rtol=1e-2 (L2 norm)"),),
    (1, 53): (("zeros_pass_at_1e2", "all-zeros output passes at atol=rtol=1e-2 (Min reduction)"),),
    (1, 95): (("integer_inputs", "targets are integer class indices: casting inputs to float breaks CrossEntropy"),),
    (2, 66): (("live_dropout", "no .eval(): dropout is live, the reference is random"),),
    (2, 83): (("live_dropout", "no .eval(): dropout is live, the reference is random"),
              ("output_identically_zero", "the reference's output is identically 0: any zeros kernel passes")),
    (3, 35): (("random_in_forward", "the reference draws random state in forward"),),
}
_TASK_FILE_NAME = re.compile(r"^(\d+)_.+$")
_LEVEL_DIR_NAME = re.compile(r"^level(\d+)$")


@dataclass(frozen=True)
class KernelBenchTask:
    level: int
    problem_id: int
    name: str  # file name without `.py`, e.g. "1_Square_matrix_multiplication_"
    code: str

    @property
    def key(self) -> str:
        """A stable id, e.g. `L1/1_Square_matrix_multiplication_`."""
        return f"L{self.level}/{self.name}"

    @property
    def known_issues(self) -> list[str]:
        """Codes of KNOWN_TASK_ISSUES for this task (empty for a sound task)."""
        return [code for code, _ in KNOWN_TASK_ISSUES.get((self.level, self.problem_id), ())]


@dataclass(frozen=True)
class SkippedTask:
    origin: str  # "path:line" or a file path
    reason_code: str
    message: str


@dataclass
class KernelBenchTaskSet:
    tasks: list[KernelBenchTask] = field(default_factory=list)
    skipped: list[SkippedTask] = field(default_factory=list)

    def by_key(self) -> dict[str, KernelBenchTask]:
        return {task.key: task for task in self.tasks}

    def levels(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for task in self.tasks:
            counts[task.level] = counts.get(task.level, 0) + 1
        return dict(sorted(counts.items()))


def task_format_problems(code: str) -> list[str]:
    """What keeps `code` from being a KernelBench-format task: reason codes, empty when it is fine."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return ["unparseable_code"]
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    problems = []
    if "Model" not in classes:
        problems.append("no_model_class")
    for required in ("get_inputs", "get_init_inputs"):
        if required not in functions:
            problems.append(f"no_{required}")
    return problems


def _accept(
    task_set: KernelBenchTaskSet, seen: set[tuple[int, int]], origin: str, task: KernelBenchTask, levels
) -> None:
    if task.level in SKIPPED_LEVELS:
        code, message = SKIPPED_LEVELS[task.level]
        task_set.skipped.append(SkippedTask(origin, code, message))
        return
    if levels is not None and task.level not in levels:
        task_set.skipped.append(SkippedTask(origin, "level_not_requested", f"level {task.level} not in {levels}"))
        return
    if (task.level, task.problem_id) in seen:
        task_set.skipped.append(
            SkippedTask(origin, "duplicate_task", f"level {task.level} problem {task.problem_id} seen before")
        )
        return
    problems = task_format_problems(task.code)
    if problems:
        task_set.skipped.append(SkippedTask(origin, problems[0], f"not a KernelBench-format task: {problems}"))
        return
    seen.add((task.level, task.problem_id))
    task_set.tasks.append(task)


def _tasks_from_jsonl(path: Path, levels, task_set: KernelBenchTaskSet) -> None:
    seen: set[tuple[int, int]] = set()
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            origin = f"{path}:{line_number}"
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                task = KernelBenchTask(
                    level=int(row["level"]), problem_id=int(row["problem_id"]), name=str(row["name"]), code=row["code"]
                )
                if not isinstance(task.code, str):
                    raise TypeError("code is not a string")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                task_set.skipped.append(SkippedTask(origin, "malformed_row", f"{type(error).__name__}: {error}"))
                continue
            _accept(task_set, seen, origin, task, levels)


def _tasks_from_directory(root: Path, levels, task_set: KernelBenchTaskSet) -> None:
    seen: set[tuple[int, int]] = set()
    level_dirs = []
    for child in root.iterdir():
        match = _LEVEL_DIR_NAME.match(child.name)
        if child.is_dir() and match:
            level_dirs.append((int(match.group(1)), child))
    if not level_dirs:
        raise ValueError(f"{root} holds no levelN/ folders")
    for level, folder in sorted(level_dirs):
        files = [p for p in folder.glob("*.py") if _TASK_FILE_NAME.match(p.stem)]
        for path in sorted(files, key=lambda p: int(_TASK_FILE_NAME.match(p.stem).group(1))):
            problem_id = int(_TASK_FILE_NAME.match(path.stem).group(1))
            task = KernelBenchTask(level, problem_id, path.stem, path.read_text(encoding="utf-8"))
            _accept(task_set, seen, str(path), task, levels)
        for path in sorted(set(folder.glob("*.py")) - set(files)):
            task_set.skipped.append(SkippedTask(str(path), "unrecognised_file_name", "expected <id>_<name>.py"))


def _rows_from_hf_dataset(dataset_id: str, levels) -> Iterable[tuple[str, dict]]:
    """(origin, row) of every requested level's split of a Hugging Face dataset: a hub id, a folder in the hub
    layout (`data/level_1-*.parquet` + README) or a folder written by `DatasetDict.save_to_disk`."""
    import datasets  # only here: GPU hosts and the stdlib-only callers never reach this

    local = Path(dataset_id)
    if local.is_dir() and ((local / "dataset_dict.json").is_file() or (local / "dataset_info.json").is_file()):
        loaded = datasets.load_from_disk(str(local))
        splits = loaded if isinstance(loaded, datasets.DatasetDict) else {"level_?": loaded}
    else:
        splits = datasets.load_dataset(dataset_id)
    for split_name in sorted(splits):
        match = re.fullmatch(r"level_(\d+)", split_name)
        if match and levels is not None and int(match.group(1)) not in levels:
            continue  # not downloaded into rows at all; the caller asked for other levels
        for index, row in enumerate(splits[split_name]):
            yield f"{HF_SOURCE_PREFIX}{dataset_id}[{split_name}]:{index}", row


def _tasks_from_hf(dataset_id: str, levels, task_set: KernelBenchTaskSet) -> None:
    seen: set[tuple[int, int]] = set()
    for origin, row in _rows_from_hf_dataset(dataset_id, levels):
        try:
            task = KernelBenchTask(
                level=int(row["level"]), problem_id=int(row["problem_id"]), name=str(row["name"]), code=row["code"]
            )
            if not isinstance(task.code, str):
                raise TypeError("code is not a string")
        except (KeyError, TypeError, ValueError) as error:
            task_set.skipped.append(SkippedTask(origin, "malformed_row", f"{type(error).__name__}: {error}"))
            continue
        _accept(task_set, seen, origin, task, levels)


def load_kernelbench_tasks(path: str | Path, levels: Iterable[int] | None = None) -> KernelBenchTaskSet:
    """Load KernelBench tasks from a jsonl file (fields level, problem_id, name, code), from a folder holding
    `level1/`, `level2/`, ... of `<id>_<name>.py` files (a KernelBench checkout's `KernelBench/` folder), or from
    the Hugging Face dataset: `hf:ScalingIntelligence/KernelBench` (or `hf:<local folder>` in the hub layout or
    saved by `datasets`), one split `level_N` per level.

    Level 4 and malformed or non-task rows are returned in `skipped` with a reason code, never dropped silently.
    `levels` restricts the levels kept (others are skipped with `level_not_requested`)."""
    wanted = None if levels is None else tuple(sorted(set(levels)))
    task_set = KernelBenchTaskSet()
    if isinstance(path, str) and path.startswith(HF_SOURCE_PREFIX):
        _tasks_from_hf(path[len(HF_SOURCE_PREFIX):], wanted, task_set)
        task_set.tasks.sort(key=lambda task: (task.level, task.problem_id))
        return task_set
    path = Path(path)
    if path.is_dir():
        _tasks_from_directory(path, wanted, task_set)
    elif path.is_file():
        _tasks_from_jsonl(path, wanted, task_set)
    else:
        raise FileNotFoundError(f"no KernelBench task file or folder at {path}")
    task_set.tasks.sort(key=lambda task: (task.level, task.problem_id))
    return task_set


# --- metrics


@dataclass(frozen=True)
class LevelScore:
    """KernelBench's metrics for one level (or `level=None` for all levels pooled), as fractions of n_tasks."""

    level: int | None
    n_tasks: int
    n_correct: int
    exec_rate: float  # correct / tasks ("Exec" in the DICE tables)
    fast_p: dict[float, float]  # p -> (# correct with speedup > p) / tasks
    n_missing: int = 0  # tasks with no verdict (counted as failures)
    n_not_executed: int = 0  # verdicts that could not run (no GPU); they are failures for the score

    def as_row(self) -> dict:
        row = {
            "level": self.level,
            "n_tasks": self.n_tasks,
            "n_correct": self.n_correct,
            "exec_rate": self.exec_rate,
            "n_missing": self.n_missing,
            "n_not_executed": self.n_not_executed,
        }
        row.update({f"fast_{p:g}": value for p, value in self.fast_p.items()})
        return row


def _task_key(task: KernelBenchTask | str | int) -> str:
    return task.key if isinstance(task, KernelBenchTask) else str(task)


def _score(level, outcomes: list[Verdict | None], thresholds) -> LevelScore:
    n_tasks = len(outcomes)
    correct = [v for v in outcomes if v is not None and v.status == Status.CORRECT]

    def share(count: int) -> float:
        return count / n_tasks if n_tasks else 0.0

    # A correct verdict without a measured speedup cannot count as faster than anything (not even p=0).
    fast = {p: share(sum(1 for v in correct if v.speedup is not None and v.speedup > p)) for p in thresholds}
    return LevelScore(
        level=level,
        n_tasks=n_tasks,
        n_correct=len(correct),
        exec_rate=share(len(correct)),
        fast_p=fast,
        n_missing=sum(1 for v in outcomes if v is None),
        n_not_executed=sum(1 for v in outcomes if v is not None and v.status == Status.NOT_EXECUTED),
    )


def score_kernelbench(
    results: Iterable[tuple[int, KernelBenchTask | str | int, Verdict]],
    tasks: Iterable[KernelBenchTask] | None = None,
    thresholds: Iterable[float] = FAST_P_THRESHOLDS,
) -> list[LevelScore]:
    """Exec and fast_p per level, then pooled over all levels (the last entry, `level=None`).

    `results` holds one (level, task, verdict) per task; a task given twice is an error (KernelBench scores one
    sample per task). With `tasks`, the denominator is that task list and tasks without a verdict count as
    failures; without it, the denominator is the tasks that have a verdict."""
    thresholds = tuple(thresholds)
    by_task: dict[tuple[int, str], Verdict | None] = {}
    for level, task, verdict in results:
        key = (int(level), _task_key(task))
        if key in by_task:
            raise ValueError(f"task {key} has more than one verdict; score one sample per task")
        if not isinstance(verdict, Verdict):
            raise TypeError(f"task {key}: expected a Verdict, got {type(verdict).__name__}")
        by_task[key] = verdict
    if tasks is not None:
        expected = {(task.level, task.key) for task in tasks}
        unknown = sorted(set(by_task) - expected)
        if unknown:
            raise ValueError(f"verdicts for tasks outside the task list: {unknown[:5]}")
        by_task = {key: by_task.get(key) for key in sorted(expected)}
    levels = sorted({level for level, _ in by_task})
    scores = [_score(level, [v for (lv, _), v in by_task.items() if lv == level], thresholds) for level in levels]
    scores.append(_score(None, list(by_task.values()), thresholds))
    return scores


def format_scores(scores: list[LevelScore]) -> str:
    """A Markdown table in percent, the layout of the DICE results (Exec / fast_1 / fast_2 and the rest)."""
    if not scores:
        return "(no scores)"
    ps = list(scores[0].fast_p)
    header = "| level | tasks | Exec % | " + " | ".join(f"fast_{p:g} %" for p in ps) + " |"
    lines = [header, "|" + "---|" * (3 + len(ps))]
    for score in scores:
        name = "all" if score.level is None else str(score.level)
        cells = [name, str(score.n_tasks), f"{100 * score.exec_rate:.1f}"]
        cells += [f"{100 * score.fast_p[p]:.1f}" for p in ps]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = [
    "FAST_P_THRESHOLDS",
    "HF_DATASET_ID",
    "KNOWN_TASK_ISSUES",
    "KernelBenchTask",
    "KernelBenchTaskSet",
    "LevelScore",
    "SkippedTask",
    "format_scores",
    "load_kernelbench_tasks",
    "score_kernelbench",
    "task_format_problems",
]
