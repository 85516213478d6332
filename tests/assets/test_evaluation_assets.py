"""The KernelBench evaluation chain on CPU through the assets: a tiny SDAR checkpoint saved to disk, three tasks,
tasks -> baselines -> evaluation (generation, verdicts, sanity rows, metrics) -> comparison report. No GPU here:
execution is not run, which the rows and metadata state (baselines not_executed, verdicts static-only)."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from assets import evaluation, keys
from dice_pipeline.evaluation.registry import EvalModel, register
from dice_pipeline.resources import KernelVerifier, WarehouseIOManager, WarehouseResource
from warehouse import Warehouse, table_for

TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n\n    def forward(self, x):\n        return {op}\n\nbatch_size = 4\ndim = 16\n\n"
        "def get_inputs():\n    return [torch.rand(batch_size, dim)]\n\ndef get_init_inputs():\n    return []\n")
TASKS = [(1, "1_Double", "x * 2"), (19, "19_ReLU", "torch.relu(x)"), (23, "23_Softmax", "torch.softmax(x, dim=1)")]


@pytest.fixture()
def tiny_checkpoint(tmp_path):
    import torch

    from training import SDARForCausalLM, preset_config
    from training.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer([TASK.format(op=op) for _, _, op in TASKS] * 4, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    model = SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id))
    path = tmp_path / "tiny_sdar"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_evaluation_chain_on_cpu_through_the_assets(tmp_path, tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: the CPU path whatever the host
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps({"level": 1, "problem_id": i, "name": n, "code": TASK.format(op=op)}) + "\n"
                                  for i, n, op in TASKS))
    registry = tmp_path / "registry.json"
    register(EvalModel("tiny", path=str(tiny_checkpoint)), registry)
    db = str(tmp_path / "w.duckdb")
    resources = {"io_manager": WarehouseIOManager(path=db), "warehouse": WarehouseResource(path=db),
                 "verifier": KernelVerifier(execute="never")}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(keys.EVAL_CHECKPOINT_PARTITIONS.name, ["tiny"])
    every = [evaluation.kernelbench_tasks, evaluation.kernelbench_baselines, evaluation.kernelbench_evaluation,
             evaluation.kernelbench_comparison_report]
    run_config = {"ops": {"kernelbench_tasks": {"config": {"source": str(tasks_file)}}}}
    level = dg.materialize(every, selection=[keys.KERNELBENCH_TASKS, keys.KERNELBENCH_BASELINES], partition_key="1",
                           instance=instance, resources=resources, run_config=run_config)
    assert level.success
    eval_config = {"ops": {"kernelbench_evaluation": {"config": {"registry_path": str(registry),
                                                                  "max_new_tokens": 8, "batch_size": 2}}}}
    partition = dg.MultiPartitionKey({"checkpoint": "tiny", "level": "1"})
    result = dg.materialize(every, selection=[keys.KERNELBENCH_EVAL_RESULTS, keys.KERNELBENCH_EVAL_SANITY,
                                              keys.KERNELBENCH_EVAL_METRICS],
                            partition_key=partition, instance=instance, resources=resources, run_config=eval_config)
    assert result.success
    report = dg.materialize(every, selection=[keys.KERNELBENCH_COMPARISON_REPORT], instance=instance,
                            resources=resources)
    assert report.success

    wh = Warehouse(db)
    baselines = wh.read(table_for("kernelbench_baselines"))
    assert baselines.height == 3 and set(baselines["status"]) == {"not_executed"}
    results = wh.read(table_for("kernelbench_eval_results"))
    assert results.height == 3 and set(results["eval_partition_key"]) == {str(partition)}
    assert not results["executed"].any() and results["generator_backend"].to_list() == ["block_diffusion"] * 3
    assert json.loads(results["generation_settings_json"][0])["steps"] == 4
    assert set(results["status"]) <= {"compile_error", "not_executed", "deceptive"}
    assert results.filter(results["task_key"] == "L1/23_Softmax")["known_issues"].to_list() == [["zeros_pass_at_1e2"]]
    sanity = {(r["check"], r["subject"]): r for r in wh.read(table_for("kernelbench_eval_sanity")).to_dicts()}
    assert sanity[("reference_as_modelnew", "L1/1_Double")]["status"] == "deceptive"
    assert {sanity[("zeros_kernel", k)]["status"] for k in ("L1/19_ReLU", "L1/23_Softmax")} == {"not_executed"}
    known_good = [r for (check, _), r in sanity.items() if check == "known_good"]
    assert len(known_good) == 2 and all(r["status"] == "not_executed" and r["asserted"] == "static" for r in known_good)
    assert all(r["passed"] for r in sanity.values())
    metrics = wh.read(table_for("kernelbench_eval_metrics"))
    assert metrics["tolerance"].to_list() == ["1e-2", "1e-4"] and set(metrics["n_tasks"]) == {3}
    assert not metrics["executed"].any() and set(metrics["exec_rate"]) == {0.0}
    drilldown = wh.query("SELECT task_key, known_issues, baseline_status FROM lineage.kernelbench_task_drilldown")
    assert drilldown.height == 3 and set(drilldown["baseline_status"]) == {"not_executed"}
    text = (tmp_path / "artifacts" / "kernelbench" / "comparison.md").read_text()
    assert "| tiny | measured here | 0 / 0 / 0 * |" in text and "DICE-8B" in text
