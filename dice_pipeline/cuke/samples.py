"""CuKe SFT samples: the union of speedup-filtered ConCuR pairs, kept structure instances and judged synthetic
operator pairs, each as the KernelBench one-shot prompt in the Qwen3-style chat template plus the `ModelNew` file
as the answer (optionally after its reasoning trace), with lineage, op family, catalogue family and difficulty;
deduplicated, decontaminated against KernelBench, and without the held-out families. Every candidate ends as a
sample or a reject with a reason code (candidates == samples + rejects).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from dice_pipeline.cuke.decontaminate import DECONTAMINATION_DROPS, KernelBenchIndex, decontaminate
from dice_pipeline.cuke.difficulty import score_difficulty
from dice_pipeline.cuke.normalize import content_hash, normalized_or_collapsed
from dice_pipeline.prompts import extract_code_block, format_kernel_response, kernel_generation_messages, render_chat
from dice_pipeline.schemas import CUKE_SFT_REJECTS, CUKE_SFT_SAMPLES  # declared there, used from here too
from dice_pipeline.thresholds import THRESHOLD_REASONS, SpeedupThreshold, decide_at_threshold

SOURCE_CONCUR = "concur"
SOURCE_STRUCTURE = "structure"
SOURCE_SYNTHETIC = "synthetic"

# The common shape both sources are mapped to before samples are built.
SFT_CANDIDATES = pl.Schema(
    {
        "source": pl.String,  # concur | structure | synthetic
        "source_name": pl.String,  # where the rows came from (hf:lkongam/ConCuR, embedded, generator name, ...)
        "source_id": pl.String,  # ConCuR uuid or structure candidate id
        "source_row": pl.Int64,
        "problem_name": pl.String,
        "pytorch_code": pl.String,
        "generated_code": pl.String,
        "generated_think": pl.String,
        "threshold": pl.Float64,
        "threshold_key": pl.String,
        "speedup_used": pl.Float64,
        "speedup_source": pl.String,  # measured | recorded
        "verification_status": pl.String,  # verifier Status value; not_executed where no GPU judged it
        "verdict_id": pl.String,
        "flags": pl.List(pl.String),  # the verdict's flags where the source carries them (synthetic pairs), else []
        "op_family": pl.String,  # the source's own family where it has one (structure catalogue), else null
        "kept_upstream": pl.Boolean,  # False for structure candidates the synthesis stage did not keep
        # the operator-family catalogue's family (synthetic rows: the generator's; else operator_family())
        "family": pl.String,
        # a reason decided by the source's own stage (a synthetic pair of a held-out family), or null
        "upstream_reason": pl.String,
        "upstream_message": pl.String,
    }
)

# Reason codes a candidate can be rejected with: the threshold decision's (dice_pipeline.thresholds), and CuKe's own.
SFT_REJECT_REASONS = {
    **{code: meaning for code, meaning in THRESHOLD_REASONS.items() if code != "kept"},
    "not_kept_by_synthesis": "the structure-synthesis stage did not keep this candidate",
    "empty_code": "the reference or the kernel is empty",
    "no_modelnew": "the kernel file defines no ModelNew",
    "duplicate": "the same reference and kernel (after normalisation) is already a sample",
    "kernelbench_overlap": "the reference matches a KernelBench evaluation task",
    "held_out_family": "the reference belongs to a family held out of training (kept for evaluation)",
}

# Column names a structure-instances table may use for each candidate field (first one present wins).
STRUCTURE_COLUMN_ALIASES = {
    "source_id": ("job_id", "candidate_id", "instance_id", "uuid"),
    "problem_name": ("task_id", "task_name", "problem_name"),
    "pytorch_code": ("pytorch_code", "reference_code"),
    "generated_code": ("candidate_code", "generated_code", "kernel_code"),
    "generated_think": ("generated_think", "reasoning"),
    "speedup_used": ("speedup_used", "measured_speedup", "speedup"),
    "verification_status": ("verification_status", "status"),
    "verdict_id": ("verdict_id",),
    "op_family": ("op_family", "family"),
    "kept_upstream": ("kept",),
    "source_name": ("generator_backend", "generator", "source_name"),
}


def candidates_from_filtered_pairs(pairs: pl.DataFrame) -> pl.DataFrame:
    """Map `speedup_filtered_pairs` rows (dice_pipeline.schemas.SPEEDUP_FILTERED_PAIRS) to SFT candidates."""
    if pairs.height == 0:
        return pl.DataFrame(schema=SFT_CANDIDATES)
    return pairs.select(
        pl.lit(SOURCE_CONCUR).alias("source"),
        pl.col("source_name"),
        pl.col("uuid").cast(pl.String).alias("source_id"),
        pl.col("source_row"),
        pl.col("problem_name"),
        pl.col("pytorch_code"),
        pl.col("generated_code"),
        pl.col("generated_think"),
        pl.col("threshold"),
        pl.col("threshold_key"),
        pl.col("speedup_used"),
        pl.col("speedup_source"),
        pl.col("verification_status"),
        pl.col("verdict_id"),
        pl.lit([], dtype=pl.List(pl.String)).alias("flags"),  # the filter decided on them already
        pl.lit(None, dtype=pl.String).alias("op_family"),
        pl.lit(True).alias("kept_upstream"),
        pl.lit(None, dtype=pl.String).alias("family"),
        pl.lit(None, dtype=pl.String).alias("upstream_reason"),
        pl.lit(None, dtype=pl.String).alias("upstream_message"),
    ).cast(dict(SFT_CANDIDATES))


def candidates_from_structure_instances(instances: pl.DataFrame, threshold: SpeedupThreshold | float) -> pl.DataFrame:
    """Map a structure-instances table (one row per generated candidate, kept or not) to SFT candidates, reading
    each field from the first present column in STRUCTURE_COLUMN_ALIASES. Speedups there are measured."""
    if instances.height == 0:
        return pl.DataFrame(schema=SFT_CANDIDATES)
    threshold = SpeedupThreshold.parse(threshold, allow_zero=True)
    columns = {}
    for field_name, aliases in STRUCTURE_COLUMN_ALIASES.items():
        present = next((alias for alias in aliases if alias in instances.columns), None)
        if present is None and field_name in ("source_id", "pytorch_code", "generated_code"):
            raise ValueError(f"structure instances need one of {aliases}; have {instances.columns}")
        columns[field_name] = pl.col(present) if present else pl.lit(None)
    if "kept" not in instances.columns:
        columns["kept_upstream"] = pl.lit(True)
    frame = instances.with_row_index("source_row").select(
        pl.lit(SOURCE_STRUCTURE).alias("source"),
        columns["source_name"].cast(pl.String).fill_null("structure_synthesis").alias("source_name"),
        columns["source_id"].cast(pl.String).alias("source_id"),
        pl.col("source_row").cast(pl.Int64),
        columns["problem_name"].cast(pl.String).alias("problem_name"),
        columns["pytorch_code"].cast(pl.String).alias("pytorch_code"),
        columns["generated_code"].cast(pl.String).alias("generated_code"),
        columns["generated_think"].cast(pl.String).alias("generated_think"),
        pl.lit(threshold.value, dtype=pl.Float64).alias("threshold"),
        pl.lit(threshold.key).alias("threshold_key"),
        columns["speedup_used"].cast(pl.Float64).alias("speedup_used"),
        pl.lit("measured").alias("speedup_source"),
        columns["verification_status"].cast(pl.String).alias("verification_status"),
        columns["verdict_id"].cast(pl.String).alias("verdict_id"),
        pl.lit([], dtype=pl.List(pl.String)).alias("flags"),  # synthesis decided on them already
        columns["op_family"].cast(pl.String).alias("op_family"),
        columns["kept_upstream"].cast(pl.Boolean).alias("kept_upstream"),
        pl.lit(None, dtype=pl.String).alias("family"),
        pl.lit(None, dtype=pl.String).alias("upstream_reason"),
        pl.lit(None, dtype=pl.String).alias("upstream_message"),
    )
    return frame.cast(dict(SFT_CANDIDATES))


def candidates_from_synthetic_pairs(pairs: pl.DataFrame) -> pl.DataFrame:
    """Map `synthetic_operator_pairs` rows (schemas.SYNTHETIC_OPERATOR_PAIRS) to SFT candidates. Their speedups are
    measured (here or on the GPU host whose verdicts ship with the project) and decided at the threshold like any
    other candidate's (a pair with no GPU verdict is `not_executed`); a held-out row carries its reason from here."""
    if pairs.height == 0:
        return pl.DataFrame(schema=SFT_CANDIDATES)
    held_out = pl.col("split") == "held_out"
    return pairs.with_row_index("source_row").select(
        pl.lit(SOURCE_SYNTHETIC).alias("source"),
        pl.col("generator").alias("source_name"),
        pl.col("task_id").alias("source_id"),
        pl.col("source_row").cast(pl.Int64),
        pl.col("task_id").alias("problem_name"),
        pl.col("pytorch_code"),
        pl.col("generated_code"),
        pl.lit(None, dtype=pl.String).alias("generated_think"),
        pl.lit(None, dtype=pl.Float64).alias("threshold"),
        pl.lit(None, dtype=pl.String).alias("threshold_key"),
        # a speedup is only ours to use where a GPU executed the pair
        pl.when(pl.col("executed").fill_null(False)).then(pl.col("measured_speedup")).alias("speedup_used"),
        pl.lit("measured").alias("speedup_source"),
        pl.col("status").fill_null("not_judged").alias("verification_status"),
        pl.col("verdict_id"),
        pl.col("flags").fill_null([]),
        pl.col("family").alias("op_family"),
        pl.lit(True).alias("kept_upstream"),
        pl.col("family"),
        pl.when(held_out).then(pl.lit("held_out_family")).alias("upstream_reason"),
        pl.when(held_out).then(pl.format("family {} is held out of training", "family")).alias("upstream_message"),
    ).cast(dict(SFT_CANDIDATES))


