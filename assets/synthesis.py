"""Stage 4, Attention/MLP structure synthesis: LLM-block reference tasks at varied shapes, candidate kernels from
the configured generator backend, each verified; only correct ones faster than the floor are kept."""

import hashlib

import dagster as dg
import polars as pl

from assets import keys
from assets.metadata import counts_markdown, histogram_markdown, table_metadata
from dice_pipeline.resources import (
    SOURCE_METADATA_KEY,
    SOURCE_SHA256_METADATA_KEY,
    KernelGeneratorResource,
    KernelVerifier,
)
from dice_pipeline.schemas import STRUCTURE_INSTANCES, conform
from dice_pipeline.verified import verdict_id


class StructureSynthesisConfig(dg.Config):
    """`families` empty = the whole catalogue. `min_speedup` is the floor a correct candidate must reach to be kept
    (the paper keeps structure instances that are "correct and faster": 1.0)."""

    families: list[str] = []
    n_per_task: int = 1
    min_speedup: float = 1.0
    seed: int = 0



@dg.asset(
    key=keys.STRUCTURE_INSTANCES,
    group_name=keys.GROUP_SYNTHESIS,
    kinds={"cuda", "pytorch", "duckdb"},
    code_version="1",
    pool="gpu",
    check_specs=[dg.AssetCheckSpec("kept_are_correct_and_fast", asset=keys.STRUCTURE_INSTANCES, blocking=True)],
)
def structure_instances(
    context: dg.AssetExecutionContext,
    config: StructureSynthesisConfig,
    generator: KernelGeneratorResource,
    verifier: KernelVerifier,
):
    """Generate candidate kernels for the Attention/MLP structure catalogue (MHA/GQA/MQA with RoPE and a causal
    mask, SwiGLU and GELU MLPs, norms with residual, a GPT-2 block) and verify each. Every candidate is a row with
    its generator, prompt and verdict, kept or not, and why."""
    from dice_pipeline.synthesis import structure_catalogue, synthesize_structure_instances

    tasks = structure_catalogue(config.families or None)
    backend = generator.build()
    context.log.info(f"{len(tasks)} catalogue tasks x {config.n_per_task} candidates from {generator.backend}")
    rows = synthesize_structure_instances(
        tasks,
        backend,
        lambda jobs: verifier.verify(jobs, log=context.log.info),
        config.n_per_task,
        config.min_speedup,
        seed=config.seed,
    )
    reference_by_task = {task.task_id: task.pytorch_code for task in tasks}
    for row in rows:
        row["pytorch_code"] = reference_by_task[row["task_id"]]
        verdict_json = row["verdict_json"]
        row["verdict_id"] = None if verdict_json is None else verdict_id(row["job_id"] or row["task_id"], verdict_json)
    frame = conform(
        pl.DataFrame(rows, schema_overrides=dict(STRUCTURE_INSTANCES), strict=False)
        if rows
        else pl.DataFrame(schema=STRUCTURE_INSTANCES),
        STRUCTURE_INSTANCES,
    )
    kept = frame.filter(pl.col("kept"))
    # Not built from ConCuR: its source is the catalogue and the generator, its content the candidates judged.
    content = "\n".join(
        f"{t}:{c}:{v}" for t, c, v in frame.select("task_id", "candidate_code", "verdict_id").iter_rows()
    )
    yield dg.Output(
        frame,
        metadata={
            SOURCE_METADATA_KEY: f"structure_catalogue:{generator.backend}",
            SOURCE_SHA256_METADATA_KEY: hashlib.sha256(content.encode()).hexdigest(),
            **table_metadata(
                frame,
                STRUCTURE_INSTANCES,
                ["task_id", "generator_backend", "status", "speedup", "kept", "reject_reason"],
            ),
            "kept": kept.height,
            "kept_by_family": dg.MetadataValue.md(counts_markdown(kept, "family", "family")),
            "rejections_by_reason": dg.MetadataValue.md(
                counts_markdown(frame.filter(~pl.col("kept")), "reject_reason", "reason")
            ),
            "speedup_histogram": dg.MetadataValue.md(
                histogram_markdown(
                    frame["speedup"].to_list(), "structure candidates: speedup over eager", threshold=config.min_speedup
                )
            ),
        },
    )
    bad = kept.filter((pl.col("status") != "correct") | (pl.col("speedup") < config.min_speedup))
    yield dg.AssetCheckResult(
        check_name="kept_are_correct_and_fast", passed=bad.height == 0, metadata={"violations": bad.height}
    )
