"""Stage 4, synthesis: Attention/MLP structure instances (LLM-block reference tasks at varied shapes, candidates
from the configured generator backend, kept only if correct and faster) and the synthetic operator families
(generated KernelBench-style pairs, judged like every other pair)."""

import hashlib

import dagster as dg
import polars as pl

from assets import keys
from assets.metadata import (
    counts_markdown,
    histogram_markdown,
    markdown_preview,
    table_metadata,
    versioned_output,
)
from dice_pipeline.resources import (
    SOURCE_METADATA_KEY,
    SOURCE_SHA256_METADATA_KEY,
    KernelGeneratorResource,
    KernelVerifier,
)
from dice_pipeline.schemas import (
    DISTILLED_PAIRS,
    STRUCTURE_INSTANCES,
    SYNTHETIC_OPERATOR_CANDIDATES,
    SYNTHETIC_OPERATOR_PAIRS,
    conform,
)
from dice_pipeline.synthesis.operators.catalogue import HELD_OUT_FAMILIES
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
    from dice_pipeline.synthesis import (
        structure_catalogue,
        synthesize_structure_instances,
    )

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


class OperatorSynthesisConfig(dg.Config):
    """The synthetic operator-family catalogue (dice_pipeline/synthesis/operators): `seed` fixes every instance;
    `scale` multiplies each family's default count (about 2,500 instances at 1.0); `families` empty = all.
    `held_out_families` never enter training (default: cumulative, loss, pooling: a fifth of the families)."""

    seed: int = 0
    scale: float = 1.0
    families: list[str] = []
    held_out_families: list[str] = list(HELD_OUT_FAMILIES)


@dg.asset(
    key=keys.SYNTHETIC_OPERATOR_CANDIDATES,
    group_name=keys.GROUP_SYNTHESIS,
    kinds={"python", "cuda", "duckdb"},
    code_version="1",
)
def synthetic_operator_candidates(context: dg.AssetExecutionContext, config: OperatorSynthesisConfig):
    """KernelBench-style reference tasks from the operator-family generator (element-wise, reductions, softmax,
    norms, losses, pooling, GEMM/conv epilogues), each with a custom CUDA `ModelNew`, in varied shapes, names and
    kernel styles; deterministic for the seed. The `split` column marks the held-out families."""
    from dice_pipeline.synthesis.operator_pairs import GENERATOR_NAME, candidates_frame
    from dice_pipeline.synthesis.operators import generate_operator_instances

    instances = generate_operator_instances(config.seed, families=config.families or None, scale=config.scale,
                                            held_out=config.held_out_families)
    frame = candidates_frame(instances)
    context.log.info(f"{frame.height} instances from {frame['family'].n_unique()} families, "
                     f"{frame['design_id'].n_unique()} CUDA designs")
    content = "\n".join(f"{t}:{s}" for t, s in frame.select("task_id", "split").iter_rows())
    yield dg.Output(frame, metadata={
        SOURCE_METADATA_KEY: f"{GENERATOR_NAME}:seed={config.seed}:scale={config.scale}",
        SOURCE_SHA256_METADATA_KEY: hashlib.sha256(content.encode()).hexdigest(),
        **table_metadata(frame, SYNTHETIC_OPERATOR_CANDIDATES, ["task_id", "family", "style", "split"]),
        "cuda_designs": frame["design_id"].n_unique(),
        "by_family": dg.MetadataValue.md(counts_markdown(frame, "family", "family")),
        "by_split": dg.MetadataValue.md(counts_markdown(frame, "split", "split")),
        "by_style": dg.MetadataValue.md(counts_markdown(frame, "style", "kernel style")),
    })


class OperatorVerificationConfig(dg.Config):
    """`judge_held_out`: also judge the held-out families (they never enter CuKe; judging them only serves
    evaluation). The timing settings are fixed (operators.verification) so verdicts match the shipped archive."""

    judge_held_out: bool = False


@dg.asset(
    key=keys.SYNTHETIC_OPERATOR_PAIRS,
    ins={"candidates": dg.AssetIn(key=keys.SYNTHETIC_OPERATOR_CANDIDATES)},
    group_name=keys.GROUP_SYNTHESIS,
    kinds={"cuda", "pytorch", "duckdb"},
    code_version="1",
    pool="gpu",
    check_specs=[dg.AssetCheckSpec("every_candidate_accounted_for", asset=keys.SYNTHETIC_OPERATOR_PAIRS,
                                   blocking=True, description="one row per candidate, judged or held out")],
)
def synthetic_operator_pairs(context: dg.AssetExecutionContext, config: OperatorVerificationConfig,
                             candidates: pl.DataFrame, verifier: KernelVerifier):
    """Every synthetic candidate judged by the `verifier` resource (the same checks and verdict store as every
    other pair; verdicts judged on our GPU hosts ship with the project, so a GPU-less host reads them instead of
    judging). Per family: how many were judged, correct, and fast enough; a family that fails is counted, never
    dropped."""
    from dice_pipeline.synthesis.operator_pairs import family_report, pairs_frame
    from dice_pipeline.synthesis.operators.verification import synthetic_verify_config

    to_judge = candidates if config.judge_held_out else candidates.filter(pl.col("split") == "train")
    jobs = list(to_judge.select("task_id", "pytorch_code", "generated_code").iter_rows())
    context.log.info(f"judging {len(jobs)} of {candidates.height} synthetic candidates ({verifier.describe()})")
    verdicts, run_metadata = verifier.verify_for_asset(context, jobs, adjust=synthetic_verify_config)
    frame = pairs_frame(candidates, {job[0]: verdict for job, verdict in zip(jobs, verdicts)})
    report = family_report(frame)
    fingerprint = "\n".join(f"{t}:{s}:{'' if x is None else round(x, 2)}"
                            for t, s, x in frame.select("task_id", "status", "measured_speedup").iter_rows())
    yield versioned_output(frame, hashlib.sha256(fingerprint.encode()).hexdigest()[:16], metadata={
        **run_metadata,
        **table_metadata(frame, SYNTHETIC_OPERATOR_PAIRS, ["task_id", "status", "measured_speedup", "verification"]),
        "judged": len(jobs),
        "from_verdict_store": int(frame["from_verdict_store"].fill_null(False).sum()),
        "executed": int(frame["executed"].fill_null(False).sum()),
        "gpu": ", ".join(sorted({g for g in frame["gpu_name"].to_list() if g})) or "none",
        "by_status": dg.MetadataValue.md(counts_markdown(frame.filter(pl.col("status").is_not_null()), "status",
                                                         "status")),
        "by_family": dg.MetadataValue.md(markdown_preview(report, report.columns, rows=50)),
        "speedup_histogram": dg.MetadataValue.md(histogram_markdown(
            frame.filter(pl.col("status") == "correct")["measured_speedup"].to_list(),
            "synthetic pairs: speedup over eager (correct ones)", threshold=2.0)),
    })
    unaccounted = frame.filter(pl.col("verification").is_null() | (pl.col("status").is_null()
                                                                    & (pl.col("split") == "train")))
    yield dg.AssetCheckResult(check_name="every_candidate_accounted_for",
                              passed=frame.height == candidates.height and unaccounted.height == 0,
                              metadata={"candidates": candidates.height, "rows": frame.height,
                                        "unaccounted": unaccounted.height})