@dataclass
class SftBuild:
    samples: pl.DataFrame  # CUKE_SFT_SAMPLES
    rejects: pl.DataFrame  # CUKE_SFT_REJECTS
    decontamination_drops: pl.DataFrame  # decontaminate.DECONTAMINATION_DROPS, with scores per dropped row
    counts: dict = field(default_factory=dict)
    candidates: pl.DataFrame | None = None  # SFT_CANDIDATES: every candidate, with its family


def _upstream_reject(candidate: dict) -> tuple[str, str] | None:
    if candidate["upstream_reason"] is not None:
        return candidate["upstream_reason"], candidate["upstream_message"] or candidate["upstream_reason"]
    if candidate["kept_upstream"] is False:
        return "not_kept_by_synthesis", "kept=False in the structure-instances table"
    status = candidate["verification_status"]
    decision = decide_at_threshold(
        SpeedupThreshold.parse(candidate["threshold_key"], allow_zero=True),
        status=None if status == "not_judged" else status, speedup=candidate["speedup_used"],
        measured=candidate["speedup_source"] == "measured", flags=candidate["flags"] or ())
    if not decision.kept:
        return decision.reason_code, decision.message
    pytorch_code, generated_code = candidate["pytorch_code"], candidate["generated_code"]
    if not (pytorch_code or "").strip() or not (generated_code or "").strip():
        return "empty_code", "pytorch_code or generated_code is empty"
    return None


