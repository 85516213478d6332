"""Typed schemas of every table the pipeline produces, declared once.

The loaders build frames with these schemas, the warehouse creates its DuckDB tables from them, and the tests
check frames against them. Polars is imported here, so GPU-side code must not import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# Columns every ConCuR-style source must provide for a row to be usable.
CONCUR_REQUIRED_COLUMNS = ("uuid", "pytorch_code", "generated_code")
# Columns ConCuR documents; absent optional ones become nulls. Anything else a source has is kept in `extra_json`.
CONCUR_KNOWN_COLUMNS = (
    "uuid",
    "problem_name",
    "pytorch_code",
    "generated_code",
    "generated_think",
    "speedup_over_eager",
)

CONCUR_PAIRS = pl.Schema(
    {
        "uuid": pl.String,
        "problem_name": pl.String,
        "pytorch_code": pl.String,
        "generated_code": pl.String,
        "generated_think": pl.String,
        "speedup_over_eager": pl.Float64,  # as recorded by the source (null where the source has none)
        "source_name": pl.String,  # e.g. "embedded", "hf:lkongam/ConCuR", "parquet:/data/x.parquet"
        "source_row": pl.Int64,  # 0-based row index in the source, for tracing a row back
        "content_sha256": pl.String,  # hash of the whitespace-normalised reference + candidate
        "extra_json": pl.String,  # source columns beyond CONCUR_KNOWN_COLUMNS, as a JSON object
        # what reading and ingestion changed in the row (bytes not UTF-8 replaced, code unwrapped); null: nothing
        "normalisations": pl.String,
    }
)

CONCUR_REJECTS = pl.Schema(
    {
        "source_name": pl.String,
        "source_row": pl.Int64,
        "uuid": pl.String,
        "reason_code": pl.String,
        "message": pl.String,
        "row_json": pl.String,  # the rejected row as read (truncated fields), so nothing is lost silently
    }
)

VERIFIED_PAIRS = pl.Schema(
    {
        "uuid": pl.String,
        "problem_name": pl.String,
        "status": pl.String,  # dice_pipeline.verify.Status value
        "executed": pl.Boolean,  # False where no GPU was available: status is then not_executed or a static/compile reject
        "reason_codes": pl.List(pl.String),
        "flags": pl.List(pl.String),
        "measured_speedup": pl.Float64,  # in the verifier's configured convention (speedup_convention)
        "measured_speedup_gpu": pl.Float64,  # flush and call enqueued back to back (KernelBench / do_bench)
        "measured_speedup_host": pl.Float64,  # host launch latency inside every sample
        "speedup_convention": pl.String,  # gpu | host: which of the two measured_speedup is
        "reference_median_ms": pl.Float64,
        "candidate_median_ms": pl.Float64,
        "max_abs_diff": pl.Float64,
        "correct_at_1e2": pl.Boolean,
        "correct_at_1e4": pl.Boolean,
        "verifier_version": pl.String,
        "gpu_name": pl.String,
        "verdict_id": pl.String,  # stable id of this verdict: sha256 of uuid + verdict JSON
        "verdict_json": pl.String,
    }
)

# One row per ingested pair per threshold: kept or not, and why. `speedup_filtered_pairs` is the kept subset.
SPEEDUP_FILTER_DECISIONS = pl.Schema(
    {
        "threshold_key": pl.String,
        "threshold": pl.Float64,
        "uuid": pl.String,
        "kept": pl.Boolean,
        # kept | below_threshold | no_speedup | failed_verification | overhead_dominated
        "reason_code": pl.String,
        "speedup_used": pl.Float64,
        "speedup_source": pl.String,  # measured (our verifier on a GPU) | recorded (the source's own figure)
        # gpu | host for a measured speedup (the filter's choice); recorded figures are ConCuR's (GPU time)
        "speedup_convention": pl.String,
        "verification_status": pl.String,
        "verdict_id": pl.String,
    }
)

SPEEDUP_FILTERED_PAIRS = pl.Schema(
    {
        "threshold_key": pl.String,
        "threshold": pl.Float64,
        "uuid": pl.String,
        "problem_name": pl.String,
        "pytorch_code": pl.String,
        "generated_code": pl.String,
        "generated_think": pl.String,
        "speedup_used": pl.Float64,
        "speedup_source": pl.String,
        "speedup_convention": pl.String,
        "verification_status": pl.String,
        "verdict_id": pl.String,
        "source_name": pl.String,
        "source_row": pl.Int64,
    }
)


@dataclass(frozen=True)
class TableSpec:
    """Where a table lives in the warehouse and its declared schema. `partition_column` names the column that
    holds a Dagster partition key (rows of one partition are replaced together); None for unpartitioned tables."""

    schema_name: str
    table_name: str
    schema: pl.Schema
    partition_column: str | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.schema_name}.{self.table_name}"


def empty_frame(schema: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def conform(frame: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """Return `frame` with exactly the declared columns, in order, cast to the declared types.

    A missing declared column is an error (a bug in the producer), not something to fill in silently.
    """
    missing = [name for name in schema.names() if name not in frame.columns]
    if missing:
        raise ValueError(f"frame is missing declared columns {missing}; has {frame.columns}")
    return frame.select([pl.col(name).cast(dtype, strict=True) for name, dtype in schema.items()])


# One row per generated structure candidate, kept or not (dice_pipeline/synthesis/instances.py fills it).
STRUCTURE_INSTANCES = pl.Schema(
    {
        "task_id": pl.String,
        "family": pl.String,
        "model_family": pl.String,
        "shape_json": pl.String,
        "pytorch_code": pl.String,  # the catalogue task's reference
        "candidate_index": pl.Int64,
        "job_id": pl.String,
        "generator_backend": pl.String,
        "generator_model": pl.String,
        "generator_settings_json": pl.String,
        "prompt_json": pl.String,
        "finish_reason": pl.String,
        "latency_s": pl.Float64,
        "candidate_code": pl.String,
        "verdict_json": pl.String,
        "verdict_id": pl.String,
        "status": pl.String,
        "speedup": pl.Float64,
        "kept": pl.Boolean,
        "reject_reason": pl.String,
        "reject_message": pl.String,
        "threshold": pl.Float64,
    }
)


# One row per distilled candidate (dice_pipeline/synthesis/distill.py): the structure-synthesis columns, whatever
# the reference tasks were; `family` is the task's family where its source names one.
DISTILLED_PAIRS = STRUCTURE_INSTANCES

# Synthetic operator pairs (dice_pipeline/synthesis/operator_pairs.py): one row per generated instance, then the same
# rows with their verdicts (held-out families are not judged: `verification` says so).
SYNTHETIC_OPERATOR_CANDIDATES = pl.Schema({
    "task_id": pl.String,  # <family>/<op>/<hash of reference and candidate>
    "family": pl.String,
    "op": pl.String,
    "style": pl.String,  # kernel style of the candidate (grid_stride, vectorized, warp_per_row, ...)
    "design_id": pl.String,  # candidates with the same design share their CUDA source byte for byte
    "split": pl.String,  # train | held_out (held-out families never enter CuKe)
    "seed": pl.Int64,
    "instance_index": pl.Int64,
    "params_json": pl.String,  # shapes, dims, constants, pattern
    "pytorch_code": pl.String,  # the reference (KernelBench format)
    "generated_code": pl.String,  # the ModelNew file
    "generator": pl.String,
})

# A verdict's columns, as verified_pairs has them (without the pair's own id and name).
VERDICT_COLUMNS = pl.Schema({k: v for k, v in VERIFIED_PAIRS.items() if k not in ("uuid", "problem_name")})

SYNTHETIC_OPERATOR_PAIRS = pl.Schema({
    **SYNTHETIC_OPERATOR_CANDIDATES,
    "verification": pl.String,  # judged | held_out_not_judged
    "from_verdict_store": pl.Boolean,  # the verdict was reused (the store or the shipped archive), not run here
    **VERDICT_COLUMNS,
})


# --- CuKe (dice_pipeline/cuke): the SFT samples and their rejects, KernelBench decontamination drops, the kernel-infilling
# split and its rejects, and the end-to-end RL task pool. The warehouse prefixes each CuKe table with the
# threshold partition it was built for (warehouse/tables.py).
CUKE_SFT_SAMPLES = pl.Schema(
    {
        "sample_id": pl.String,  # first 16 hex digits of the sha256 of the normalised reference + kernel
        "source": pl.String,
        "source_name": pl.String,
        "source_id": pl.String,
        "source_row": pl.Int64,
        "problem_name": pl.String,
        "threshold": pl.Float64,
        "threshold_key": pl.String,
        "speedup_used": pl.Float64,
        "speedup_source": pl.String,
        "verification_status": pl.String,
        "verdict_id": pl.String,
        "op_family": pl.String,
        "family": pl.String,  # the operator-family catalogue's family ("other" where none covers the reference)
        "difficulty": pl.Int64,
        "difficulty_score": pl.Float64,
        "prompt_messages": pl.String,  # JSON list of chat messages (system + user)
        "prompt": pl.String,  # the messages rendered with the Qwen3-style template, generation prompt open
        "response": pl.String,  # [<think>...</think>\n\n] + the ModelNew file in a python fence
        "has_reasoning": pl.Boolean,
        "pytorch_code": pl.String,
        "generated_code": pl.String,
        "prompt_chars": pl.Int64,
        "response_chars": pl.Int64,
    }
)

CUKE_SFT_REJECTS = pl.Schema(
    {
        "source": pl.String,
        "source_id": pl.String,
        "sample_id": pl.String,  # null where the row was rejected before it had one
        "reason_code": pl.String,
        "message": pl.String,
        "kernelbench_task": pl.String,  # for kernelbench_overlap: the task it matches
        "duplicate_of": pl.String,  # for duplicate: the sample kept instead
    }
)

DECONTAMINATION_DROPS = pl.Schema(
    {
        "row_id": pl.String,
        "kernelbench_task": pl.String,
        "rule": pl.String,
        "jaccard": pl.Float64,
        "containment": pl.Float64,
    }
)

INFILLING_REJECTS = pl.Schema({"row_id": pl.String, "reason_code": pl.String, "message": pl.String})

STAGE1_TASK_SCHEMA = pl.Schema(
    {
        "task_id": pl.String,
        "prompt_messages": pl.String,
        "prompt": pl.String,
        "pytorch_code": pl.String,
        "reference_kernel_code": pl.String,
        "prefix": pl.String,
        "ground_truth_middle": pl.String,
        "suffix": pl.String,
        "difficulty": pl.Int64,
        "source": pl.String,  # the sample's source (concur | structure | synthetic), where the split rows carry it
        "family": pl.String,  # the sample's operator family
    }
)

RL_TASK_POOL = pl.Schema(
    {
        "schedule_position": pl.Int64,  # 0 = first task the RL stage sees (easiest)
        "task_id": pl.String,
        "source": pl.String,  # the task file's path, or the ingestion source of the references
        "file_position": pl.Int64,  # position in the source, before scheduling
        "difficulty": pl.Int64,  # the label the schedule sorts by (0 easiest .. 3 hardest)
        "label_source": pl.String,  # file (the task file's own label) | computed (our difficulty score)
        "computed_difficulty": pl.Int64,
        "computed_difficulty_score": pl.Float64,
        "op_family": pl.String,
        "family": pl.String,  # the operator-family catalogue's family ("other" where none covers the task)
        "pytorch_code": pl.String,
        "extra_json": pl.String,
    }
)


# --- KernelBench evaluation (dice_pipeline/evaluation). `level_key` / `eval_partition_key` hold the Dagster
# partition key of the row ("1"; "<checkpoint>|<level>" for the checkpoint x level partitions).
KERNELBENCH_TASKS = pl.Schema(
    {
        "level_key": pl.String,
        "task_key": pl.String,  # "L1/1_Square_matrix_multiplication_"
        "level": pl.Int64,
        "problem_id": pl.Int64,
        "name": pl.String,
        "code": pl.String,
        "code_sha256": pl.String,
        "known_issues": pl.List(pl.String),  # dice_pipeline.kernelbench.KNOWN_TASK_ISSUES codes; kept, not dropped
        "source": pl.String,  # where the task set was read from
    }
)

KERNELBENCH_BASELINES = pl.Schema(
    {
        "level_key": pl.String,
        "task_key": pl.String,
        "status": pl.String,  # measured | not_executed | runtime_error | timeout | infrastructure_error
        "message": pl.String,
        "eager_ms_gpu": pl.Float64,
        "eager_ms_host": pl.Float64,
        "compile_ms_gpu": pl.Float64,
        "peak_gpu_mb": pl.Float64,
        "input_draw_json": pl.String,
        "gpu_name": pl.String,
        "provenance_json": pl.String,  # host, GPU, driver, torch, timing method, time: where these numbers hold
    }
)

KERNELBENCH_EVAL_RESULTS = pl.Schema(
    {
        "eval_partition_key": pl.String,
        "checkpoint": pl.String,
        "level": pl.Int64,
        "task_key": pl.String,
        "problem_id": pl.Int64,
        "name": pl.String,
        "sample_index": pl.Int64,
        "known_issues": pl.List(pl.String),
        "generator_backend": pl.String,
        "generator_model": pl.String,
        "generation_settings_json": pl.String,
        "finish_reason": pl.String,
        "prompt_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "latency_s": pl.Float64,
        "has_code": pl.Boolean,
        "candidate_code": pl.String,
        "answer_text": pl.String,
        "status": pl.String,  # verdict status, "missing" where the task has no verdict yet
        "executed": pl.Boolean,
        "reason_codes": pl.List(pl.String),
        "flags": pl.List(pl.String),
        "correct_at_1e2": pl.Boolean,  # counted correct at atol=rtol=1e-2 (dice_pipeline.evaluation.metrics)
        "correct_at_1e4": pl.Boolean,
        "speedup": pl.Float64,
        "speedup_gpu": pl.Float64,  # GPU-time convention: what fast_p uses
        "speedup_host": pl.Float64,
        "reference_ms": pl.Float64,
        "candidate_ms": pl.Float64,
        "baseline_status": pl.String,
        "baseline_eager_ms_gpu": pl.Float64,
        "baseline_compile_ms_gpu": pl.Float64,
        # The level's baselines (kernelbench_baselines, measured here) / the verdict's candidate median: a cross-check
        # of the verdict's paired speedup_gpu against the separately measured eager time, and the compile comparison
        "speedup_vs_eager_baseline": pl.Float64,
        "speedup_vs_compile": pl.Float64,
        "verdict_json": pl.String,
        "gpu_name": pl.String,
        "verifier_version": pl.String,
        "reused_verdict": pl.Boolean,  # read back from the evaluation's state directory (a resumed evaluation)
    }
)

KERNELBENCH_EVAL_SANITY = pl.Schema(
    {
        "eval_partition_key": pl.String,
        "check": pl.String,  # reference_as_modelnew | zeros_kernel | known_good
        "subject": pl.String,
        "expected": pl.String,
        "status": pl.String,
        "reason_codes": pl.List(pl.String),
        "flags": pl.List(pl.String),
        "passed": pl.Boolean,
        "asserted": pl.String,  # executed (GPU) | static (no GPU: only what the static checks can tell)
        "summary": pl.String,
    }
)

KERNELBENCH_EVAL_METRICS = pl.Schema(
    {
        "eval_partition_key": pl.String,
        "checkpoint": pl.String,
        "level": pl.Int64,
        "tolerance": pl.String,  # "1e-2" | "1e-4"
        "fast_p_convention": pl.String,  # which speedup fast_p uses ("gpu")
        "executed": pl.Boolean,
        "complete": pl.Boolean,  # every task generated and judged (False: stopped at a deadline)
        "n_tasks": pl.Int64,
        "n_judged": pl.Int64,
        "n_compiled": pl.Int64,
        "n_compile_unknown": pl.Int64,
        "compile_rate": pl.Float64,
        "n_correct": pl.Int64,
        "exec_rate": pl.Float64,
        "fast_0": pl.Float64,
        "fast_0.5": pl.Float64,
        "fast_0.8": pl.Float64,
        "fast_1": pl.Float64,
        "fast_1.5": pl.Float64,
        "fast_2": pl.Float64,
        "fast_0_host": pl.Float64,
        "fast_0.5_host": pl.Float64,
        "fast_0.8_host": pl.Float64,
        "fast_1_host": pl.Float64,
        "fast_1.5_host": pl.Float64,
        "fast_2_host": pl.Float64,
        "geomean_speedup_gpu": pl.Float64,
        "geomean_speedup_host": pl.Float64,
        "n_speedup_measured_gpu": pl.Int64,
        "n_speedup_measured_host": pl.Int64,
        "deceptive_rate": pl.Float64,
        "deceptive_by_reason_json": pl.String,
        "n_flagged_baseline_kernel": pl.Int64,
        "n_not_executed": pl.Int64,
        "n_infrastructure_error": pl.Int64,
        "n_missing": pl.Int64,
        "n_known_issue_tasks": pl.Int64,
        "n_correct_on_known_issue_tasks": pl.Int64,
        "samples_per_task": pl.Int64,
        "pass_at_k_json": pl.String,
    }
)
