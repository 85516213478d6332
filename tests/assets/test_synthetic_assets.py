"""The synthetic operator assets and distillation in the graph, on a CPU: candidates -> pairs (every training row
sent to the verifier, held-out rows accounted for), and `distilled_pairs` with a local checkpoint as the generator
backend (a tiny random model saved here), writing its ConCuR-format file and a row per candidate."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from assets import keys
from dice_pipeline import definitions
from dice_pipeline.prompts import kernel_generation_messages
from dice_pipeline.resources import KernelGeneratorResource
from dice_pipeline.synthesis.operators import FAMILIES, build_instance
from training.tokenizer import train_bpe_tokenizer
from warehouse import Warehouse, table_for

SMALL = {"synthetic_operator_candidates": {"config": {"scale": 0.01}}}


def _tiny_checkpoint(path, reference: str) -> str:
    corpus = [reference, "class ModelNew(nn.Module):\n    pass\n", "```python\nimport torch\n```"] * 10
    corpus += [m["content"] for m in kernel_generation_messages(reference)]
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_synthetic_pairs_account_for_every_candidate_on_a_cpu(tmp_path, cpu_resources):
    warehouse_file = str(tmp_path / "w.duckdb")
    result = dg.materialize(definitions.ALL_ASSETS,
                            selection=[keys.SYNTHETIC_OPERATOR_CANDIDATES, keys.SYNTHETIC_OPERATOR_PAIRS],
                            instance=dg.DagsterInstance.ephemeral(), resources=cpu_resources(warehouse_file),
                            run_config={"ops": SMALL})
    assert result.success
    pairs = Warehouse(warehouse_file).read(table_for("synthetic_operator_pairs"))
    assert pairs.height == sum(max(1, round(f.instances * 0.01)) for f in FAMILIES.values())
    train = pairs.filter(pl.col("split") == "train")
    assert set(train["verification"]) == {"judged"} and set(train["status"]) == {"not_executed"}
    held = pairs.filter(pl.col("split") == "held_out")
    assert set(held["family"]) == {"cumulative", "loss", "pooling"} and held["status"].null_count() == held.height
    [check] = result.get_asset_check_evaluations()
    assert check.passed


def test_distillation_with_a_local_checkpoint_writes_a_row_per_candidate(tmp_path, cpu_resources):
    references = [build_instance("activation", 0, i).reference_code for i in range(2)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "pytorch_code": code}) + "\n"
                             for i, code in enumerate(references)))
    checkpoint = _tiny_checkpoint(tmp_path / "tiny", references[0])
    out = tmp_path / "distilled.jsonl"
    warehouse_file = str(tmp_path / "w.duckdb")
    resources = cpu_resources(warehouse_file, generator=KernelGeneratorResource(
        backend="checkpoint", checkpoint_path=checkpoint, max_tokens=16, temperature=1.0))
    run_config = {"ops": {**SMALL, "distilled_pairs": {"config": {"tasks": str(tasks), "n_per_task": 2,
                                                                  "output": str(out), "only_correct": False}}}}
    result = dg.materialize(definitions.ALL_ASSETS,
                            selection=[keys.SYNTHETIC_OPERATOR_CANDIDATES, keys.DISTILLED_PAIRS],
                            instance=dg.DagsterInstance.ephemeral(), resources=resources, run_config=run_config)
    assert result.success
    rows = Warehouse(warehouse_file).read(table_for("distilled_pairs"))
    assert rows.height == 4 and set(rows["task_id"]) == {"t0", "t1"}
    assert set(rows["generator_backend"]) == {"transformers"}
    # a random 16-token answer holds no kernel: every candidate is a row with the reason it was not kept
    assert rows["kept"].sum() == 0 and rows["reject_reason"].null_count() == 0
    [materialization] = [e for e in result.get_asset_materialization_events()
                         if e.asset_key == keys.DISTILLED_PAIRS]
    metadata = materialization.materialization.metadata
    assert metadata["yield"].value["candidates"] == 4 and metadata["yield"].value["correct"] == 0
    assert out.exists() and metadata["concur_file"].value == str(out)
