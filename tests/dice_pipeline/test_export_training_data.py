"""`dice export-training-data`: one threshold's CuKe tables and the RL pool as JSONL a GPU host can read, with
KernelBench's tasks and a manifest."""

from __future__ import annotations

import json

import polars as pl

from dice_pipeline.cli import main
from training.stages import read_rows
from warehouse import Warehouse, table_for


def _frame(name: str, rows: list[dict]) -> pl.DataFrame:
    schema = table_for(name).schema
    return pl.DataFrame([{column: row.get(column) for column in schema.names()} for row in rows], schema=schema)


def test_export_writes_one_thresholds_tables_and_kernelbench(tmp_path, capsys):
    warehouse = Warehouse(tmp_path / "w.duckdb")
    for key, ids in (("2.0", ["a", "b"]), ("1.5", ["a", "b", "c"])):
        warehouse.write(table_for("cuke_sft_samples"), _frame("cuke_sft_samples", [
            {"cuke_threshold_key": key, "sample_id": i, "prompt_messages": "[]", "response": f"r{i}",
             "pytorch_code": f"code {i}"} for i in ids]), partition_key=key)
        warehouse.write(table_for("cuke_infilling_tasks"), _frame("cuke_infilling_tasks", [
            {"cuke_threshold_key": key, "task_id": i, "prefix": "p", "suffix": "s", "pytorch_code": f"code {i}"}
            for i in ids]), partition_key=key)
    warehouse.write(table_for("rl_end_to_end_tasks"), _frame("rl_end_to_end_tasks", [
        {"schedule_position": p, "task_id": f"t{p}", "difficulty": p, "pytorch_code": "x"} for p in range(3)]))
    kernelbench = tmp_path / "tasks.jsonl"
    pooling = ("import torch\nimport torch.nn.functional as F\nclass Model(torch.nn.Module):\n"
               "    def forward(self, x):\n        return F.max_pool2d(x, 2)\n"
               "def get_inputs():\n    return [torch.randn(1, 1, 4, 4)]\ndef get_init_inputs():\n    return []\n")
    kernelbench.write_text('{"level": 1, "name": "1_x", "code": "c"}\n'
                           + json.dumps({"level": 1, "problem_id": 2, "name": "2_pool", "code": pooling}) + "\n")

    out = tmp_path / "training_data"
    assert main(["export-training-data", str(out), "--threshold", "2.0", "--warehouse", str(tmp_path / "w.duckdb"),
                 "--kernelbench", str(kernelbench)]) == 0
    assert [r["sample_id"] for r in read_rows(out / "sft_samples.jsonl")] == ["a", "b"]
    assert read_rows(out / "infilling_tasks.jsonl")[0]["prefix"] == "p"
    assert [r["task_id"] for r in read_rows(out / "end_to_end_tasks.jsonl")] == ["t0", "t1", "t2"]
    assert read_rows(out / "kernelbench_tasks.jsonl")[0] == {"level": 1, "name": "1_x", "code": "c"}
    families = json.loads((out / "kernelbench_families.json").read_text())
    assert families["family_of"] == {"L1/2_pool": "pooling"} and "pooling" in families["held_out_families"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows"]["sft_samples.jsonl"] == 2 and manifest["threshold"] == "2.0"
    assert "sft_samples.jsonl: 2 rows" in capsys.readouterr().out


def test_export_without_a_warehouse_says_so(tmp_path, capsys):
    assert main(["export-training-data", str(tmp_path / "o"), "--warehouse", str(tmp_path / "none.duckdb")]) == 1
    assert "run `dice run` first" in capsys.readouterr().err
