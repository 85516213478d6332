"""Stage 5, CuKe: the curated SFT set (prompt/response), its kernel-infilling split, difficulty labels, the
Hugging Face export, and the end-to-end RL task pool with its easy->hard schedule.

CuKe is built per threshold partition: the speedup-filtered ConCuR pairs of that threshold, the kept structure
instances and the judged synthetic operator pairs at or above the threshold, without the held-out families. Every
candidate ends as a sample or a reject with a reason, including KernelBench overlaps.
"""


import dagster as dg
import polars as pl

from assets import keys
from assets.keys import table_out
from assets.metadata import counts_markdown, markdown_preview, table_metadata
from dice_pipeline import settings
from dice_pipeline.paths import artifacts_dir
from dice_pipeline.resources import SOURCE_METADATA_KEY, SOURCE_SHA256_METADATA_KEY
from dice_pipeline.thresholds import SpeedupThreshold
from warehouse.tables import CUKE_PARTITION_COLUMN, table_for

RL_TASK_FILE_ENV_VAR = settings.RL_TASK_FILE.name


class CukeConfig(dg.Config):
    """`decontaminate`: drop samples whose reference overlaps a KernelBench task (needs KernelBench's tasks:
    `kernelbench_tasks` or DICE_KERNELBENCH_TASKS). `include_reasoning`: put a source's reasoning trace before the
    answer as <think>...</think>. `include_synthetic`: take the judged synthetic operator pairs at this threshold.
    `held_out_families`: operator families no sample may come from, whatever its source (evaluation reports them
    as unseen); empty = none held out."""

    include_reasoning: bool = True
    decontaminate: bool = True
    kernelbench_tasks: str = ""
    include_synthetic: bool = True
    held_out_families: list[str] = ["cumulative", "loss", "pooling"]


def _with_partition(frame: pl.DataFrame, name: str, partition_key: str) -> pl.DataFrame:
    spec = table_for(name)
    return frame.with_columns(pl.lit(partition_key).alias(CUKE_PARTITION_COLUMN)).select(spec.schema.names())


