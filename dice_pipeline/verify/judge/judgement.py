"""What a judgement accumulates as its stages run, and how a stage ends it early: the shared vocabulary of the
judge's modules (a rejection with its reason, the candidate's own failure while timed, out-of-memory errors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dice_pipeline.verify.verdict import Reason, Status


class Rejection(Exception):
    """Ends the judgement early with a status; the verdict keeps whatever was measured before."""

    def __init__(self, status: Status, code: str, message: str, stage: str):
        super().__init__(message)
        self.reason = Reason(code=code, message=message, stage=stage)
        self.status = status


@dataclass
class Judgement:
    """Accumulates the verdict fields as the stages run (becomes `Verdict.to_dict()` material)."""

    status: Status = Status.CORRECT
    reasons: list[Reason] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    @property
    def provenance(self) -> dict[str, Any]:
        return self.fields.setdefault("provenance", {})


class CandidateFailed(Exception):
    """Candidate code raised while the harness timed it (the original is the cause)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA out-of-memory error, raised by torch's allocator or reported by a CUDA call."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
