"""Sanity rows: what each must produce, judged on hand-built GPU verdicts and on the real static checks."""

from __future__ import annotations

from dice_pipeline.evaluation.sanity import ZEROS_KERNEL, SanityCase, judge_sanity, reference_as_modelnew, sanity_cases
from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.verify import check_candidate_source
from dice_pipeline.verify.verdict import Status, Verdict

CODE = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "\n    def forward(self, x):\n        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.rand(4, 16)]\n\n"
        "def get_init_inputs():\n    return []\n")
GPU = {"provenance": {"gpu": "NVIDIA H200"}, "trials_run": 5}


def case(check):
    return SanityCase(check, "L1/19_ReLU", CODE, "", "")


def test_gpu_outcomes_are_judged_against_what_each_row_must_produce():
    assert judge_sanity(case("reference_as_modelnew"), Verdict(Status.DECEPTIVE, **GPU))["passed"]
    assert not judge_sanity(case("reference_as_modelnew"), Verdict(Status.CORRECT, **GPU))["passed"]
    assert judge_sanity(case("zeros_kernel"), Verdict(Status.INCORRECT, **GPU))["passed"]
    degenerate = Verdict(Status.CORRECT, flags=["degenerate_task"], **GPU)
    assert judge_sanity(case("zeros_kernel"), degenerate)["passed"]
    assert not judge_sanity(case("zeros_kernel"), Verdict(Status.CORRECT, **GPU))["passed"]
    good = judge_sanity(case("known_good"), Verdict(Status.CORRECT, **GPU))
    assert good["passed"] and good["asserted"] == "executed"
    assert not judge_sanity(case("known_good"), Verdict(Status.RUNTIME_ERROR, **GPU))["passed"]
    build_failed = judge_sanity(case("known_good"), Verdict(Status.COMPILE_ERROR, provenance={"gpu": "NVIDIA H200"}))
    assert not build_failed["passed"] and build_failed["asserted"] == "static"
    static = judge_sanity(case("known_good"), Verdict(Status.NOT_EXECUTED))
    assert static["passed"] and static["asserted"] == "static"
    assert not judge_sanity(case("known_good"), Verdict(Status.COMPILE_ERROR))["passed"]


def test_static_checks_catch_the_wrapped_reference_and_pass_the_zeros_kernel():
    assert check_candidate_source(CODE, reference_as_modelnew(KernelBenchTask(1, 19, "19_ReLU", CODE))).status \
        == Status.DECEPTIVE
    assert check_candidate_source(CODE, ZEROS_KERNEL).status is None  # honest CUDA: only execution can judge it


def test_cases_cover_the_three_checks_with_zeros_on_relu_and_softmax():
    tasks = [KernelBenchTask(1, i, f"{i}_t", CODE) for i in (1, 19, 23)]
    cases = sanity_cases(tasks)
    assert [(c.check, c.subject) for c in cases][:3] == [("reference_as_modelnew", "L1/1_t"),
                                                         ("zeros_kernel", "L1/19_t"), ("zeros_kernel", "L1/23_t")]
    assert [c.check for c in cases[3:]] == ["known_good", "known_good"]
