"""Stage 6, KernelBench evaluation: the task set and locally measured baselines per level, then per model x level
the paper-protocol generation, the verifier's verdicts, sanity rows and metrics, and a comparison report across
every evaluated model beside the paper's numbers. Models are named partitions (`dice eval add-checkpoint`), so any
`from_pretrained` directory or OpenAI-compatible endpoint evaluates without the training assets.
"""

import hashlib
import json
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field

from assets import keys
from assets.metadata import counts_markdown, schema_check, table_metadata
from dice_pipeline import schemas
from dice_pipeline.resources import KernelVerifier, WarehouseResource
from dice_pipeline.settings import GENERATOR_API_KEY
from warehouse import table_for
from warehouse.tables import EVAL_PARTITION_COLUMN, LEVEL_PARTITION_COLUMN


class KernelBenchSourceConfig(dg.Config):
    # "hf:ScalingIntelligence/KernelBench", a tasks.jsonl, or a checkout's KernelBench/ folder; empty = the team's
    # copy (DICE_KERNELBENCH_TASKS or ../shared/data/kernelbench/tasks.jsonl), else the Hugging Face dataset.
    source: str = ""


class BaselineConfig(dg.Config):
    baselines: list[str] = ["eager", "compile"]


class EvaluationConfig(dg.Config):
    """The paper's evaluation protocol by default (one greedy sample, block 4, 4 denoising steps, 4096 new
    tokens). On a CPU that is minutes a task: a smoke test takes `max_tasks: 3`, `max_new_tokens: 64`,
    `batch_size: 1` (README: Evaluating a checkpoint on KernelBench)."""

    registry_path: str = Field(default="", description="the model registry; empty = DICE_EVAL_CHECKPOINTS or "
                                                             "<dagster home>/eval_checkpoints.json")
    checkpoint_path: str = Field(default="", description="overrides the registered path of the partition's model")
    decoding: str = Field(default="", description="auto | block_diffusion | autoregressive; empty = the "
                                                       "registered decoding (auto: block diffusion for SDAR)")
    max_new_tokens: int = Field(default=4096, description="tokens a model may write per answer (the paper: 4096)")
    block_size: int = Field(default=4, description="block-diffusion block size")
    steps: int = Field(default=4, description="denoising steps per block")
    samples: int = Field(default=1, description="answers per task; > 1: pass@k at `temperature`")
    temperature: float = Field(default=0.0, description="sampling temperature; 0 = greedy")
    batch_size: int = Field(default=16, description="tasks decoded together (a CPU: 1 or 2)")
    max_tasks: int = Field(default=0, description="evaluate only the level's first N tasks (a smoke test; the "
                                                     "metrics say the level is incomplete); 0 = every task")
    pass_k: list[int] = Field(default=[], description="k values for pass@k; empty = [1, samples] when samples > 1")
    state_dir: str = Field(default="", description="where generations and verdicts are kept; empty = "
                                                      "<cache>/kernelbench_eval/<model>-<hash of path and "
                                                      "settings>/level<N>")
    sanity_rows: bool = Field(default=True, description="also judge the sanity rows (reference as ModelNew, "
                                                           "zeros kernel, known-good)")

    def generation_settings(self, model):
        """The generation settings for `model` (an EvalModel): these fields over the paper's defaults."""
        from dice_pipeline.evaluation.generation import EvalGenerationSettings

        return EvalGenerationSettings(
            decoding=self.decoding or model.decoding, block_size=self.block_size, steps=self.steps,
            max_new_tokens=self.max_new_tokens, samples=self.samples, temperature=self.temperature,
            batch_size=self.batch_size)


def _task_source(config: KernelBenchSourceConfig) -> str:
    from dice_pipeline.kernelbench import HF_DATASET_ID, HF_SOURCE_PREFIX
    from dice_pipeline.paths import kernelbench_tasks_path

    if config.source:
        return config.source
    local = kernelbench_tasks_path()
    return str(local) if local is not None else HF_SOURCE_PREFIX + HF_DATASET_ID