def _kernel_file(generated_code: str) -> str:
    """The kernel as a bare file: a source that wrapped it in a markdown fence gets it unwrapped."""
    if generated_code.lstrip().startswith("```"):
        return extract_code_block(generated_code) or generated_code
    return generated_code


def build_sft_samples(
    filtered_pairs: pl.DataFrame | None,
    structure_instances: pl.DataFrame | None,
    threshold: SpeedupThreshold | float,
    kernelbench_index: KernelBenchIndex | None = None,
    include_reasoning: bool = True,
    enable_thinking: bool | None = None,
    structure_threshold: SpeedupThreshold | float | None = None,
    synthetic_pairs: pl.DataFrame | None = None,
    held_out_families: tuple[str, ...] = (),
) -> SftBuild:
    """Build CuKe SFT samples from the speedup-filtered pairs and the structure instances at `threshold`.

    Candidates failing verification, below the threshold, not kept by synthesis, empty or without `ModelNew` are
    rejected; duplicates (same normalised reference and kernel) keep the fastest copy; with `kernelbench_index`,
    references matching a KernelBench task are dropped with the task named. `include_reasoning` puts a source's
    `generated_think` before the answer as `<think>...</think>`; `enable_thinking` is passed to the template for
    the prompt (False pre-fills an empty think block, Qwen3's no-thinking mode). `structure_threshold` is the
    speedup structure instances must reach (the paper keeps them when "correct and faster", i.e. > 1.0, whatever
    the ConCuR threshold); None applies `threshold` to them too. `synthetic_pairs` (judged synthetic operator pairs)
    are held to `threshold` like ConCuR pairs. A candidate of any source whose reference belongs to one of
    `held_out_families` (by `operators.operator_family`; a synthetic row by its generator's split) is rejected as
    `held_out_family`, so those families never enter training."""
    from dice_pipeline.synthesis.operators import operator_family

    threshold = SpeedupThreshold.parse(threshold)
    frames = []
    if filtered_pairs is not None:
        frames.append(candidates_from_filtered_pairs(filtered_pairs))
    if structure_instances is not None:
        structure_min = threshold if structure_threshold is None else structure_threshold
        frames.append(candidates_from_structure_instances(structure_instances, structure_min))
    if synthetic_pairs is not None:
        frames.append(candidates_from_synthetic_pairs(synthetic_pairs).with_columns(
            pl.lit(threshold.value, dtype=pl.Float64).alias("threshold"),
            pl.lit(threshold.key).alias("threshold_key")))
    candidates = pl.concat(frames) if frames else pl.DataFrame(schema=SFT_CANDIDATES)
    # Every row's catalogue family: the generator's own for synthetic rows, else what its reference computes
    # (in this thread: ast.parse from polars' worker threads trips CPython 3.11's AST recursion bookkeeping).
    families = [family if family is not None else (operator_family(code or "") or "other")
                for family, code in zip(candidates["family"].to_list(), candidates["pytorch_code"].to_list())]
    candidates = candidates.with_columns(pl.Series("family", families, dtype=pl.String))
    # Fastest first, so that of duplicate kernels the fastest measurement is the one kept (stable for ties).
    candidates = candidates.sort("speedup_used", descending=True, nulls_last=True, maintain_order=True)

    rejects: list[dict] = []
    prepared: list[dict] = []
    seen: dict[str, str] = {}

    def reject(candidate: dict, code: str, message: str, sample_id=None, task=None, duplicate_of=None) -> None:
        rejects.append(
            {
                "source": candidate["source"],
                "source_id": candidate["source_id"],
                "sample_id": sample_id,
                "reason_code": code,
                "message": message,
                "kernelbench_task": task,
                "duplicate_of": duplicate_of,
            }
        )

    held_out = set(held_out_families)
    for candidate in candidates.iter_rows(named=True):
        problem = _upstream_reject(candidate)
        if problem is None and candidate["family"] in held_out:
            problem = "held_out_family", f"family {candidate['family']} is held out of training"
        if problem is not None:
            reject(candidate, *problem)
            continue
        kernel = _kernel_file(candidate["generated_code"])
        if "ModelNew" not in kernel:
            reject(candidate, "no_modelnew", "the kernel file never mentions ModelNew")
            continue
        reference_key, _ = normalized_or_collapsed(candidate["pytorch_code"], rename=False)
        kernel_key, _ = normalized_or_collapsed(kernel, rename=False)
        sample_id = content_hash(reference_key, kernel_key)[:16]
        if sample_id in seen:
            reject(candidate, "duplicate", "same normalised reference and kernel", sample_id, duplicate_of=sample_id)
            continue
        seen[sample_id] = candidate["source_id"]
        prepared.append({**candidate, "generated_code": kernel, "sample_id": sample_id})

    drops = pl.DataFrame(schema=DECONTAMINATION_DROPS)
    if kernelbench_index is not None and prepared:
        frame = pl.DataFrame(prepared, schema={**SFT_CANDIDATES, "sample_id": pl.String})
        clean, drops = decontaminate(frame, kernelbench_index, code_column="pytorch_code", id_column="sample_id")
        dropped = {row["row_id"]: row for row in drops.iter_rows(named=True)}
        for candidate in prepared:
            match = dropped.get(candidate["sample_id"])
            if match is not None:
                message = (
                    f"matches {match['kernelbench_task']} by {match['rule']} "
                    f"(jaccard {match['jaccard']:.2f}, containment {match['containment']:.2f})"
                )
                reject(
                    candidate, "kernelbench_overlap", message, candidate["sample_id"], task=match["kernelbench_task"]
                )
        prepared = [c for c in prepared if c["sample_id"] not in dropped]

    samples = pl.DataFrame([_sample(c, include_reasoning, enable_thinking) for c in prepared], schema=CUKE_SFT_SAMPLES)
    reject_frame = pl.DataFrame(rejects, schema=CUKE_SFT_REJECTS)
    if samples.height + reject_frame.height != candidates.height:
        raise AssertionError(
            f"rows not conserved: {candidates.height} candidates -> "
            f"{samples.height} samples + {reject_frame.height} rejects"
        )
    reasons = Counter(reject_frame["reason_code"].to_list())
    counts = {
        "candidates": candidates.height,
        "candidates_by_source": dict(Counter(candidates["source"].to_list())),
        "samples": samples.height,
        "samples_by_source": dict(Counter(samples["source"].to_list())),
        "samples_by_family": dict(Counter(samples["family"].to_list())),
        "rejected_by_reason": dict(reasons),
        "duplicates_dropped": reasons.get("duplicate", 0),
        "decontaminated": reasons.get("kernelbench_overlap", 0),
        "not_executed": int((samples["verification_status"] == "not_executed").sum()),
        "threshold": threshold.value,
    }
    return SftBuild(samples=samples, rejects=reject_frame, decontamination_drops=drops, counts=counts,
                    candidates=candidates)


