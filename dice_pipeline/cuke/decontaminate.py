"""Decontamination against KernelBench: find training references that are KernelBench tasks in disguise (renamed
classes and variables, other comments and docstrings, slightly changed sizes) and drop them, naming the task.

Both sides are normalised by `normalize_python(rename=True, abstract_numbers=True)` (comments, docstrings, type
hints and layout removed, identifiers renamed v0, v1, ... in order of appearance, imports folded into the names
that use them, every number replaced by 0), then cut into token shingles. Shingles found in more than
`boilerplate_share` of the KernelBench tasks (`class v0(torch.nn.Module)`, `def get_init_inputs(): return [...]`)
say nothing about which task a file is and are ignored. A row is contaminated when, for some task,

  * its normalised text is identical to the task's (`exact`), or
  * the Jaccard similarity of the two shingle sets is >= `jaccard_threshold` (`jaccard`), or
  * both run the same multiset of operators (`ops.analyze_reference`: same layers, torch calls and arithmetic, in
    any order) and their Jaccard similarity is >= `same_ops_jaccard_threshold` (`same_ops`): the same computation
    written differently (keyword vs positional arguments, other input construction), or
  * the share of the task's shingles found in the row is >= `containment_threshold` and the task has at least
    `min_task_shingles` informative shingles (`containment`: a KernelBench task pasted inside a larger file).

The defaults were set from measurements on the 250 tasks (see `tests/dice_pipeline/cuke/test_decontaminate.py`
and the report of issue 4): a renamed and resized copy scores 1.0, unrelated tasks stay far below the thresholds.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from dice_pipeline.cuke.normalize import code_tokens, normalized_or_collapsed, shingles
from dice_pipeline.cuke.ops import analyze_reference
from dice_pipeline.kernelbench import KernelBenchTask, load_kernelbench_tasks
from dice_pipeline.paths import KERNELBENCH_ENV_VAR, kernelbench_tasks_path
from dice_pipeline.schemas import DECONTAMINATION_DROPS  # declared there, used from here too


@dataclass(frozen=True)
class DecontaminationConfig:
    shingle_size: int = 6
    jaccard_threshold: float = 0.85
    same_ops_jaccard_threshold: float = 0.5
    containment_threshold: float = 0.9
    min_task_shingles: int = 20
    boilerplate_share: float = 0.2

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KernelBenchMatch:
    task_key: str  # e.g. L1/23_Softmax
    rule: str  # exact | jaccard | same_ops | containment
    jaccard: float
    containment: float  # share of the task's informative shingles present in the row


@dataclass
class _Fingerprint:
    normalized: str
    shingles: set = field(default_factory=set)
    ops: frozenset = frozenset()  # (operator, count) pairs; empty when nothing was recognised


class KernelBenchIndex:
    """Shingle index of KernelBench tasks, queried per training reference."""

    def __init__(self, tasks: list[KernelBenchTask], config: DecontaminationConfig | None = None):
        if not tasks:
            raise ValueError("no KernelBench tasks to decontaminate against")
        self.config = config or DecontaminationConfig()
        self.tasks = list(tasks)
        self.task_keys = [task.key for task in tasks]
        raw = [self._raw_fingerprint(task.code) for task in tasks]
        document_frequency = Counter(shingle for fingerprint in raw for shingle in fingerprint.shingles)
        limit = self.config.boilerplate_share * len(tasks)
        self.boilerplate = {shingle for shingle, count in document_frequency.items() if count > limit}
        self.fingerprints = [
            _Fingerprint(fingerprint.normalized, fingerprint.shingles - self.boilerplate, fingerprint.ops)
            for fingerprint in raw
        ]
        self.by_normalized = {fp.normalized: i for i, fp in enumerate(self.fingerprints)}
        self.postings: dict[tuple, list[int]] = {}
        for i, fingerprint in enumerate(self.fingerprints):
            for shingle in fingerprint.shingles:
                self.postings.setdefault(shingle, []).append(i)

    @classmethod
    def from_path(cls, path: str | Path | None = None, config: DecontaminationConfig | None = None):
        """Index KernelBench's tasks at `path` (default: dice_pipeline.paths.kernelbench_tasks_path())."""
        path = path or kernelbench_tasks_path()
        if path is None or not Path(path).exists():
            raise FileNotFoundError(
                f"KernelBench tasks not found ({path or 'no path'}): set {KERNELBENCH_ENV_VAR} to KernelBench's "
                "tasks.jsonl or its KernelBench/ folder"
            )
        return cls(load_kernelbench_tasks(path).tasks, config)

    def _raw_fingerprint(self, code: str) -> _Fingerprint:
        normalized, _ = normalized_or_collapsed(code, rename=True, abstract_numbers=True)
        ops = frozenset(analyze_reference(code).ops.items())
        return _Fingerprint(normalized, shingles(code_tokens(normalized), self.config.shingle_size), ops)

    def similarities(self, code: str) -> list[KernelBenchMatch]:
        """Every task sharing an informative shingle with `code`, best first (by max of jaccard and containment).
        `rule` is set when a threshold is met, else empty."""
        query = self._raw_fingerprint(code)
        exact = self.by_normalized.get(query.normalized)
        informative = query.shingles - self.boilerplate
        shared = Counter(i for shingle in informative for i in self.postings.get(shingle, ()))
        if exact is not None:
            shared.setdefault(exact, len(self.fingerprints[exact].shingles))
        matches = []
        for i, overlap in shared.items():
            task_shingles = len(self.fingerprints[i].shingles)
            union = len(informative) + task_shingles - overlap
            jaccard = overlap / union if union else 1.0
            containment = overlap / task_shingles if task_shingles else 0.0
            same_ops = bool(query.ops) and query.ops == self.fingerprints[i].ops
            rule = self._rule(i == exact, jaccard, containment, task_shingles, same_ops)
            matches.append(KernelBenchMatch(self.task_keys[i], rule, jaccard, containment))
        return sorted(matches, key=lambda m: (-max(m.jaccard, m.containment), m.task_key))

    def _rule(self, exact: bool, jaccard: float, containment: float, task_shingles: int, same_ops: bool) -> str:
        config = self.config
        if exact:
            return "exact"
        if jaccard >= config.jaccard_threshold:
            return "jaccard"
        if same_ops and jaccard >= config.same_ops_jaccard_threshold:
            return "same_ops"
        if containment >= config.containment_threshold and task_shingles >= config.min_task_shingles:
            return "containment"
        return ""

    def match(self, code: str) -> KernelBenchMatch | None:
        """The best task whose similarity meets a rule, or None when `code` is clean."""
        for candidate in self.similarities(code):
            if candidate.rule:
                return candidate
        return None