@dg.asset(
    key=keys.KERNELBENCH_TASKS,
    partitions_def=keys.LEVEL_PARTITIONS,
    group_name=keys.GROUP_EVALUATION,
    kinds={"duckdb", "polars"},
    code_version="1",
    check_specs=[dg.AssetCheckSpec("schema_matches", asset=keys.KERNELBENCH_TASKS)],
)
def kernelbench_tasks(context: dg.AssetExecutionContext, config: KernelBenchSourceConfig):
    """KernelBench tasks of the partition's level, with the known issues of each (NOTES §2: live dropout, random
    forward, integer inputs, zeros passing at 1e-2) in `known_issues`: flagged, never dropped."""
    from dice_pipeline.kernelbench import load_kernelbench_tasks

    level = int(context.partition_key)
    source = _task_source(config)
    task_set = load_kernelbench_tasks(source, levels=[level])
    frame = pl.DataFrame(
        [{LEVEL_PARTITION_COLUMN: context.partition_key, "task_key": t.key, "level": t.level,
          "problem_id": t.problem_id, "name": t.name, "code": t.code,
          "code_sha256": hashlib.sha256(t.code.encode()).hexdigest(), "known_issues": t.known_issues,
          "source": source} for t in task_set.tasks],
        schema=schemas.KERNELBENCH_TASKS,
    )
    skipped = [s for s in task_set.skipped if s.reason_code != "level_not_requested"]
    flagged = frame.filter(pl.col("known_issues").list.len() > 0)
    yield dg.Output(frame, metadata={
        **table_metadata(frame, schemas.KERNELBENCH_TASKS, ["task_key", "known_issues"]),
        "source": source,
        "skipped": len(skipped),
        "known_issue_tasks": dg.MetadataValue.md(
            "\n".join(f"- {k}: {', '.join(v)}" for k, v in flagged.select("task_key", "known_issues").iter_rows())
            or "none"),
    })
    yield schema_check("schema_matches", keys.KERNELBENCH_TASKS, frame, schemas.KERNELBENCH_TASKS)


def _tasks_from_frame(frame: pl.DataFrame):
    from dice_pipeline.kernelbench import KernelBenchTask

    return [KernelBenchTask(r["level"], r["problem_id"], r["name"], r["code"])
            for r in frame.sort("problem_id").iter_rows(named=True)]


def _evaluation_verify_config(verifier: KernelVerifier):
    from dice_pipeline.evaluation.evaluate import evaluation_verify_config

    base = verifier.verify_config().to_dict()
    base.pop("tolerance_policy", None)
    return evaluation_verify_config(**base)


@dg.asset(
    key=keys.KERNELBENCH_BASELINES,
    ins={"kernelbench_tasks": dg.AssetIn(key=keys.KERNELBENCH_TASKS)},
    partitions_def=keys.LEVEL_PARTITIONS,
    group_name=keys.GROUP_EVALUATION,
    kinds={"pytorch", "duckdb"},
    code_version="1",
    pool="gpu",
    check_specs=[dg.AssetCheckSpec("one_row_per_task", asset=keys.KERNELBENCH_BASELINES)],
)
def kernelbench_baselines(context: dg.AssetExecutionContext, config: BaselineConfig, kernelbench_tasks: pl.DataFrame,
                          verifier: KernelVerifier):
    """Eager and torch.compile reference times of every task of the level, measured on this host's GPU with the
    verifier's timing method (`measure_references`), with provenance. Speedups are computed against these, never
    against another machine's numbers. Without a GPU every row is `not_executed` and says why."""
    from dice_pipeline.evaluation.baselines import measure_baselines

    tasks = _tasks_from_frame(kernelbench_tasks)
    rows = measure_baselines(tasks, _evaluation_verify_config(verifier), baselines=tuple(config.baselines))
    frame = pl.DataFrame(
        [{LEVEL_PARTITION_COLUMN: context.partition_key, "task_key": r["task_id"], "status": r["status"],
          "message": r["message"], "eager_ms_gpu": r["eager_ms_gpu"], "eager_ms_host": r["eager_ms_host"],
          "compile_ms_gpu": r["compile_ms_gpu"], "peak_gpu_mb": r["peak_gpu_mb"],
          "input_draw_json": json.dumps(r["input_draw"], sort_keys=True, default=str),
          "gpu_name": r["provenance"].get("gpu"), "provenance_json": json.dumps(r["provenance"], sort_keys=True,
                                                                                 default=str)} for r in rows],
        schema=schemas.KERNELBENCH_BASELINES,
    )
    yield dg.Output(frame, metadata={
        **table_metadata(frame, schemas.KERNELBENCH_BASELINES, ["task_key", "status", "eager_ms_gpu",
                                                               "compile_ms_gpu", "gpu_name"], "kernelbench_baselines"),
        "by_status": dg.MetadataValue.md(counts_markdown(frame, "status", "status")),
    })
    yield dg.AssetCheckResult(check_name="one_row_per_task",
                              passed=frame.height == kernelbench_tasks.height
                              and frame["task_key"].n_unique() == frame.height,
                              metadata={"tasks": kernelbench_tasks.height, "rows": frame.height})


