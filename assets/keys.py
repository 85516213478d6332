"""Asset keys and partition definitions: part of the public API (tests snapshot them; renames break users)."""

import dagster as dg

CONCUR_PAIRS = dg.AssetKey("concur_pairs")
CONCUR_REJECTS = dg.AssetKey("concur_rejects")
VERIFIED_PAIRS = dg.AssetKey("verified_pairs")
SPEEDUP_FILTERED_PAIRS = dg.AssetKey("speedup_filtered_pairs")
SPEEDUP_FILTER_DECISIONS = dg.AssetKey("speedup_filter_decisions")
STRUCTURE_INSTANCES = dg.AssetKey("structure_instances")
CUKE_SFT_SAMPLES = dg.AssetKey("cuke_sft_samples")
CUKE_SFT_REJECTS = dg.AssetKey("cuke_sft_rejects")
CUKE_DECONTAMINATION_DROPS = dg.AssetKey("cuke_decontamination_drops")
CUKE_INFILLING_TASKS = dg.AssetKey("cuke_infilling_tasks")
CUKE_INFILLING_REJECTS = dg.AssetKey("cuke_infilling_rejects")
CUKE_HF_DATASET = dg.AssetKey("cuke_hf_dataset")
RL_END_TO_END_TASKS = dg.AssetKey("rl_end_to_end_tasks")
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
GROUP_TRAINING = "training"


def table_out(key: dg.AssetKey, description: str) -> dg.AssetOut:
    """An output of a multi-asset that lands as a warehouse table."""
    return dg.AssetOut(key=key, description=description, kinds={"duckdb", "polars"}, code_version="1")