@dg.multi_asset(
    outs={
        "cuke_sft_samples": table_out(
            keys.CUKE_SFT_SAMPLES, "CuKe SFT samples: chat prompt + kernel response, lineage, op family, difficulty."
        ),
        "cuke_sft_rejects": table_out(
            keys.CUKE_SFT_REJECTS, "Candidates that did not become samples, each with a reason code."
        ),
        "cuke_decontamination_drops": table_out(
            keys.CUKE_DECONTAMINATION_DROPS, "Samples dropped for overlapping a KernelBench task, with the task."
        ),
    },
    ins={
        "speedup_filtered_pairs": dg.AssetIn(key=keys.SPEEDUP_FILTERED_PAIRS),
        "structure_instances": dg.AssetIn(key=keys.STRUCTURE_INSTANCES),
        "synthetic_operator_pairs": dg.AssetIn(key=keys.SYNTHETIC_OPERATOR_PAIRS),
    },
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_CUKE,
    check_specs=[
        dg.AssetCheckSpec(
            "rows_conserved",
            asset=keys.CUKE_SFT_SAMPLES,
            blocking=True,
            description="candidates == samples + rejects",
        ),
        dg.AssetCheckSpec("prompt_response_present", asset=keys.CUKE_SFT_SAMPLES, blocking=True),
    ],
)
def cuke_samples(
    context: dg.AssetExecutionContext,
    config: CukeConfig,
    speedup_filtered_pairs: pl.DataFrame,
    structure_instances: pl.DataFrame,
    synthetic_operator_pairs: pl.DataFrame,
):
    """The union of this threshold's filtered ConCuR pairs, the kept structure instances and the synthetic operator
    pairs at or above the threshold as SFT samples (`prompt` = the KernelBench one-shot prompt in the chat template,
    `response` = the ModelNew file), deduplicated, decontaminated against KernelBench, held-out families out."""
    from dice_pipeline.cuke.decontaminate import KernelBenchIndex
    from dice_pipeline.cuke.family_report import family_report
    from dice_pipeline.cuke.samples import build_sft_samples

    partition_key = context.partition_key
    threshold = SpeedupThreshold.from_partition_key(partition_key)
    index = None
    if config.decontaminate:
        index = KernelBenchIndex.from_path(config.kernelbench_tasks or None)
    structure_floor = structure_instances["threshold"].max() if structure_instances.height else None
    build = build_sft_samples(
        speedup_filtered_pairs,
        structure_instances,
        threshold,
        kernelbench_index=index,
        include_reasoning=config.include_reasoning,
        structure_threshold=structure_floor,
        synthetic_pairs=synthetic_operator_pairs if config.include_synthetic else None,
        held_out_families=tuple(config.held_out_families),
    )
    samples = build.samples
    families = family_report(build.candidates, samples, build.rejects, build.decontamination_drops, index,
                             tuple(config.held_out_families))
    not_executed = samples.filter(pl.col("verification_status") == "not_executed").height
    yield dg.Output(
        _with_partition(samples, "cuke_sft_samples", partition_key),
        output_name="cuke_sft_samples",
        metadata={
            **table_metadata(
                samples,
                table_for("cuke_sft_samples").schema,
                [
                    "sample_id",
                    "source",
                    "problem_name",
                    "family",
                    "op_family",
                    "difficulty",
                    "speedup_used",
                    "verification_status",
                ],
            ),
            "composition": dg.MetadataValue.md(_composition_markdown(samples)),
            "by_family": dg.MetadataValue.md(markdown_preview(families, families.columns, rows=60)),
            "held_out_families": ", ".join(config.held_out_families) or "none",
            "length_distributions": dg.MetadataValue.json(_length_summary(samples)),
            "samples_not_executed": not_executed,
            "decontamination": "off" if index is None else f"{build.counts.get('decontaminated', 0)} dropped",
            "counts": dg.MetadataValue.json(build.counts),
        },
    )
    yield dg.Output(
        _with_partition(build.rejects, "cuke_sft_rejects", partition_key),
        output_name="cuke_sft_rejects",
        metadata={
            **table_metadata(build.rejects, table_for("cuke_sft_rejects").schema,
                             ["source", "source_id", "reason_code", "message"], "cuke_sft_rejects"),
            "rejections_by_reason": dg.MetadataValue.md(counts_markdown(build.rejects, "reason_code", "reason")),
        },
    )
    yield dg.Output(
        _with_partition(build.decontamination_drops, "cuke_decontamination_drops", partition_key),
        output_name="cuke_decontamination_drops",
        metadata=table_metadata(build.decontamination_drops, table_for("cuke_decontamination_drops").schema,
                                ["row_id", "kernelbench_task", "rule", "jaccard"], "cuke_decontamination_drops"),
    )
    yield dg.AssetCheckResult(
        check_name="rows_conserved",
        asset_key=keys.CUKE_SFT_SAMPLES,
        passed=build.counts["candidates"] == samples.height + build.rejects.height,
        # keyed by the partition: the UI plots a check's numbers as one series a key, never joining thresholds
        metadata={f"candidates_at_{partition_key}": build.counts["candidates"],
                  f"samples_at_{partition_key}": samples.height, f"rejects_at_{partition_key}": build.rejects.height},
    )
    empty = samples.filter((pl.col("prompt").str.strip_chars() == "") | (pl.col("response").str.strip_chars() == ""))
    yield dg.AssetCheckResult(
        check_name="prompt_response_present",
        asset_key=keys.CUKE_SFT_SAMPLES,
        passed=empty.height == 0,
        metadata={f"empty_at_{partition_key}": empty.height},
    )


def _length_summary(samples: pl.DataFrame) -> dict:
    """Prompt/response length statistics in characters (no histogram bins: those are in the exported card)."""
    from dice_pipeline.cuke.export import length_distributions

    return {
        name: {k: v for k, v in stats.items() if k not in ("edges", "counts")}
        for name, stats in length_distributions(samples).items()
    }


def _composition_markdown(samples: pl.DataFrame) -> str:
    from dice_pipeline.cuke.export import composition_table

    table = composition_table(samples)
    return markdown_preview(table, table.columns, rows=50)


