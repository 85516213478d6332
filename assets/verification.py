"""Stage 2, GPU verification: judge every ingested pair with the KernelVerifier resource.

Runs under the `gpu` pool; the verifier itself shards work across the GPUs it is given and never runs candidate
code in this process. Without a GPU it still runs the static checks (and compiles where it can) and marks
execution `not_executed`, never a fabricated verdict.
"""

import hashlib

import dagster as dg
import polars as pl

from assets import keys
from assets.metadata import counts_markdown, histogram_markdown, schema_check, table_metadata, versioned_output
from dice_pipeline.resources import KernelVerifier
from dice_pipeline.schemas import VERIFIED_PAIRS
from dice_pipeline.verified import verdicts_frame


@dg.asset(
    key=keys.VERIFIED_PAIRS,
    ins={"concur_pairs": dg.AssetIn(key=keys.CONCUR_PAIRS)},
    group_name=keys.GROUP_VERIFY,
    kinds={"cuda", "pytorch", "duckdb"},
    code_version="1",
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(
            "one_verdict_per_pair",
            asset=keys.VERIFIED_PAIRS,
            blocking=True,
            description="rows conserved: one verdict per ingested pair",
        ),
        dg.AssetCheckSpec("schema_matches", asset=keys.VERIFIED_PAIRS),
    ],
)
def verified_pairs(context: dg.AssetExecutionContext, concur_pairs: pl.DataFrame, verifier: KernelVerifier):
    """Compile each candidate, check it against its PyTorch reference, time both, and reject deceptive kernels.
    One row per ingested pair with the verdict's status, reasons, measured speedup and provenance."""
    jobs = [
        (row["uuid"], row["pytorch_code"], row["generated_code"])
        for row in concur_pairs.select("uuid", "pytorch_code", "generated_code").iter_rows(named=True)
    ]
    context.log.info(f"verifying {len(jobs)} pairs ({verifier.describe()})")
    verdicts, run_metadata = verifier.verify_for_asset(context, jobs)
    frame = verdicts_frame(concur_pairs, verdicts)
    fingerprint = "\n".join(
        f"{u}:{s}:{'' if x is None else round(x, 2)}"
        for u, s, x in frame.select("uuid", "status", "measured_speedup").iter_rows()
    )
    yield versioned_output(
        frame,
        hashlib.sha256(fingerprint.encode()).hexdigest()[:16],
        metadata={
            **run_metadata,
            **table_metadata(
                frame, VERIFIED_PAIRS, ["uuid", "problem_name", "status", "measured_speedup", "reason_codes"]
            ),
            "executed": int(frame["executed"].sum()),
            "gpu": ", ".join(sorted({g for g in frame["gpu_name"].to_list() if g})) or "none",
            "verdicts_by_status": dg.MetadataValue.md(counts_markdown(frame, "status", "status")),
            "measured_speedup_histogram": dg.MetadataValue.md(
                histogram_markdown(frame["measured_speedup"].to_list(), "measured speedup over eager")
            ),
        },
    )
    yield dg.AssetCheckResult(
        check_name="one_verdict_per_pair",
        passed=frame.height == concur_pairs.height and frame["uuid"].n_unique() == frame.height,
        metadata={"pairs": concur_pairs.height, "verdicts": frame.height},
    )
    yield schema_check("schema_matches", keys.VERIFIED_PAIRS, frame, VERIFIED_PAIRS)
