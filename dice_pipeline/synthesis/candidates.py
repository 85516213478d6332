"""The generator contract: `KernelGenerator.generate(task_pytorch_code, n, seed=...)` returns `GeneratedCandidate`s.
Every backend (OpenAI-compatible endpoint, local transformers / block-diffusion checkpoint, built-in templates)
implements it, and the `KernelGenerator` Dagster resource hands one of them to the synthesis stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


class GenerationError(RuntimeError):
    """A backend could not produce candidates for a task (endpoint down after retries, malformed answer, ...)."""


class UnsupportedTaskError(GenerationError):
    """The backend cannot handle this task at all (e.g. no built-in template for its family)."""


@dataclass
class GeneratedCandidate:
    """One sampled answer. `code` is the extracted ModelNew file, None when the answer held no code block."""

    text: str  # the raw completion
    code: str | None
    backend: str  # openai_compatible | transformers | block_diffusion | template
    model: str  # model name / checkpoint path / template set version
    prompt_messages: list[dict[str, str]]  # the chat messages the candidate answers
    finish_reason: str  # stop | length | template | ...
    latency_s: float
    sample_index: int = 0
    seed: int | None = None
    cached: bool = False  # served from the response cache, no request made
    usage: dict[str, Any] = field(default_factory=dict)  # token counts where the backend reports them
    variant: dict[str, Any] = field(default_factory=dict)  # backend-specific settings of this sample

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class KernelGenerator(Protocol):
    """Writes candidate `ModelNew` files for a KernelBench-format reference."""

    backend: str
    model_name: str

    def generate(self, task_pytorch_code: str, n: int, *, seed: int) -> list[GeneratedCandidate]:
        """Up to `n` candidates for the task; `seed` makes sampling reproducible where the backend allows."""
        ...


def check_sample_count(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
