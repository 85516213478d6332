"""Difficulty score and labels on real KernelBench tasks, easy->hard ordering, and loading external RL task pools."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from dice_pipeline.cuke.difficulty import easy_to_hard, load_rl_task_file, score_difficulty
from dice_pipeline.kernelbench import load_kernelbench_tasks

TASKS = Path("/work/shared/data/kernelbench/tasks.jsonl")
DICE_POOL = Path("/work/shared/data/dice_rl/end_to_end_tasks.json")
TASK = (
    "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x)\n"
    "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
)


@pytest.mark.skipif(not TASKS.is_file(), reason=f"{TASKS} absent")
def test_labels_rise_with_kernelbench_level_without_being_told_the_level():
    tasks = load_kernelbench_tasks(TASKS).tasks
    mean_label = {
        level: sum(score_difficulty(t.code).label for t in tasks if t.level == level)
        / sum(t.level == level for t in tasks)
        for level in (1, 2, 3)
    }
    assert mean_label[1] < mean_label[2] < mean_label[3]
    level1_easy = sum(score_difficulty(t.code).label <= 1 for t in tasks if t.level == 1)
    assert level1_easy >= 90  # single operators are labels 0-1
    by_name = {t.name: t for t in tasks}
    assert score_difficulty(by_name["19_ReLU"].code).label == 0
    assert score_difficulty(by_name["19_ReLU"].code, level=3).label > 0  # a known level raises the score


def test_unparseable_reference_is_hardest():
    assert score_difficulty("def broken(:").label == 3


def test_easy_to_hard_is_stable_within_a_label():
    rows = [
        {"id": "a", "difficulty": 2},
        {"id": "b", "difficulty": 1},
        {"id": "c", "difficulty": 2},
        {"id": "d", "difficulty": 1},
    ]
    assert [r["id"] for r in easy_to_hard(rows, score_column=None)] == ["b", "d", "a", "c"]
    frame = pl.DataFrame(rows).with_columns(pl.Series("difficulty_score", [5.0, 3.0, 4.0, 3.0]))
    assert easy_to_hard(frame)["id"].to_list() == ["b", "d", "c", "a"]


def test_rl_task_file_keeps_labels_and_rejects_bad_rows(tmp_path):
    records = [
        {"idx": 0, "level": "1", "pytorch_code": TASK, "cuda_code": "", "raw_answer": "\\boxed{1}"},
        {"idx": 1, "level": 2, "pytorch_code": TASK},
        {"idx": 1, "level": "2", "pytorch_code": TASK},
        {"idx": 2, "level": "7", "pytorch_code": TASK},
        {"idx": 3, "level": "1", "pytorch_code": "x = 1\n"},
        {"idx": 4, "level": "1"},
        "not an object",
    ]
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(records))
    tasks, rejects = load_rl_task_file(path)
    assert tasks["task_id"].to_list() == ["0", "1"] and tasks["difficulty"].to_list() == [1, 2]
    assert json.loads(tasks["extra_json"][0]) == {"cuda_code": "", "raw_answer": "\\boxed{1}"}
    assert rejects["reason_code"].to_list() == [
        "duplicate_idx",
        "bad_difficulty_label",
        "no_model_class",
        "missing_field",
        "not_an_object",
    ]
    assert tasks.height + rejects.height == len(records)


@pytest.mark.skipif(not DICE_POOL.is_file(), reason=f"{DICE_POOL} absent")
def test_dice_pool_loads_whole_in_file_order():
    tasks, rejects = load_rl_task_file(DICE_POOL, compute_difficulty=False)
    assert (tasks.height, rejects.height) == (4000, 0)
    assert tasks["difficulty"].to_list() == sorted(tasks["difficulty"].to_list())  # the file is sorted easy->hard
    assert easy_to_hard(tasks)["file_position"].to_list() == list(range(4000))