def decontaminate(
    rows: pl.DataFrame, index: KernelBenchIndex, code_column: str = "pytorch_code", id_column: str = "sample_id"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split `rows` into (clean rows, drops): every row whose `code_column` matches a KernelBench task lands in
    drops with the task it matches and the scores. clean.height + drops.height == rows.height."""
    for column in (code_column, id_column):
        if column not in rows.columns:
            raise ValueError(f"rows have no {column!r} column; have {rows.columns}")
    keep: list[bool] = []
    drops: list[dict] = []
    for row_id, code in zip(rows[id_column].to_list(), rows[code_column].to_list(), strict=True):
        match = index.match(code) if isinstance(code, str) else None
        keep.append(match is None)
        if match is not None:
            drops.append(
                {
                    "row_id": str(row_id),
                    "kernelbench_task": match.task_key,
                    "rule": match.rule,
                    "jaccard": match.jaccard,
                    "containment": match.containment,
                }
            )
    return rows.filter(pl.Series(keep, dtype=pl.Boolean)), pl.DataFrame(drops, schema=DECONTAMINATION_DROPS)


def decontamination_summary(drops: pl.DataFrame, n_checked: int, config: DecontaminationConfig) -> dict:
    """Counts for the dataset card and the Dagster metadata."""
    return {
        "checked": n_checked,
        "dropped": drops.height,
        "by_rule": dict(Counter(drops["rule"].to_list())),
        "by_kernelbench_level": dict(Counter(key.split("/")[0] for key in drops["kernelbench_task"].to_list())),
        "config": json.loads(json.dumps(config.as_dict())),
    }


__all__ = [
    "DECONTAMINATION_DROPS",
    "DecontaminationConfig",
    "KernelBenchIndex",
    "KernelBenchMatch",
    "decontaminate",
    "decontamination_summary",
]
