"""How the synthetic operator pairs are judged, in one place for the asset (any host) and the GPU script that fills
the shipped verdict archive, so both compute the same verdict-store keys. Standard library only.

The settings that enter a verdict's key differ from the verifier's defaults only in timing: 20-40 timed pairs
within half a second of timed calls, to a 2% precision, after a warm-up of at most 0.1 s (the GPU is kept busy by
the other lanes; the defaults take 100-1000 pairs to 1% within 5 s). A keep/reject decision at a 2.0x threshold
needs the speedup to a few percent, not to one; on an H100 the timed sections, which run one at a time, were the
bound on judging ~2,000 pairs in one GPU lease. The correctness trials (5, fresh inputs each, KernelBench's 1e-2
and 1e-4 both recorded) are the defaults.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dice_pipeline.synthesis.operators.catalogue import GENERATOR_VERSION
from dice_pipeline.synthesis.operators.common import OperatorInstance

SYNTHETIC_VERIFY_OVERRIDES = {
    "timing_samples": 20,
    "timing_max_samples": 40,
    "timing_budget_s": 0.5,
    "timing_target_precision": 0.02,
    "timing_round_samples": 20,
    "warmup_seconds": 0.1,
}

ARCHIVE_DIR = Path(__file__).resolve().parent / "verdicts"


def shipped_verdict_archives() -> tuple[str, ...]:
    """The packed verdict stores shipped with the project (filled on a GPU host by
    benchmarks/synthetic_verify_gpu.py), newest name last."""
    return tuple(str(path) for path in sorted(ARCHIVE_DIR.glob("*.jsonl.gz")))


def synthetic_verify_config(base):
    """`base` (a VerifyConfig: the verifier resource's, or the GPU script's) with the synthetic pairs' timing and
    the shipped archives added to its lookups."""
    archives = tuple(dict.fromkeys((*base.verdict_archives, *shipped_verdict_archives())))
    return replace(base, **SYNTHETIC_VERIFY_OVERRIDES, verdict_archives=archives)


def verification_jobs(instances: list[OperatorInstance], include_held_out: bool = False
                      ) -> list[tuple[str, str, str]]:
    """(job id, reference, candidate) for every instance to judge: the training split, and the held-out families
    too when asked (they never enter CuKe, so judging them only serves evaluation)."""
    return [(i.task_id, i.reference_code, i.candidate_code) for i in instances
            if include_held_out or i.split == "train"]


__all__ = ["ARCHIVE_DIR", "GENERATOR_VERSION", "SYNTHETIC_VERIFY_OVERRIDES", "shipped_verdict_archives",
           "synthetic_verify_config", "verification_jobs"]