def _sample(candidate: dict, include_reasoning: bool, enable_thinking: bool | None) -> dict:
    messages = kernel_generation_messages(candidate["pytorch_code"])
    prompt = render_chat(messages, add_generation_prompt=True, enable_thinking=enable_thinking)
    reasoning = candidate["generated_think"] if include_reasoning else None
    has_reasoning = bool(reasoning and reasoning.strip())
    response = format_kernel_response(candidate["generated_code"], reasoning if has_reasoning else None)
    difficulty = score_difficulty(candidate["pytorch_code"])
    return {
        "sample_id": candidate["sample_id"],
        "source": candidate["source"],
        "source_name": candidate["source_name"],
        "source_id": candidate["source_id"],
        "source_row": candidate["source_row"],
        "problem_name": candidate["problem_name"],
        "threshold": candidate["threshold"],
        "threshold_key": candidate["threshold_key"],
        "speedup_used": candidate["speedup_used"],
        "speedup_source": candidate["speedup_source"],
        "verification_status": candidate["verification_status"],
        "verdict_id": candidate["verdict_id"],
        "op_family": candidate["op_family"] or difficulty.op_family,
        "family": candidate["family"],
        "difficulty": difficulty.label,
        "difficulty_score": difficulty.score,
        "prompt_messages": json.dumps(messages),
        "prompt": prompt,
        "response": response,
        "has_reasoning": has_reasoning,
        "pytorch_code": candidate["pytorch_code"],
        "generated_code": candidate["generated_code"],
        "prompt_chars": len(prompt),
        "response_chars": len(response),
    }


__all__ = [
    "CUKE_SFT_REJECTS",
    "CUKE_SFT_SAMPLES",
    "SFT_CANDIDATES",
    "SFT_REJECT_REASONS",
    "STRUCTURE_COLUMN_ALIASES",
    "SftBuild",
    "build_sft_samples",
    "candidates_from_filtered_pairs",
    "candidates_from_structure_instances",
    "candidates_from_synthetic_pairs",
]
