"""Asset keys and partition definitions: part of the public API (tests snapshot them; renames break users)."""

import dagster as dg

from dice_pipeline.evaluation.registry import EVAL_CHECKPOINT_PARTITIONS_NAME

CONCUR_PAIRS = dg.AssetKey("concur_pairs")
CONCUR_REJECTS = dg.AssetKey("concur_rejects")
VERIFIED_PAIRS = dg.AssetKey("verified_pairs")
SPEEDUP_FILTERED_PAIRS = dg.AssetKey("speedup_filtered_pairs")
SPEEDUP_FILTER_DECISIONS = dg.AssetKey("speedup_filter_decisions")
STRUCTURE_INSTANCES = dg.AssetKey("structure_instances")
SYNTHETIC_OPERATOR_CANDIDATES = dg.AssetKey("synthetic_operator_candidates")
SYNTHETIC_OPERATOR_PAIRS = dg.AssetKey("synthetic_operator_pairs")
DISTILLED_PAIRS = dg.AssetKey("distilled_pairs")
CUKE_SFT_SAMPLES = dg.AssetKey("cuke_sft_samples")
CUKE_SFT_REJECTS = dg.AssetKey("cuke_sft_rejects")
CUKE_DECONTAMINATION_DROPS = dg.AssetKey("cuke_decontamination_drops")
CUKE_INFILLING_TASKS = dg.AssetKey("cuke_infilling_tasks")
CUKE_INFILLING_REJECTS = dg.AssetKey("cuke_infilling_rejects")
CUKE_HF_DATASET = dg.AssetKey("cuke_hf_dataset")
RL_END_TO_END_TASKS = dg.AssetKey("rl_end_to_end_tasks")
KERNELBENCH_TASKS = dg.AssetKey("kernelbench_tasks")
KERNELBENCH_BASELINES = dg.AssetKey("kernelbench_baselines")
KERNELBENCH_EVAL_RESULTS = dg.AssetKey("kernelbench_eval_results")
KERNELBENCH_EVAL_SANITY = dg.AssetKey("kernelbench_eval_sanity")
KERNELBENCH_EVAL_METRICS = dg.AssetKey("kernelbench_eval_metrics")
KERNELBENCH_COMPARISON_REPORT = dg.AssetKey("kernelbench_comparison_report")
CONVERTED_BASE_CHECKPOINT = dg.AssetKey("converted_base_checkpoint")
SFT_CHECKPOINT = dg.AssetKey("sft_checkpoint")
RL_INFILLING_CHECKPOINT = dg.AssetKey("rl_infilling_checkpoint")
RL_END_TO_END_CHECKPOINT = dg.AssetKey("rl_end_to_end_checkpoint")

# One partition per speedup threshold, keyed canonically ("2.0"): every threshold's table lives side by side.
THRESHOLD_PARTITIONS = dg.DynamicPartitionsDefinition(name="speedup_threshold")

GROUP_INGEST = "ingest"
GROUP_VERIFY = "verify"
GROUP_FILTER = "filter"
GROUP_SYNTHESIS = "synthesis"
GROUP_CUKE = "cuke"
GROUP_RL_DATA = "rl_data"
GROUP_EVALUATION = "evaluation"

# KernelBench evaluation: one partition per level (1-3; level 4 needs hub weights), and per model to evaluate
# (a name registered with `dice eval add-checkpoint NAME PATH`) x level, so a new checkpoint evaluates alone.
KERNELBENCH_LEVELS = ["1", "2", "3"]
LEVEL_PARTITIONS = dg.StaticPartitionsDefinition(KERNELBENCH_LEVELS)
EVAL_CHECKPOINT_PARTITIONS = dg.DynamicPartitionsDefinition(name=EVAL_CHECKPOINT_PARTITIONS_NAME)
EVAL_PARTITIONS = dg.MultiPartitionsDefinition({"checkpoint": EVAL_CHECKPOINT_PARTITIONS, "level": LEVEL_PARTITIONS})
GROUP_TRAINING = "training"


def table_out(key: dg.AssetKey, description: str) -> dg.AssetOut:
    """An output of a multi-asset that lands as a warehouse table."""
    return dg.AssetOut(key=key, description=description, kinds={"duckdb", "polars"}, code_version="1")
