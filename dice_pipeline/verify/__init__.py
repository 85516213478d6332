"""Kernel verification: judge a candidate CUDA `ModelNew` against its KernelBench-format PyTorch reference.

Importable with the standard library alone; torch is imported only inside the isolated worker processes.
"""

from dice_pipeline.verify.verdict import (
    REJECTING_STATUSES,
    VERIFIER_VERSION,
    Reason,
    Status,
    TimingStats,
    Verdict,
)

__all__ = ["REJECTING_STATUSES", "VERIFIER_VERSION", "Reason", "Status", "TimingStats", "Verdict"]