@dg.multi_asset(
    outs={
        "cuke_infilling_tasks": table_out(
            keys.CUKE_INFILLING_TASKS,
            "Stage-1 RL tasks: prefix (imports) + suffix given, the CUDA source "
            "string to write; prefix + middle + suffix == the kernel file.",
        ),
        "cuke_infilling_rejects": table_out(
            keys.CUKE_INFILLING_REJECTS, "Samples whose kernel file cannot be split, with the reason."
        ),
    },
    ins={"cuke_sft_samples": dg.AssetIn(key=keys.CUKE_SFT_SAMPLES)},
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_CUKE,
    check_specs=[
        dg.AssetCheckSpec(
            "split_reassembles",
            asset=keys.CUKE_INFILLING_TASKS,
            blocking=True,
            description="prefix + middle + suffix == the kernel file, every row",
        )
    ],
)
def cuke_infilling(context: dg.AssetExecutionContext, cuke_sft_samples: pl.DataFrame):
    """Split every CuKe kernel file into prefix / middle (the CUDA source string) / suffix for kernel infilling,
    and build the stage-1 RL task set from the splits."""
    from dice_pipeline.cuke.infilling import build_infilling_split, build_stage1_tasks

    partition_key = context.partition_key
    splits, rejects = build_infilling_split(cuke_sft_samples, id_column="sample_id", code_column="generated_code")
    tasks = build_stage1_tasks(splits, id_column="sample_id", reference_column="pytorch_code")
    yield dg.Output(
        _with_partition(tasks, "cuke_infilling_tasks", partition_key),
        output_name="cuke_infilling_tasks",
        metadata=table_metadata(tasks, table_for("cuke_infilling_tasks").schema, ["task_id", "difficulty"]),
    )
    yield dg.Output(
        _with_partition(rejects, "cuke_infilling_rejects", partition_key),
        output_name="cuke_infilling_rejects",
        metadata={
            **table_metadata(rejects, table_for("cuke_infilling_rejects").schema, ["row_id", "reason_code", "message"],
                             "cuke_infilling_rejects"),
            "rejections_by_reason": dg.MetadataValue.md(counts_markdown(rejects, "reason_code", "reason")),
        },
    )
    reassembled = dict(zip(splits["sample_id"], splits["prefix"] + splits["middle"] + splits["suffix"]))
    originals = dict(zip(cuke_sft_samples["sample_id"], cuke_sft_samples["generated_code"]))
    broken = [sample_id for sample_id, code in reassembled.items() if originals[sample_id] != code]
    yield dg.AssetCheckResult(
        check_name="split_reassembles",
        asset_key=keys.CUKE_INFILLING_TASKS,
        passed=not broken and splits.height + rejects.height == cuke_sft_samples.height,
        metadata={f"broken_at_{partition_key}": len(broken), f"split_at_{partition_key}": splits.height,
                  f"rejected_at_{partition_key}": rejects.height},
    )


@dg.asset(
    key=keys.CUKE_HF_DATASET,
    ins={
        "cuke_sft_samples": dg.AssetIn(key=keys.CUKE_SFT_SAMPLES),
        "cuke_sft_rejects": dg.AssetIn(key=keys.CUKE_SFT_REJECTS),
        "structure_instances": dg.AssetIn(key=keys.STRUCTURE_INSTANCES),
    },
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_CUKE,
    kinds={"huggingface", "parquet"},
    code_version="1",
)
def cuke_hf_dataset(
    context: dg.AssetExecutionContext,
    cuke_sft_samples: pl.DataFrame,
    cuke_sft_rejects: pl.DataFrame,
    structure_instances: pl.DataFrame,
) -> dg.MaterializeResult:
    """CuKe at this threshold as a Hugging Face dataset (`save_to_disk` folder + Parquet) with a dataset card
    stating its lineage: sources, thresholds, verifier version, counts, decontamination."""
    from dice_pipeline.cuke.export import build_lineage, export_cuke

    partition_key = context.partition_key
    samples = cuke_sft_samples.drop(CUKE_PARTITION_COLUMN)
    counts = {
        "samples": samples.height,
        "rejected_by_reason": dict(cuke_sft_rejects.group_by("reason_code").len().iter_rows()),
        "structure_candidates": structure_instances.height,
    }
    decontaminated = cuke_sft_rejects.filter(pl.col("reason_code") == "kernelbench_overlap").height
    lineage = build_lineage(
        samples,
        counts,
        {"checked": samples.height + decontaminated, "dropped": decontaminated},
        thresholds=[SpeedupThreshold.from_partition_key(partition_key).value],
    )
    export = export_cuke(samples, artifacts_dir() / "cuke" / partition_key, lineage)
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(export.root)),
            "hf_dataset_dir": dg.MetadataValue.path(str(export.hf_dataset_dir)),
            "parquet": dg.MetadataValue.path(str(export.parquet_path)),
            "dataset_card": dg.MetadataValue.md(export.card_path.read_text()),
            "dagster/row_count": samples.height,
        }
    )


