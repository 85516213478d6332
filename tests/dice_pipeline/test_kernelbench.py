"""Loading KernelBench tasks (jsonl and levelN/ folders) and its metrics: Exec and fast_p per level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dice_pipeline.kernelbench import (
    KernelBenchTask,
    format_scores,
    load_kernelbench_tasks,
    score_kernelbench,
)
from dice_pipeline.verify.verdict import Status, Verdict

TASKS = Path("/work/shared/data/kernelbench/tasks.jsonl")
LEVEL4 = Path("/work/shared/data/kernelbench/tasks_level4.jsonl")
TASK_CODE = (
    "import torch\nclass Model:\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
)


@pytest.mark.skipif(not TASKS.is_file(), reason=f"{TASKS} absent")
def test_real_task_file_loads_250_tasks_in_level_order():
    task_set = load_kernelbench_tasks(TASKS)
    assert task_set.levels() == {1: 100, 2: 100, 3: 50} and task_set.skipped == []
    assert task_set.tasks[0].key == "L1/1_Square_matrix_multiplication_"
    assert [t.level for t in task_set.tasks] == sorted(t.level for t in task_set.tasks)


@pytest.mark.skipif(not LEVEL4.is_file(), reason=f"{LEVEL4} absent")
def test_level4_is_skipped_with_a_reason():
    task_set = load_kernelbench_tasks(LEVEL4)
    assert task_set.tasks == [] and len(task_set.skipped) == 20
    assert {s.reason_code for s in task_set.skipped} == {"level4_needs_hub_weights"}


def test_directory_layout_and_bad_rows_are_reported(tmp_path):
    for level, name in [(1, "2_B"), (1, "10_C"), (2, "1_A"), (4, "1_Hub")]:
        folder = tmp_path / f"level{level}"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(TASK_CODE)
    (tmp_path / "level1" / "helper.py").write_text("x = 1\n")
    (tmp_path / "level2" / "3_NoModel.py").write_text("def get_inputs():\n    return []\n")
    task_set = load_kernelbench_tasks(tmp_path)
    assert [t.key for t in task_set.tasks] == ["L1/2_B", "L1/10_C", "L2/1_A"]
    reasons = sorted(s.reason_code for s in task_set.skipped)
    assert reasons == ["level4_needs_hub_weights", "no_model_class", "unrecognised_file_name"]


def test_jsonl_malformed_and_duplicate_rows_are_skipped_with_reasons(tmp_path):
    path = tmp_path / "tasks.jsonl"
    good = {"level": 1, "problem_id": 1, "name": "1_A", "code": TASK_CODE}
    path.write_text("\n".join([json.dumps(good), json.dumps(good), '{"level": 1}', "not json"]) + "\n")
    task_set = load_kernelbench_tasks(path)
    assert len(task_set.tasks) == 1
    assert [s.reason_code for s in task_set.skipped] == ["duplicate_task", "malformed_row", "malformed_row"]


def verdict(status: Status, speedup: float | None = None) -> Verdict:
    return Verdict(status=status, speedup=speedup)


def test_fast_p_counts_correct_tasks_strictly_faster_than_p():
    results = [
        (1, "a", verdict(Status.CORRECT, 1.0)),  # exactly 1.0: not > 1
        (1, "b", verdict(Status.CORRECT, 2.5)),
        (1, "c", verdict(Status.INCORRECT, 3.0)),  # fast but wrong: never counts
        (1, "d", verdict(Status.CORRECT, 0.6)),
        (2, "e", verdict(Status.NOT_EXECUTED)),
        (2, "f", verdict(Status.CORRECT, 1.2)),
    ]
    level1, level2, pooled = score_kernelbench(results)
    assert (level1.n_tasks, level1.n_correct, level1.exec_rate) == (4, 3, 0.75)
    assert level1.fast_p == {0.0: 0.75, 0.5: 0.75, 0.8: 0.5, 1.0: 0.25, 1.5: 0.25, 2.0: 0.25}
    assert (level2.exec_rate, level2.fast_p[1.0], level2.n_not_executed) == (0.5, 0.5, 1)
    assert pooled.level is None and pooled.n_tasks == 6 and pooled.fast_p[1.0] == pytest.approx(2 / 6)
    assert "| 1 | 4 | 75.0 |" in format_scores([level1, level2, pooled])


def test_missing_tasks_count_as_failures_when_the_task_list_is_given():
    tasks = [KernelBenchTask(1, i, f"{i}_T", TASK_CODE) for i in (1, 2, 3, 4)]
    (level1, _) = score_kernelbench([(1, tasks[0], verdict(Status.CORRECT, 3.0))], tasks=tasks)
    assert (level1.n_tasks, level1.n_missing, level1.exec_rate, level1.fast_p[2.0]) == (4, 3, 0.25, 0.25)


def test_two_verdicts_for_one_task_is_an_error():
    with pytest.raises(ValueError, match="more than one verdict"):
        score_kernelbench([(1, "a", verdict(Status.CORRECT, 2.0)), (1, "a", verdict(Status.CORRECT, 2.0))])
