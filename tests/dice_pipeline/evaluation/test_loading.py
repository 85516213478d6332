"""KernelBench tasks from each source: the Hugging Face layout (hub parquet folder, `save_to_disk`), jsonl and a
checkout's levelN/ folders; known-broken tasks flagged, not dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dice_pipeline.kernelbench import KNOWN_TASK_ISSUES, load_kernelbench_tasks

REAL = Path("/work/shared/data/kernelbench/tasks.jsonl")
CODE = "import torch\nclass Model:\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"
ROWS = [{"level": 1, "problem_id": 23, "name": "23_Softmax", "code": CODE},
        {"level": 1, "problem_id": 1, "name": "1_Matmul", "code": CODE},
        {"level": 2, "problem_id": 83, "name": "83_Conv3d_GroupNorm_Min_Clamp_Dropout", "code": CODE},
        {"level": 4, "problem_id": 1, "name": "1_gpt2", "code": CODE}]


def _by_level(rows):
    levels = {}
    for row in rows:
        levels.setdefault(row["level"], []).append(row)
    return levels


def test_hub_layout_parquet_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "data").mkdir()
    for level, rows in _by_level(ROWS).items():  # the hub's file names: data/level_N-00000-of-00001.parquet
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "data" / f"level_{level}-00000-of-00001.parquet"))
    task_set = load_kernelbench_tasks(f"hf:{tmp_path}", levels=[1, 2])
    assert [t.key for t in task_set.tasks] == ["L1/1_Matmul", "L1/23_Softmax", "L2/83_Conv3d_GroupNorm_Min_Clamp_Dropout"]
    assert task_set.skipped == []  # level 4's split is not read when levels 1-2 are asked for
    everything = load_kernelbench_tasks(f"hf:{tmp_path}")
    assert [s.reason_code for s in everything.skipped] == ["level4_needs_hub_weights"]
    assert everything.skipped[0].origin.startswith(f"hf:{tmp_path}[level_4]")


def test_dataset_saved_by_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    splits = {f"level_{level}": datasets.Dataset.from_list(rows) for level, rows in _by_level(ROWS).items()}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "kb"))
    task_set = load_kernelbench_tasks(f"hf:{tmp_path / 'kb'}", levels=[2])
    assert [t.key for t in task_set.tasks] == ["L2/83_Conv3d_GroupNorm_Min_Clamp_Dropout"]
    assert task_set.tasks[0].known_issues == ["live_dropout", "output_identically_zero"]


def test_malformed_hf_row_is_reported(tmp_path):
    datasets = pytest.importorskip("datasets")
    splits = {"level_1": datasets.Dataset.from_list([{"level": 1, "problem_id": 2, "name": "2_x", "code": None}])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "kb"))
    task_set = load_kernelbench_tasks(f"hf:{tmp_path / 'kb'}")
    assert task_set.tasks == [] and [s.reason_code for s in task_set.skipped] == ["malformed_row"]


def test_jsonl_and_checkout_give_the_same_tasks(tmp_path):
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    for row in ROWS[:3]:
        folder = tmp_path / "KernelBench" / f"level{row['level']}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{row['name']}.py").write_text(row["code"])
    from_jsonl = load_kernelbench_tasks(tmp_path / "tasks.jsonl", levels=[1])
    from_checkout = load_kernelbench_tasks(tmp_path / "KernelBench", levels=[1])
    assert from_jsonl.tasks == from_checkout.tasks and len(from_jsonl.tasks) == 2
    assert from_jsonl.tasks[1].known_issues == ["zeros_pass_at_1e2"]


@pytest.mark.skipif(not REAL.is_file(), reason=f"{REAL} absent")
def test_known_issues_name_the_real_tasks():
    tasks = {(t.level, t.problem_id): t for t in load_kernelbench_tasks(REAL).tasks}
    expected_words = {(1, 23): "Softmax", (1, 37): "Frobenius", (1, 39): "L2Norm", (1, 53): "Min",
                      (1, 95): "CrossEntropy", (2, 66): "Dropout", (2, 83): "Dropout", (3, 35): "LSTM"}
    assert set(KNOWN_TASK_ISSUES) == set(expected_words)
    for key, word in expected_words.items():
        assert word in tasks[key].name and tasks[key].known_issues
