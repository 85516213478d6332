"""The training stages as assets, on the embedded seed corpus with the tiny preset: SFT -> RL stage 1 -> RL stage 2
materialize in order (each from the previous checkpoint, with metadata a person can read), and a new CuKe makes all
three stale."""

import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from assets import keys
from dice_pipeline import definitions

DATA = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS, keys.SPEEDUP_FILTERED_PAIRS,
        keys.SPEEDUP_FILTER_DECISIONS, keys.STRUCTURE_INSTANCES, keys.CUKE_SFT_SAMPLES, keys.CUKE_SFT_REJECTS,
        keys.CUKE_DECONTAMINATION_DROPS, keys.CUKE_INFILLING_TASKS, keys.CUKE_INFILLING_REJECTS,
        keys.RL_END_TO_END_TASKS]
TRAINING = [keys.SFT_CHECKPOINT, keys.RL_INFILLING_CHECKPOINT, keys.RL_END_TO_END_CHECKPOINT]
TINY = {"config": {"tiny": True}}


@pytest.fixture
def env(tmp_path, monkeypatch, cpu_resources):
    monkeypatch.setenv("DICE_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_EVAL_CHECKPOINTS", str(tmp_path / "eval_checkpoints.json"))
    monkeypatch.delenv("DICE_CONCUR_SOURCE", raising=False)
    monkeypatch.delenv("DICE_RL_TASK_FILE", raising=False)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["2.0"])
    warehouse_file = str(tmp_path / "w.duckdb")
    resources = cpu_resources(warehouse_file)
    return instance, resources


def _materialize(instance, resources, selection, source=None):
    ops = {"cuke_samples": {"config": {"decontaminate": False}}, "sft_checkpoint": TINY,
           "rl_infilling_checkpoint": TINY, "rl_end_to_end_checkpoint": TINY}
    if source:
        # A switch of source is refused unless asked for (issue 17): this test asks for it.
        ops["concur_ingestion"] = {"config": {"source": source, "allow_source_change": True}}
    ops = {name: value for name, value in ops.items() if _op_selected(name, set(selection))}
    return dg.materialize(definitions.ALL_ASSETS, selection=selection, instance=instance, resources=resources,
                          partition_key="2.0", run_config={"ops": ops})


def _op_selected(op_name: str, selected: set) -> bool:
    outputs = {"cuke_samples": keys.CUKE_SFT_SAMPLES, "concur_ingestion": keys.CONCUR_PAIRS,
               "sft_checkpoint": keys.SFT_CHECKPOINT, "rl_infilling_checkpoint": keys.RL_INFILLING_CHECKPOINT,
               "rl_end_to_end_checkpoint": keys.RL_END_TO_END_CHECKPOINT}
    return outputs[op_name] in selected


def _metadata(instance, key):
    return instance.get_latest_materialization_event(key).asset_materialization.metadata


def test_three_stages_materialize_in_order_and_a_new_cuke_makes_all_three_stale(env, tmp_path, pair_factory):
    instance, resources = env
    assert _materialize(instance, resources, DATA).success  # the embedded seed corpus
    result = _materialize(instance, resources, TRAINING)
    assert result.success

    sft, stage1, stage2 = (_metadata(instance, key) for key in TRAINING)
    for metadata in (sft, stage1, stage2):
        assert Path(metadata["path"].value).is_dir() and metadata["step"].value > 0
        assert str(tmp_path / "artifacts" / "checkpoints" / "2.0") in metadata["path"].value
        assert metadata["curves"].value.startswith("![") and metadata["wall_time_s"].value > 0
    assert sft["samples"].value >= 4 and sft["tokens_seen"].value > 0
    assert sft["stopped_by"].value in ("completed", "max_steps") and sft["step"].value == sft["last_step"].value["step"]
    # Each RL stage starts from the checkpoint its upstream reported.
    assert stage1["base"].value == sft["path"].value and stage2["base"].value == stage1["path"].value
    assert stage1["config"].value["stage"] == "infilling" and stage2["config"].value["stage"] == "end_to_end"
    assert "static checks only" in stage2["reward"].value  # no GPU here: said so, not faked
    assert (Path(stage2["path"].value) / "model.safetensors").is_file()
    # Each checkpoint is registered for KernelBench evaluation under its stage and threshold.
    from dice_pipeline.evaluation.registry import EVAL_CHECKPOINT_PARTITIONS_NAME, load_registry

    registered = load_registry()
    for stage, metadata in (("sft", sft), ("rl_infilling", stage1), ("rl_end_to_end", stage2)):
        name = metadata["eval_checkpoint"].value
        assert name == f"{stage}-t2.0" and registered[name].path == metadata["path"].value
    assert {"sft-t2.0", "rl_end_to_end-t2.0"} <= set(instance.get_dynamic_partitions(EVAL_CHECKPOINT_PARTITIONS_NAME))
    # Step logs reached the run log as training progressed.
    messages = [record.user_message for record in instance.all_logs(result.run_id)]
    assert any(f"sft step {sft['step'].value}:" in (m or "") for m in messages)
    assert any("rl_end_to_end step 2:" in (m or "") for m in messages)

    resolver = get_stale_status_resolver(instance, definitions.ALL_ASSETS)
    assert [resolver.get_status(key, "2.0") for key in TRAINING] == [StaleStatus.FRESH] * 3
    # A new CuKe (a different ingested corpus, so a different filtered set at 2.0): all three checkpoints are stale.
    source = tmp_path / "other.jsonl"
    source.write_text("".join(json.dumps(pair_factory(i, speedup=3.0)) + "\n" for i in range(3)))
    assert _materialize(instance, resources, DATA, source=str(source)).success
    resolver = get_stale_status_resolver(instance, definitions.ALL_ASSETS)
    assert [resolver.get_status(key, "2.0") for key in TRAINING] == [StaleStatus.STALE] * 3
