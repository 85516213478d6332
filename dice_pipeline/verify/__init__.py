"""Kernel verification: judge a candidate CUDA `ModelNew` against its KernelBench-format PyTorch reference.

Importable with the standard library alone; torch is imported only inside the isolated worker processes.
"""

from dice_pipeline.verify.api import (
    GpuInfo,
    compile_only,
    gpu_inventory,
    measure_references,
    verify_batch,
    verify_candidate,
)
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.static_checks import StaticReport, check_candidate_source
from dice_pipeline.verify.verdict import (
    REJECTING_STATUSES,
    VERIFIER_VERSION,
    Reason,
    Status,
    TimingStats,
    Verdict,
)

__all__ = [
    "REJECTING_STATUSES", "VERIFIER_VERSION", "GpuInfo", "Reason", "StaticReport", "Status", "TimingStats", "Verdict",
    "VerifyConfig", "VerifyJob", "check_candidate_source", "compile_only", "gpu_inventory", "measure_references",
    "verify_batch",
    "verify_candidate",
]
