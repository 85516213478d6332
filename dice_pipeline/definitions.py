"""The one place that assembles the Dagster Definitions: assets, checks, resources and jobs.

`dagster dev -w workspace.yaml` loads this module; keep heavy imports (torch) out of it and of the asset modules.
"""

from __future__ import annotations

import dagster as dg

from assets import cuke, evaluation, filtering, ingestion, keys, sensors, synthesis, training, verification
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
    synthesis.synthetic_operator_candidates,
    synthesis.synthetic_operator_pairs,
    synthesis.distilled_pairs,
    cuke.cuke_samples,
    cuke.cuke_infilling,
    cuke.cuke_hf_dataset,
    cuke.rl_end_to_end_tasks,
    training.converted_base_checkpoint,
    training.sft_checkpoint,
    training.rl_infilling_checkpoint,
    training.rl_end_to_end_checkpoint,
    evaluation.kernelbench_tasks,
    evaluation.kernelbench_baselines,
    evaluation.kernelbench_evaluation,
    evaluation.kernelbench_comparison_report,
]

EVALUATION_ASSETS = [
    keys.KERNELBENCH_TASKS,
    keys.KERNELBENCH_BASELINES,
    keys.KERNELBENCH_EVAL_RESULTS,
    keys.KERNELBENCH_EVAL_SANITY,
    keys.KERNELBENCH_EVAL_METRICS,
    keys.KERNELBENCH_COMPARISON_REPORT,
]

# Everything from ingestion to the curated dataset, for one threshold partition (the run's partition key).
# Training is its own job: hours on a GPU, not part of building the data.
main_job = dg.define_asset_job(
    "dice_main",
    selection=(dg.AssetSelection.all() - dg.AssetSelection.assets(*EVALUATION_ASSETS, keys.DISTILLED_PAIRS)
               - dg.AssetSelection.groups(keys.GROUP_TRAINING)),
    description="Ingest, verify, filter at the run's threshold partition, and build the curated dataset.",
)

# KernelBench evaluation: the level's tasks and local baselines (partition "1", "2" or "3"), then one model on one
# level (partition checkpoint|level; `dice eval run NAME --level N` launches it).
kernelbench_level_job = dg.define_asset_job(
    "kernelbench_level",
    selection=dg.AssetSelection.assets(keys.KERNELBENCH_TASKS, keys.KERNELBENCH_BASELINES),
    description="Load a KernelBench level and measure its eager and torch.compile baselines on this host.",
)
kernelbench_eval_job = dg.define_asset_job(
    "kernelbench_eval",
    selection=dg.AssetSelection.assets(keys.KERNELBENCH_EVAL_RESULTS, keys.KERNELBENCH_EVAL_SANITY,
                                       keys.KERNELBENCH_EVAL_METRICS),
    description="Generate, judge and score one registered model on one KernelBench level.",
)
kernelbench_report_job = dg.define_asset_job(
    "kernelbench_report", selection=dg.AssetSelection.assets(keys.KERNELBENCH_COMPARISON_REPORT),
    description="The comparison report across every evaluated model, beside the paper's numbers.",
)


# Distillation needs a generator backend (an endpoint or a checkpoint): its own job, not part of the data build.
distill_job = dg.define_asset_job(
    "dice_distill",
    selection=dg.AssetSelection.assets(keys.DISTILLED_PAIRS),
    description="Sample, verify and write ConCuR-format rows from the configured generator backend.",
)


# SFT -> RL stage 1 -> RL stage 2 on one threshold partition's CuKe (each stage can also be run alone).
training_job = dg.define_asset_job(
    "dice_training",
    selection=dg.AssetSelection.groups(keys.GROUP_TRAINING),
    description="Block-diffusion SFT, BiC-RL kernel infilling and BiC-RL end-to-end on the partition's CuKe.",
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


defs = dg.Definitions(
    assets=ALL_ASSETS,
    jobs=[main_job, distill_job, training_job, kernelbench_level_job, kernelbench_eval_job, kernelbench_report_job],
    resources=build_resources(),
    sensors=sensors.SENSORS,
)
