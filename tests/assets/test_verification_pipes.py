"""`verified_pairs` launched through Dagster Pipes (KernelVerifier.launch="pipes"): the batch runs in an external
process started by `dg.PipesSubprocessClient`, its per-verdict log lines and batch metadata reach the asset, and
the table holds the same verdicts as the in-process launch."""

import json

import dagster as dg

from assets import keys
from dice_pipeline import definitions
from dice_pipeline.resources import (GpuPool, KernelGeneratorResource, KernelVerifier, WarehouseIOManager,
                                     WarehouseResource)
from warehouse import Warehouse, table_for

UPSTREAM = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]


def _verify(tmp_path, name, rows, launch):
    instance = dg.DagsterInstance.ephemeral()
    warehouse_file = str(tmp_path / f"{name}.duckdb")
    source = tmp_path / f"{name}.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    resources = {
        "io_manager": WarehouseIOManager(path=warehouse_file),
        "warehouse": WarehouseResource(path=warehouse_file),
        # Static checks only (no GPU in CI; builds are the verifier's own tests).
        "verifier": KernelVerifier(execute="never", launch=launch,
                                   overrides={"verdict_store_dir": str(tmp_path / f"{name}_store")}),
        "generator": KernelGeneratorResource(),
        "gpu_pool": GpuPool(),  # the training assets need it; none of them runs here
    }
    result = dg.materialize(definitions.ALL_ASSETS, selection=UPSTREAM, instance=instance, resources=resources,
                            run_config={"ops": {"concur_ingestion": {"config": {"source": str(source)}}}})
    table = Warehouse(warehouse_file).read(table_for("verified_pairs")).sort("uuid")
    return instance, result, table


def test_verified_pairs_through_pipes_reports_logs_and_metadata_and_matches_in_process(tmp_path, pair_factory):
    rows = [pair_factory(i) for i in range(3)]
    rows[1]["generated_code"] = rows[1]["generated_code"].replace(
        "return relu_scale.relu_scale(x)", "return torch.relu(x) * 2.0")  # a PyTorch-only forward: deceptive

    instance, result, through_pipes = _verify(tmp_path, "pipes", rows, "pipes")
    assert result.success
    [materialization] = result.asset_materializations_for_node("verified_pairs")
    metadata = materialization.metadata
    assert metadata["verification/jobs"].value == 3
    assert metadata["verification/backend"].value == "local"
    assert metadata["verification/by_status"].value == {"deceptive": 1, "not_executed": 2}
    assert metadata["dagster/row_count"].value == 3  # the asset's own metadata is still there
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(m.startswith("verifying 3 jobs on") for m in messages)  # from the external process
    for uuid in ("pair-0", "pair-1", "pair-2"):
        assert any(m.startswith(f"{uuid}: ") for m in messages)

    _, _, in_process = _verify(tmp_path, "local", rows, "in_process")
    assert through_pipes["status"].to_list() == in_process["status"].to_list() == [
        "not_executed", "deceptive", "not_executed"]
    assert through_pipes["reason_codes"].to_list() == in_process["reason_codes"].to_list()