class RlPoolConfig(dg.Config):
    """`task_file`: an external RL task file with its own difficulty labels (a JSON list of {idx, level,
    pytorch_code}, e.g. DICE's end_to_end_kernel_generation_4000.json). Empty: DICE_RL_TASK_FILE, else the ingested
    ConCuR references (and, with `include_synthetic`, the synthetic operator tasks of the training split) labelled
    with our difficulty score. `held_out_families` are taken out of the pool whatever its source."""

    task_file: str = ""
    include_synthetic: bool = True
    held_out_families: list[str] = ["cumulative", "loss", "pooling"]


@dg.asset(
    key=keys.RL_END_TO_END_TASKS,
    ins={"concur_pairs": dg.AssetIn(key=keys.CONCUR_PAIRS),
         "synthetic_operator_candidates": dg.AssetIn(key=keys.SYNTHETIC_OPERATOR_CANDIDATES)},
    group_name=keys.GROUP_RL_DATA,
    kinds={"duckdb", "polars"},
    code_version="1",
)
def rl_end_to_end_tasks(context: dg.AssetExecutionContext, config: RlPoolConfig, concur_pairs: pl.DataFrame,
                        synthetic_operator_candidates: pl.DataFrame):
    """The end-to-end RL task pool in the order the RL stage walks it (easy -> hard: the paper's data scheduling),
    without the held-out families."""
    from dice_pipeline.cuke.rl_pool import RL_TASK_POOL, pool_from_references, pool_from_task_file, without_families

    task_file = config.task_file or settings.RL_TASK_FILE.get()
    if task_file:
        pool, rejects = pool_from_task_file(task_file)
        source = task_file
    else:
        references = concur_pairs.select(pl.col("uuid").alias("task_id"), "pytorch_code",
                                         pl.lit("concur_pairs").alias("source"), pl.lit(None, pl.String).alias("family"))
        if config.include_synthetic:
            synthetic = synthetic_operator_candidates.filter(pl.col("split") == "train").select(
                "task_id", "pytorch_code", pl.lit("synthetic").alias("source"), "family")
            references = pl.concat([references, synthetic])
        pool, rejects = pool_from_references(references, "concur_pairs"), None
        source = "concur_pairs" + (" + synthetic operator tasks" if config.include_synthetic else "") + \
            " (labels computed)"
    pool, held_out = without_families(pool, tuple(config.held_out_families))
    metadata = {
        **table_metadata(
            pool, RL_TASK_POOL, ["schedule_position", "task_id", "source", "family", "difficulty", "label_source"]
        ),
        "source": source,
        "held_out_tasks_removed": dg.MetadataValue.json(held_out),
        "difficulty_counts": dg.MetadataValue.md(counts_markdown(pool, "difficulty", "difficulty")),
        "by_source": dg.MetadataValue.md(counts_markdown(pool, "source", "source")),
    }
    if task_file:
        # Not built from ConCuR: the table's source is the task file itself.
        import hashlib
        from pathlib import Path

        metadata[SOURCE_METADATA_KEY] = f"task_file:{task_file}"
        metadata[SOURCE_SHA256_METADATA_KEY] = hashlib.sha256(Path(task_file).read_bytes()).hexdigest()
    if rejects is not None:
        metadata["rejected_rows"] = rejects.height
        metadata["rejects"] = dg.MetadataValue.md(
            markdown_preview(rejects, rejects.columns, rows=50) if rejects.height else "_(none)_"
        )
    return dg.Output(pool, metadata=metadata)