class DistillationConfig(dg.Config):
    """Reference tasks -> `n_per_task` candidates each from the `generator` resource -> verified -> ConCuR-format
    rows. `tasks`: "synthetic" (the synthetic operator tasks of the training split), or a path: a JSON task file
    (the RL pool's {idx, level, pytorch_code} list), a JSONL of {task_id, pytorch_code}, or a folder of
    KernelBench-format .py files. `output`: the ConCuR-format JSONL to write (empty: artifacts/distilled/...);
    `dice run --source <output>` ingests it. `only_correct`: write only verified-correct rows (ConCuR's recipe)."""

    tasks: str = "synthetic"
    limit: int = 32
    n_per_task: int = 4
    seed: int = 0
    only_correct: bool = True
    output: str = ""


@dg.asset(
    key=keys.DISTILLED_PAIRS,
    ins={"synthetic_operator_candidates": dg.AssetIn(key=keys.SYNTHETIC_OPERATOR_CANDIDATES)},
    group_name=keys.GROUP_SYNTHESIS,
    kinds={"cuda", "pytorch", "duckdb"},
    code_version="1",
    pool="gpu",
)
def distilled_pairs(context: dg.AssetExecutionContext, config: DistillationConfig,
                    synthetic_operator_candidates: pl.DataFrame, generator: KernelGeneratorResource,
                    verifier: KernelVerifier):
    """ConCuR's recipe as an asset: sample candidates for reference tasks from a generator backend (an
    OpenAI-compatible endpoint, a local checkpoint), verify each, and write the correct ones as ConCuR-format rows
    (generator, sampling settings and verdict on each) that ingestion takes as a source. Every candidate is a row
    here, with why it was not written."""
    from dice_pipeline.paths import artifacts_dir
    from dice_pipeline.synthesis.distill import (
        ReferenceTask,
        concur_rows,
        distill,
        load_reference_tasks,
        write_jsonl,
        yield_summary,
    )

    if config.tasks == "synthetic":
        train = synthetic_operator_candidates.filter(pl.col("split") == "train").head(config.limit)
        tasks = [ReferenceTask(task_id=t, pytorch_code=code, source="synthetic", family=family)
                 for t, code, family in train.select("task_id", "pytorch_code", "family").iter_rows()]
    else:
        tasks = load_reference_tasks(config.tasks, limit=config.limit)
    backend = generator.build()
    context.log.info(f"distilling {len(tasks)} tasks x {config.n_per_task} candidates from {generator.backend}")
    rows = distill(tasks, backend, lambda jobs: verifier.verify(jobs, log=context.log.info), config.n_per_task,
                   seed=config.seed)
    for row in rows:
        verdict_json = row["verdict_json"]
        row["verdict_id"] = None if verdict_json is None else verdict_id(row["job_id"] or row["task_id"], verdict_json)
    frame = conform(pl.DataFrame(rows, schema_overrides=dict(DISTILLED_PAIRS), strict=False) if rows
                    else pl.DataFrame(schema=DISTILLED_PAIRS), DISTILLED_PAIRS)
    out_rows = concur_rows(rows, tasks, only_correct=config.only_correct)
    digest = hashlib.sha256("\n".join(f"{r['uuid']}:{r['verification_status']}" for r in out_rows).encode())
    output = config.output or str(artifacts_dir() / "distilled" / f"{generator.backend}-{digest.hexdigest()[:12]}.jsonl")
    path = write_jsonl(out_rows, output)
    summary = yield_summary(rows)
    yield dg.Output(frame, metadata={
        SOURCE_METADATA_KEY: f"distillation:{generator.backend}:{config.tasks}",
        SOURCE_SHA256_METADATA_KEY: digest.hexdigest(),
        **table_metadata(frame, DISTILLED_PAIRS, ["task_id", "generator_backend", "status", "speedup",
                                                  "reject_reason"]),
        "concur_rows_written": len(out_rows),
        "concur_file": dg.MetadataValue.path(str(path)),
        "yield": dg.MetadataValue.json(summary),
        "by_status": dg.MetadataValue.md(counts_markdown(frame.filter(pl.col("status").is_not_null()), "status",
                                                         "status")),
    })
