"""The speedup threshold and the keep/reject decision at it: one type, one decision function, one reason vocabulary,
shared by the filter (ConCuR pairs), structure synthesis and CuKe (ConCuR, structure and synthetic candidates).

Standard library only: structure synthesis runs on GPU hosts where polars and Dagster are absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from dice_pipeline.verify.verdict import REJECTING_STATUSES

PAPER_THRESHOLD = 2.0

# The reason vocabulary of a decision at a threshold. Every stage that decides at a threshold writes these codes.
KEPT = "kept"
FAILED_VERIFICATION = "failed_verification"
NOT_EXECUTED = "not_executed"
NO_SPEEDUP = "no_speedup"
OVERHEAD_DOMINATED = "overhead_dominated"
BELOW_THRESHOLD = "below_threshold"
THRESHOLD_REASONS = {
    KEPT: "correct (or not judged here, with a recorded speedup) and at or above the threshold",
    FAILED_VERIFICATION: "the verifier rejected the kernel (compile_error, incorrect, deceptive, ...)",
    NOT_EXECUTED: "no GPU ran the kernel (no verdict here, in the store or the shipped archive) and no speedup was "
                  "recorded for it",
    NO_SPEEDUP: "correct, but the verdict carries no speedup to compare with the threshold",
    OVERHEAD_DOMINATED: "correct, but its timing is launch overhead, not kernel work: never kept as faster",
    BELOW_THRESHOLD: "its speedup is below the threshold",
}
# Verdict statuses that let a recorded speedup stand: the verifier found nothing wrong.
PASSING_STATUSES = frozenset({"correct", "not_executed"})
_REJECTING = frozenset(status.value for status in REJECTING_STATUSES)


class ThresholdError(ValueError):
    """A threshold that is not a positive finite number, or a partition key that is not the canonical spelling.
    `canonical` is the key it should have been, where it names a valid threshold at all."""

    def __init__(self, message: str, canonical: str | None = None):
        super().__init__(message)
        self.canonical = canonical


@dataclass(frozen=True)
class SpeedupThreshold:
    """A speedup threshold, named by its canonical key: one spelling per number ("2.0", never "2" or "2.00"), the
    key of its Dagster partition and of its rows in the warehouse. Build with `parse` (any spelling) or
    `from_partition_key` (the canonical one only)."""

    key: str

    @classmethod
    def parse(cls, text: str | float | SpeedupThreshold, allow_zero: bool = False) -> SpeedupThreshold:
        """Any spelling of a positive finite number: "2", "2.00" and 2.0 all give the threshold keyed "2.0".
        `allow_zero`: 0 is a floor too ("any speedup": distillation keeps every correct candidate), never a
        partition."""
        if isinstance(text, SpeedupThreshold):
            return text
        raw = str(text).strip()
        try:
            number = Decimal(raw)
        except InvalidOperation:
            raise ThresholdError(f"speedup threshold {raw!r} is not a number") from None
        if not number.is_finite() or number < 0 or (number == 0 and not allow_zero):
            raise ThresholdError(f"speedup threshold {raw!r} must be a positive finite number (e.g. 2.0)")
        key = format(number.normalize(), "f")
        return cls(key if "." in key else key + ".0")

    @classmethod
    def from_partition_key(cls, key: str) -> SpeedupThreshold:
        """The threshold a partition key names; a non-canonical spelling is refused with the canonical one named."""
        try:
            threshold = cls.parse(key)
        except ThresholdError as exc:
            raise ThresholdError(f"threshold partition key {key!r} is not valid: {exc}") from None
        if threshold.key != key:
            raise ThresholdError(f"threshold partition key {key!r} is not canonical; use {threshold.key!r} instead",
                                 canonical=threshold.key)
        return threshold

    @property
    def value(self) -> float:
        return float(self.key)

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class ThresholdDecision:
    kept: bool
    reason_code: str  # one of THRESHOLD_REASONS
    message: str


def decide_at_threshold(threshold: SpeedupThreshold, *, status: str | None, speedup: float | None, measured: bool,
                        flags: Iterable[str] = (), detail: str = "") -> ThresholdDecision:
    """Keep or reject one candidate at `threshold`. `status`: its verdict's status (None: no verdict); `speedup`:
    the speedup over eager PyTorch it is judged by, `measured` by our verifier (else the figure its source
    recorded); `flags`: the verdict's flags; `detail`: what the verdict says, for the message.

    Rejected by the verifier -> failed_verification; no speedup -> no_speedup if it ran correctly, else
    not_executed; a measured timing that is launch overhead -> overhead_dominated; then kept iff speedup >= the
    threshold (inclusive)."""
    suffix = f": {detail}" if detail else ""
    if status in _REJECTING:
        return ThresholdDecision(False, FAILED_VERIFICATION, f"verification_status={status}{suffix}")
    if speedup is None or not math.isfinite(speedup):
        if status == "correct":
            return ThresholdDecision(False, NO_SPEEDUP, "correct, but the verdict carries no speedup" + suffix)
        return ThresholdDecision(False, NOT_EXECUTED, f"not executed (status {status or 'none'}) and no speedup "
                                                      f"recorded, so not kept as faster{suffix}")
    if status not in PASSING_STATUSES:  # no usable verdict (an infrastructure error): never kept on trust
        return ThresholdDecision(False, NOT_EXECUTED, f"no usable verdict (status {status or 'none'}){suffix}")
    if measured and OVERHEAD_DOMINATED in set(flags or ()):
        return ThresholdDecision(False, OVERHEAD_DOMINATED,
                                 f"correct at {speedup:.3f}x, but its timing is launch overhead, not kernel work")
    if speedup >= threshold.value:
        return ThresholdDecision(True, KEPT, f"speedup {speedup:.3f} >= threshold {threshold.key}")
    return ThresholdDecision(False, BELOW_THRESHOLD, f"speedup {speedup:.3f} < threshold {threshold.key}")
