"""The one place that assembles the Dagster Definitions: assets, checks, resources and jobs.

`dagster dev -w workspace.yaml` loads this module; keep heavy imports (torch) out of it and of the asset modules.
"""

from __future__ import annotations

import dagster as dg

from assets import cuke, filtering, ingestion, keys, synthesis, verification
from dice_pipeline.resources import (
    GpuPool,
    KernelGeneratorResource,
    KernelVerifier,
    WarehouseIOManager,
    WarehouseResource,
)

# Assets that depend on the threshold partition; rerunning at a new threshold materializes only these.
THRESHOLD_DEPENDENT_ASSETS = [
    keys.SPEEDUP_FILTERED_PAIRS,
    keys.SPEEDUP_FILTER_DECISIONS,
    keys.CUKE_SFT_SAMPLES,
    keys.CUKE_SFT_REJECTS,
    keys.CUKE_DECONTAMINATION_DROPS,
    keys.CUKE_INFILLING_TASKS,
    keys.CUKE_INFILLING_REJECTS,
    keys.CUKE_HF_DATASET,
]

ALL_ASSETS = [
    ingestion.concur_ingestion,
    verification.verified_pairs,
    filtering.speedup_filtering,
    synthesis.structure_instances,
    cuke.cuke_samples,
    cuke.cuke_infilling,
    cuke.cuke_hf_dataset,
    cuke.rl_end_to_end_tasks,
]

# Everything from ingestion to the curated dataset, for one threshold partition (the run's partition key).
main_job = dg.define_asset_job(
    "dice_main",
    selection=dg.AssetSelection.all(),
    description="Ingest, verify, filter at the run's threshold partition, and build the curated dataset.",
)


def build_resources() -> dict:
    return {
        "io_manager": WarehouseIOManager(),
        "warehouse": WarehouseResource(),
        "verifier": KernelVerifier(),
        "generator": KernelGeneratorResource(),
        # GPU leases for GPU work launched outside the verifier (training stages through dice_pipeline/pipes.py).
        "gpu_pool": GpuPool(),
    }


defs = dg.Definitions(assets=ALL_ASSETS, jobs=[main_job], resources=build_resources())
