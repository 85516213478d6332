"""Sanity rows judged with every evaluation, through the same verifier and config as the candidates: the task's
own reference wrapped as `ModelNew` must be `deceptive`; a kernel that writes zeros must be `incorrect`, or pass
only on a task flagged `degenerate_task`; the team's known-good kernels (seed corpus pairs measured correct) must be
`correct`. Without a GPU only the static stage runs: the reference wrapper is still caught (`deceptive`), and the
zeros and known-good kernels must get through the static checks (`not_executed`); that is what is asserted there.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.verify.config import VerifyJob
from dice_pipeline.verify.verdict import Status, Verdict

ZEROS_KERNEL = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>

__global__ void fill_zeros_kernel(float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.0f;
}

torch::Tensor zeros_like_first(torch::Tensor x) {
    auto out = torch::empty_like(x);
    long n = out.numel();
    fill_zeros_kernel<<<(n + 255) / 256, 256>>>(out.data_ptr<float>(), n);
    return out;
}
"""
cpp_src = "torch::Tensor zeros_like_first(torch::Tensor x);"
ext = load_inline(name="sanity_zeros", cpp_sources=cpp_src, cuda_sources=source, functions=["zeros_like_first"])


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, *inputs):
        return ext.zeros_like_first(inputs[0])
'''
# Level-1 tasks the zeros kernel is judged on: ReLU (zeros are wrong) and Softmax (zeros pass at 1e-2: the verifier
# must flag the task degenerate). Other levels use their first task.
ZEROS_TASKS_LEVEL1 = (19, 23)
KNOWN_GOOD_COUNT = 2


@dataclass
class SanityCase:
    check: str  # reference_as_modelnew | zeros_kernel | known_good
    subject: str  # task key or seed pair name
    reference: str
    candidate: str
    expected: str  # what must come out, in words

    @property
    def job_id(self) -> str:
        return f"sanity:{self.check}:{self.subject}"


def reference_as_modelnew(task: KernelBenchTask) -> str:
    return task.code.rstrip() + "\n\n\nclass ModelNew(Model):\n    pass\n"


def known_good_pairs(count: int = KNOWN_GOOD_COUNT) -> list[tuple[str, str, str]]:
    """(name, reference, candidate) of seed pairs meant to be fast and measured correct on a GPU."""
    from dice_pipeline.seed_corpus import load_manifest, load_measurements

    measured = load_measurements()
    chosen = []
    for spec in load_manifest():
        record = measured.get(spec.uuid) or {}
        if spec.intended_outcome == "faster" and record.get("status") == "correct":
            chosen.append((spec.problem_name, spec.read("reference.py"), spec.read("candidate.py")))
        if len(chosen) == count:
            break
    return chosen


def sanity_cases(tasks: Sequence[KernelBenchTask], known_good: int = KNOWN_GOOD_COUNT) -> list[SanityCase]:
    if not tasks:
        return []
    first = tasks[0]
    cases = [SanityCase("reference_as_modelnew", first.key, first.code, reference_as_modelnew(first), "deceptive")]
    by_id = {task.problem_id: task for task in tasks if task.level == 1}
    zeros_on = [by_id[i] for i in ZEROS_TASKS_LEVEL1 if i in by_id] or [first]
    cases += [SanityCase("zeros_kernel", task.key, task.code, ZEROS_KERNEL, "incorrect, or passing only where "
                         "flagged degenerate_task") for task in zeros_on]
    cases += [SanityCase("known_good", f"seed/{name}", reference, candidate, "correct")
              for name, reference, candidate in known_good_pairs(known_good)]
    return cases


def sanity_jobs(cases: Sequence[SanityCase]) -> list[VerifyJob]:
    return [VerifyJob(case.job_id, case.reference, case.candidate) for case in cases]


def judge_sanity(case: SanityCase, verdict: Verdict) -> dict[str, Any]:
    """Whether the verdict is what the case must produce. `asserted`: `executed` when the GPU stage ran, `static`
    when the verdict came before execution (no GPU, or a static / build rejection); `passed` is then judged on what
    that stage can tell: a zeros or known-good kernel must reach `not_executed`, never a rejection."""
    status = verdict.status
    # executed: correctness trials ran on a GPU (as results count it); anything else was judged before execution
    asserted = "executed" if status != Status.NOT_EXECUTED and verdict.trials_run is not None else "static"
    if case.check == "reference_as_modelnew":
        passed = status == Status.DECEPTIVE
    elif asserted == "static":
        passed = status == Status.NOT_EXECUTED  # honest CUDA: the static checks (and any build) must let it through
    elif case.check == "zeros_kernel":
        passed = status == Status.INCORRECT or "degenerate_task" in verdict.flags
    else:
        passed = status == Status.CORRECT
    return {"check": case.check, "subject": case.subject, "expected": case.expected, "status": status.value,
            "reason_codes": verdict.reason_codes(), "flags": list(verdict.flags), "passed": passed,
            "asserted": asserted, "summary": verdict.summary()}
