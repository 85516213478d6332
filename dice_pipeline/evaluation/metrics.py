"""KernelBench metrics of one evaluation (one checkpoint, one level) from verifier verdicts, at both correctness
tolerances and with the timing convention named: compile rate, Exec, fast_p (strictly greater than p, over ALL tasks
of the level), geometric-mean speedup over correct kernels, deceptive rate by reason, pass@k. Standard library only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dice_pipeline.kernelbench import FAST_P_THRESHOLDS
from dice_pipeline.verify.verdict import Status, Verdict

TOLERANCES = ("1e-2", "1e-4")  # 1e-2: DICE / KernelBench v0.1; 1e-4: KernelBench's current fp32 policy
CONVENTIONS = ("gpu", "host")  # Verdict.speedup_gpu (KernelBench / do_bench) and Verdict.speedup_host
FAST_P_CONVENTION = "gpu"  # what fast_p and the geomean use unless told otherwise
INFRASTRUCTURE_ERROR = "infrastructure_error"  # Status.INFRASTRUCTURE_ERROR from verifier 0.3 on
# The correctness-stage rejection that a looser tolerance can undo; every other reason is not about tolerance.
_TOLERANCE_REASONS = frozenset({"output_mismatch"})
# Statuses reached only after the candidate's extension built and imported.
_BUILT_STATUSES = frozenset({Status.RUNTIME_ERROR, Status.INCORRECT, Status.CORRECT})


def status_value(verdict: Verdict) -> str:
    return verdict.status.value if hasattr(verdict.status, "value") else str(verdict.status)


def speedup_of(verdict: Verdict, convention: str = FAST_P_CONVENTION) -> float | None:
    """The verdict's speedup over eager under `convention`. Verdicts from before verifier 0.3 have only `speedup`,
    measured with the GPU-time convention (flush and call enqueued back to back), so it stands in for "gpu"."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if hasattr(verdict, f"speedup_{convention}"):
        return getattr(verdict, f"speedup_{convention}")
    return verdict.speedup if convention == "gpu" else None


def correct_at(verdict: Verdict | None, tolerance: str) -> bool:
    """Whether the candidate counts as correct at atol=rtol=`tolerance` ("1e-2" or "1e-4").

    A correct verdict needs its recorded flag for that tolerance (unknown counts as not correct). An incorrect
    verdict rejected only for an output mismatch counts at a tolerance it met (a 1e-4-policy run judged at 1e-2);
    every other status (deceptive, runtime error, not executed...) is not correct at any tolerance."""
    if tolerance not in TOLERANCES:
        raise ValueError(f"tolerance must be one of {TOLERANCES}, got {tolerance!r}")
    if verdict is None:
        return False
    flag = verdict.correct_at_1e2 if tolerance == "1e-2" else verdict.correct_at_1e4
    if verdict.status == Status.CORRECT:
        return flag is True
    if verdict.status == Status.INCORRECT:
        return flag is True and bool(verdict.reasons) and set(verdict.reason_codes()) <= _TOLERANCE_REASONS
    return False


def compiled(verdict: Verdict | None) -> bool | None:
    """True when the candidate built; None when that is unknown (static-only verdicts on a host with no build)."""
    if verdict is None:
        return False
    if verdict.status == Status.COMPILE_ERROR:
        return False
    if verdict.status in _BUILT_STATUSES or verdict.compile_seconds is not None:
        return True
    return None  # judged before or without a build: static rejections, not_executed, infrastructure errors


def geometric_mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class TaskOutcome:
    """One task of the evaluated level: its verdicts (sample 0 first; None where the task has none yet)."""

    task_key: str
    verdicts: list[Verdict | None] = field(default_factory=list)
    known_issues: list[str] = field(default_factory=list)

    @property
    def primary(self) -> Verdict | None:
        return self.verdicts[0] if self.verdicts else None


def level_metrics(outcomes: Sequence[TaskOutcome], tolerance: str, *,
                  thresholds: Sequence[float] = FAST_P_THRESHOLDS, convention: str = FAST_P_CONVENTION,
                  pass_k: Sequence[int] = ()) -> dict[str, Any]:
    """Metrics over every task in `outcomes` (the whole level: a task with no verdict counts as a failure).

    Exec, fast_p, compile and deceptive rates use each task's first sample (the paper's one greedy sample); pass@k
    uses all samples of a task. fast_p counts tasks correct at `tolerance` whose `convention` speedup is strictly
    greater than p; the geometric mean is over correct tasks with a measured speedup."""
    n = len(outcomes)

    def share(count: int) -> float:
        return count / n if n else 0.0

    primaries = [o.primary for o in outcomes]
    correct = [v for v in primaries if correct_at(v, tolerance)]
    built = [compiled(v) for v in primaries]
    deceptive = [v for v in primaries if v is not None and v.status == Status.DECEPTIVE]
    by_reason = Counter(code for v in deceptive for code in (v.reason_codes() or ["unspecified"]))
    row: dict[str, Any] = {
        "tolerance": tolerance,
        "fast_p_convention": convention,
        "n_tasks": n,
        "n_judged": sum(1 for v in primaries if v is not None),
        "n_compiled": sum(1 for b in built if b is True),
        "n_compile_unknown": sum(1 for b in built if b is None),
        "compile_rate": share(sum(1 for b in built if b is True)),
        "n_correct": len(correct),
        "exec_rate": share(len(correct)),
        "n_not_executed": sum(1 for v in primaries if v is not None and v.status == Status.NOT_EXECUTED),
        "n_infrastructure_error": sum(1 for v in primaries
                                      if v is not None and status_value(v) == INFRASTRUCTURE_ERROR),
        "n_missing": sum(1 for v in primaries if v is None),
        "n_known_issue_tasks": sum(1 for o in outcomes if o.known_issues),
        "n_correct_on_known_issue_tasks": sum(1 for o in outcomes
                                              if o.known_issues and correct_at(o.primary, tolerance)),
        "deceptive_rate": share(len(deceptive)),
        "deceptive_by_reason": {code: share(count) for code, count in sorted(by_reason.items())},
        "n_flagged_baseline_kernel": sum(1 for v in primaries if v is not None and "baseline_kernel" in v.flags),
    }
    for name in CONVENTIONS:
        speedups = [speedup_of(v, name) for v in correct]
        suffix = "" if name == convention else f"_{name}"
        for p in thresholds:
            row[f"fast_{p:g}{suffix}"] = share(sum(1 for s in speedups if s is not None and s > p))
        row[f"geomean_speedup_{name}"] = geometric_mean(speedups)
        row[f"n_speedup_measured_{name}"] = sum(1 for s in speedups if s is not None)
    samples = [len(o.verdicts) for o in outcomes]
    row["samples_per_task"] = min(samples) if samples else 0
    row["pass_at_k"] = {}
    for k in pass_k:
        usable = [o for o in outcomes if len(o.verdicts) >= k]
        if len(usable) == n and n:
            row["pass_at_k"][str(k)] = sum(
                pass_at_k(len(o.verdicts), sum(correct_at(v, tolerance) for v in o.verdicts), k) for o in usable) / n
    return row


def evaluation_metrics(outcomes: Sequence[TaskOutcome], **options) -> list[dict[str, Any]]:
    """`level_metrics` at both tolerances, 1e-2 first."""
    return [level_metrics(outcomes, tolerance, **options) for tolerance in TOLERANCES]