def _generator(model, config: EvaluationConfig, settings):
    """A generate(tasks, seed) callable that loads the model on first use (a resumed evaluation may need none)."""
    from dice_pipeline.evaluation.generation import CheckpointGenerator, endpoint_generator

    loaded = []

    def generate(tasks, seed):
        if not loaded:
            if model.kind == "endpoint":
                loaded.append(endpoint_generator(model.base_url, model.model, settings,
                                                 api_key=GENERATOR_API_KEY.get()))
            else:
                loaded.append(CheckpointGenerator.from_pretrained(config.checkpoint_path or model.path, settings))
        return loaded[0](tasks, seed)

    return generate


def _list_frame(rows: list[dict], schema: pl.Schema, partition_key: str) -> pl.DataFrame:
    records = [{EVAL_PARTITION_COLUMN: partition_key, **{k: row.get(k) for k in schema.names()
                                                         if k != EVAL_PARTITION_COLUMN}} for row in rows]
    return pl.DataFrame(records, schema=schema)


@dg.multi_asset(
    outs={
        "kernelbench_eval_results": keys.table_out(keys.KERNELBENCH_EVAL_RESULTS, "One row per task (and sample): "
                                                   "the model's answer, its verdict, both speedups, the baseline."),
        "kernelbench_eval_sanity": keys.table_out(keys.KERNELBENCH_EVAL_SANITY, "Sanity rows judged with the "
                                                  "evaluation: reference-as-ModelNew, zeros kernel, known-good."),
        "kernelbench_eval_metrics": keys.table_out(keys.KERNELBENCH_EVAL_METRICS, "Compile rate, Exec, fast_p, "
                                                   "geomean speedup, deceptive rate, per tolerance."),
    },
    ins={"kernelbench_tasks": dg.AssetIn(key=keys.KERNELBENCH_TASKS),
         "kernelbench_baselines": dg.AssetIn(key=keys.KERNELBENCH_BASELINES)},
    partitions_def=keys.EVAL_PARTITIONS,
    group_name=keys.GROUP_EVALUATION,
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec("sanity_rows_come_out_right", asset=keys.KERNELBENCH_EVAL_SANITY),
        dg.AssetCheckSpec("every_task_scored", asset=keys.KERNELBENCH_EVAL_METRICS),
    ],
)
def kernelbench_evaluation(context: dg.AssetExecutionContext, config: EvaluationConfig,
                           kernelbench_tasks: pl.DataFrame, kernelbench_baselines: pl.DataFrame,
                           verifier: KernelVerifier):
    """Evaluate the partition's model on the partition's level with the paper's protocol (one-shot KernelBench
    prompt in the chat template, one greedy sample, block 4, 4 steps, 4096 new tokens, first code block) and judge
    every answer. Generations and verdicts are kept in a state directory: an interrupted evaluation resumes
    without generating or judging a finished task again."""
    from dice_pipeline.evaluation.evaluate import evaluate_level
    from dice_pipeline.evaluation.registry import resolve
    from dice_pipeline.evaluation.report import comparison_markdown
    from dice_pipeline.evaluation.runner import default_state_dir

    dims = context.partition_key.keys_by_dimension
    name, level = dims["checkpoint"], int(dims["level"])
    partition_key = str(context.partition_key)
    model = resolve(name, config.registry_path or None)
    settings = config.generation_settings(model)
    state_dir = config.state_dir or str(default_state_dir(model, settings, level, config.checkpoint_path))
    baselines = [{"task_id": r["task_key"], "status": r["status"], "eager_ms_gpu": r["eager_ms_gpu"],
                  "compile_ms_gpu": r["compile_ms_gpu"]} for r in kernelbench_baselines.iter_rows(named=True)]
    tasks = _tasks_from_frame(kernelbench_tasks)
    limited = 0 < config.max_tasks < len(tasks)
    if limited:
        tasks = tasks[:config.max_tasks]  # a smoke test: the level's first tasks, reported as incomplete
        context.log.info(f"max_tasks {config.max_tasks}: evaluating {len(tasks)} of the level's "
                         f"{kernelbench_tasks.height} tasks")
    evaluation = evaluate_level(
        tasks, checkpoint=name, level=level,
        generate=_generator(model, config, settings),
        config=_evaluation_verify_config(verifier), state_dir=state_dir, samples=config.samples,
        baselines=baselines, sanity=config.sanity_rows, generation_batch=config.batch_size, log=context.log.info,
        pass_k=config.pass_k or ([1, config.samples] if config.samples > 1 else []))
    results = _list_frame(evaluation.results, schemas.KERNELBENCH_EVAL_RESULTS, partition_key)
    sanity = _list_frame(evaluation.sanity, schemas.KERNELBENCH_EVAL_SANITY, partition_key)
    metric_rows = [{**row, "complete": row["complete"] and not limited,
                    "deceptive_by_reason_json": json.dumps(row["deceptive_by_reason"], sort_keys=True),
                    "pass_at_k_json": json.dumps(row["pass_at_k"], sort_keys=True)} for row in evaluation.metrics]
    metrics = _list_frame(metric_rows, schemas.KERNELBENCH_EVAL_METRICS, partition_key)
    execution = ("executed on the GPU" if evaluation.executed else
                 "NOT executed (no GPU): verdicts are static checks only; Exec and fast_p are not measured results")
    yield dg.Output(results, output_name="kernelbench_eval_results", metadata={
        **table_metadata(results, schemas.KERNELBENCH_EVAL_RESULTS, ["task_key", "status", "speedup_gpu",
                                                                     "known_issues"], "kernelbench_eval_results"),
        "execution": execution, "state_dir": state_dir, "model": model.path or model.base_url,
        "generated_now": evaluation.run.generated, "judged_now": evaluation.run.judged,
        "by_status": dg.MetadataValue.md(counts_markdown(results, "status", "status")),
    })
    yield dg.Output(sanity, output_name="kernelbench_eval_sanity",
                    metadata=table_metadata(sanity, schemas.KERNELBENCH_EVAL_SANITY,
                                            ["check", "subject", "status", "passed", "asserted"],
                                            "kernelbench_eval_sanity"))
    yield dg.Output(metrics, output_name="kernelbench_eval_metrics", metadata={
        **table_metadata(metrics, schemas.KERNELBENCH_EVAL_METRICS, ["tolerance", "compile_rate", "exec_rate",
                                                                     "fast_1", "fast_2", "geomean_speedup_gpu"]),
        "execution": execution, "fast_p_convention": "speedup_gpu (GPU-time; speedup_host also reported)",
        "report": dg.MetadataValue.md(comparison_markdown(evaluation.metrics)),
    })
    failed = [f"{r['check']}:{r['subject']}" for r in evaluation.sanity if not r["passed"]]
    asserted = sorted({row["asserted"] for row in evaluation.sanity})
    yield dg.AssetCheckResult(check_name="sanity_rows_come_out_right", asset_key=keys.KERNELBENCH_EVAL_SANITY,
                              passed=not failed, metadata={"failed": ", ".join(failed) or "none",
                                                           "asserted": ", ".join(asserted) or "none"})
    yield dg.AssetCheckResult(check_name="every_task_scored", asset_key=keys.KERNELBENCH_EVAL_METRICS,
                              passed=evaluation.complete and all(r["n_tasks"] == kernelbench_tasks.height
                                                                 for r in evaluation.metrics),
                              description=f"max_tasks {config.max_tasks}: {len(tasks)} of the level's "
                              f"{kernelbench_tasks.height} tasks evaluated (a smoke test)" if limited else None,
                              metadata={"tasks": kernelbench_tasks.height, "tasks_evaluated": len(tasks),
                                        "stopped_early": evaluation.run.stopped_early or "no"})


@dg.asset(
    key=keys.KERNELBENCH_COMPARISON_REPORT,
    deps=[keys.KERNELBENCH_EVAL_METRICS],
    group_name=keys.GROUP_EVALUATION,
    kinds={"markdown"},
    code_version="1",
)
def kernelbench_comparison_report(context: dg.AssetExecutionContext, warehouse: WarehouseResource):
    """Every evaluated model and level (all partitions in the warehouse) at both tolerances, beside the paper's
    published numbers; written to artifacts/kernelbench/comparison.md and shown here."""
    from dice_pipeline.evaluation.report import comparison_markdown
    from dice_pipeline.paths import artifacts_dir

    frame = warehouse.open().read(table_for("kernelbench_eval_metrics"))
    rows = frame.to_dicts()
    markdown = comparison_markdown(rows)
    path = Path(artifacts_dir()) / "kernelbench" / "comparison.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown)
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(markdown), "path": dg.MetadataValue.path(str(path)),
        "models": ", ".join(sorted({r["checkpoint"] for r in rows})) or "none",
        "not_executed_partitions": sum(1 for r in rows if not r["executed"]),
    })
