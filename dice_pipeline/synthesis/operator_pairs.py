"""Library side of the synthetic operator assets: the generated instances as a table, their verdicts joined on,
and the per-family report (generated, judged, by status, fast enough for a threshold). Every instance is a row,
judged or not, and a held-out row says why it was not judged.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from dice_pipeline.schemas import SYNTHETIC_OPERATOR_CANDIDATES, SYNTHETIC_OPERATOR_PAIRS, VERDICT_COLUMNS
from dice_pipeline.synthesis.operators import GENERATOR_VERSION, SPLIT_HELD_OUT, OperatorInstance
from dice_pipeline.verified import verdicts_frame
from dice_pipeline.verify.verdict import Verdict

SYNTHETIC_SOURCE = "synthetic"
GENERATOR_NAME = f"operator_families:{GENERATOR_VERSION}"

# Why a row carries no verdict (`verification` column); judged rows say "judged".
JUDGED = "judged"
NOT_JUDGED_HELD_OUT = "held_out_not_judged"


def candidates_frame(instances: Sequence[OperatorInstance]) -> pl.DataFrame:
    rows = [{**i.as_row(), "generator": GENERATOR_NAME} for i in instances]
    return pl.DataFrame(rows, schema=SYNTHETIC_OPERATOR_CANDIDATES) if rows \
        else pl.DataFrame(schema=SYNTHETIC_OPERATOR_CANDIDATES)


def pairs_frame(candidates: pl.DataFrame, verdicts: dict[str, Verdict]) -> pl.DataFrame:
    """Every candidate row with its verdict (`verdicts` by task id); rows without one must be held out."""
    judged = candidates.filter(pl.col("task_id").is_in(list(verdicts)))
    missing = candidates.filter(~pl.col("task_id").is_in(list(verdicts)) & (pl.col("split") != SPLIT_HELD_OUT))
    if missing.height:
        raise ValueError(f"{missing.height} training-split candidates have no verdict (e.g. {missing['task_id'][0]})")
    frames = []
    if judged.height:
        keyed = judged.select(pl.col("task_id").alias("uuid"), pl.col("task_id").alias("problem_name"))
        verdict_rows = verdicts_frame(keyed, [verdicts[t] for t in judged["task_id"]]).select(
            pl.col("uuid").alias("task_id"), *VERDICT_COLUMNS.names())
        stored = [bool((verdicts[t].provenance or {}).get("from_verdict_store")) for t in judged["task_id"]]
        frames.append(judged.join(verdict_rows, on="task_id", how="left").with_columns(
            pl.lit(JUDGED).alias("verification"), pl.Series("from_verdict_store", stored, dtype=pl.Boolean)))
    held = candidates.filter(~pl.col("task_id").is_in(list(verdicts)))
    if held.height:
        frames.append(held.with_columns(pl.lit(NOT_JUDGED_HELD_OUT).alias("verification"),
                                        pl.lit(None, dtype=pl.Boolean).alias("from_verdict_store")))
    if not frames:
        return pl.DataFrame(schema=SYNTHETIC_OPERATOR_PAIRS)
    combined = pl.concat(frames, how="diagonal_relaxed")
    order = {task: i for i, task in enumerate(candidates["task_id"])}
    return (combined.with_columns(pl.col("task_id").replace_strict(order, return_dtype=pl.Int64).alias("_order"))
            .sort("_order").drop("_order").select(
                [pl.col(c).cast(t) if c in combined.columns else pl.lit(None, dtype=t).alias(c)
                 for c, t in SYNTHETIC_OPERATOR_PAIRS.items()]))


def family_report(pairs: pl.DataFrame, threshold: float = 2.0) -> pl.DataFrame:
    """One row a family: instances, how many were judged and how (status counts), the correct ones, and those
    at or above `threshold` (overhead-dominated timings not counted), with the median speedup."""
    overhead = pl.col("flags").list.contains("overhead_dominated").fill_null(False)
    correct = pl.col("status") == "correct"
    return (pairs.group_by("family", "split").agg(
        pl.len().alias("instances"),
        (pl.col("verification") == JUDGED).sum().alias("judged"),
        pl.col("executed").fill_null(False).sum().alias("executed"),
        correct.sum().alias("correct"),
        (pl.col("status").is_in(["incorrect", "deceptive"])).sum().alias("incorrect_or_deceptive"),
        (pl.col("status").is_in(["compile_error", "runtime_error", "timeout", "infrastructure_error"])).sum()
        .alias("failed_to_run"),
        (pl.col("status") == "not_executed").sum().alias("not_executed"),
        (correct & ~overhead & (pl.col("measured_speedup") >= threshold)).sum().alias("at_or_above_threshold"),
        pl.col("measured_speedup").filter(correct).median().alias("median_speedup"),
    ).sort("split", "family", descending=[True, False]))


__all__ = ["GENERATOR_NAME", "JUDGED", "NOT_JUDGED_HELD_OUT", "SYNTHETIC_OPERATOR_CANDIDATES",
           "SYNTHETIC_OPERATOR_PAIRS", "SYNTHETIC_SOURCE", "candidates_frame", "family_report", "pairs_frame"]
