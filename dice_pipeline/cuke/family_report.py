"""Per-family accounting of a CuKe build: for each operator family (synthetic catalogue names; other sources by
`operators.operator_family`), how many candidates came in, became samples, were held out or dropped by each
decontamination rule, and the operator-level overlap with KernelBench levels 1 and 2 that remains: kept samples
whose reference runs exactly the set of operators some L1/L2 task runs (same computation written differently,
below the decontamination thresholds), and how many L1/L2 tasks fall in the family at all.

Also `kernelbench_family_map`: the family of every KernelBench task, so evaluation can split its scores into
families seen in training, held out, and not covered by the catalogue.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import polars as pl

from dice_pipeline.cuke.decontaminate import KernelBenchIndex
from dice_pipeline.cuke.ops import analyze_reference

FAMILY_REPORT = pl.Schema({
    "family": pl.String,
    "held_out": pl.Boolean,
    "candidates": pl.Int64,
    "samples": pl.Int64,
    "rejected_held_out": pl.Int64,
    "rejected_other": pl.Int64,  # failed verification, below the threshold, duplicates, ...
    "dropped_exact": pl.Int64,
    "dropped_jaccard": pl.Int64,
    "dropped_same_ops": pl.Int64,
    "dropped_containment": pl.Int64,
    "kernelbench_l1_tasks": pl.Int64,  # L1 tasks in this family (operator_family of their reference)
    "kernelbench_l2_tasks": pl.Int64,
    "samples_sharing_l1_l2_op_set": pl.Int64,  # kept samples running exactly an L1/L2 task's operator set
    "shared_op_set_tasks": pl.String,  # those tasks, comma-separated
})

DECONTAMINATION_RULES = ("exact", "jaccard", "same_ops", "containment")


def _op_set(code: str) -> frozenset[str]:
    return frozenset(analyze_reference(code).ops)


def kernelbench_family_map(tasks) -> dict[str, str]:
    """Task key -> catalogue family ("not_covered" where no family covers the task: attention, recurrences), for
    KernelBench tasks (dice_pipeline.kernelbench.KernelBenchTask)."""
    from dice_pipeline.synthesis.operators import operator_family

    return {task.key: operator_family(task.code) or "not_covered" for task in tasks}


def family_report(candidates: pl.DataFrame, samples: pl.DataFrame, rejects: pl.DataFrame, drops: pl.DataFrame,
                  index: KernelBenchIndex | None, held_out_families: tuple[str, ...]) -> pl.DataFrame:
    """`candidates`: source_id, family, pytorch_code of every candidate; `samples` and `rejects` as built;
    `drops`: the decontamination drops (row_id = sample_id). Without `index` the KernelBench columns are 0."""
    family_of_source = dict(zip(candidates["source_id"].to_list(), candidates["family"].to_list()))
    family_of_sample = dict(zip(samples["sample_id"].to_list(), samples["family"].to_list()))
    for row in rejects.filter(pl.col("sample_id").is_not_null()).iter_rows(named=True):
        family_of_sample.setdefault(row["sample_id"], family_of_source.get(row["source_id"]))
    rejected_held: Counter = Counter()
    rejected_other: Counter = Counter()
    for source_id, reason in rejects.select("source_id", "reason_code").iter_rows():
        family = family_of_source.get(source_id)
        if reason == "held_out_family":
            rejected_held[family] += 1
        elif reason != "kernelbench_overlap":
            rejected_other[family] += 1
    dropped: dict[str, Counter] = defaultdict(Counter)
    for row_id, rule in drops.select("row_id", "rule").iter_rows():
        dropped[family_of_sample.get(row_id)][rule] += 1
    l1: Counter = Counter()
    l2: Counter = Counter()
    task_sets: list[tuple[str, frozenset[str]]] = []
    if index is not None:
        families = kernelbench_family_map(index.tasks)
        for task in index.tasks:
            if task.level in (1, 2):
                (l1 if task.level == 1 else l2)[families[task.key]] += 1
                task_sets.append((task.key, _op_set(task.code)))
    by_set: dict[frozenset[str], list[str]] = defaultdict(list)
    for key, ops in task_sets:
        if ops:
            by_set[ops].append(key)
    sharing: Counter = Counter()
    shared_tasks: dict[str, set[str]] = defaultdict(set)
    for family, code in samples.select("family", "pytorch_code").iter_rows():
        tasks = by_set.get(_op_set(code))
        if tasks:
            sharing[family] += 1
            shared_tasks[family].update(tasks)
    candidate_counts = Counter(candidates["family"].to_list())
    sample_counts = Counter(samples["family"].to_list())
    rows = []
    for family in sorted(set(candidate_counts) | set(l1) | set(l2), key=lambda f: (f is None, str(f))):
        rows.append({
            "family": family, "held_out": family in held_out_families, "candidates": candidate_counts[family],
            "samples": sample_counts[family], "rejected_held_out": rejected_held[family],
            "rejected_other": rejected_other[family],
            **{f"dropped_{rule}": dropped[family][rule] for rule in DECONTAMINATION_RULES},
            "kernelbench_l1_tasks": l1[family], "kernelbench_l2_tasks": l2[family],
            "samples_sharing_l1_l2_op_set": sharing[family],
            "shared_op_set_tasks": ", ".join(sorted(shared_tasks[family])),
        })
    return pl.DataFrame(rows, schema=FAMILY_REPORT)


__all__ = ["DECONTAMINATION_RULES", "FAMILY_REPORT", "family_report", "kernelbench_family_map"]
