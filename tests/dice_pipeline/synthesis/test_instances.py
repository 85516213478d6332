"""synthesize_structure_instances: one row per candidate, kept only when verified correct and fast enough, with a
reason for every other row; without a GPU nothing is kept and the rows say why."""

from __future__ import annotations

import json

from dice_pipeline.synthesis.candidates import GeneratedCandidate, UnsupportedTaskError
from dice_pipeline.synthesis.catalogue import make_structure_task
from dice_pipeline.synthesis.instances import STRUCTURE_INSTANCE_COLUMNS, synthesize_structure_instances
from dice_pipeline.synthesis.templates import TemplateGenerator
from dice_pipeline.verify.verdict import Reason, Status, Verdict

NORM = make_structure_task("rmsnorm_residual", {"b": 1, "s": 4, "h": 8}, {"eps": 1e-6}, "llama")
ROPE = make_structure_task("rope", {"b": 1, "s": 4, "q": 2, "d": 8}, {"rope_theta": 10000.0}, "llama")


def no_gpu_verifier(jobs):
    return [Verdict(status=Status.NOT_EXECUTED, reasons=[Reason("no_gpu", "no CUDA device on this host", "run")])
            for _ in jobs]


def test_without_a_gpu_every_row_says_not_executed_and_nothing_is_kept():
    seen_jobs = []

    def verifier(jobs):
        seen_jobs.extend(jobs)
        return no_gpu_verifier(jobs)

    rows = synthesize_structure_instances([NORM, ROPE], TemplateGenerator(), verifier, n_per_task=2, threshold=1.0)
    assert len(rows) == 4 and len(seen_jobs) == 4
    assert {job_id for job_id, _, _ in seen_jobs} == {r["job_id"] for r in rows}
    for row in rows:
        assert set(row) == set(STRUCTURE_INSTANCE_COLUMNS)
        assert row["kept"] is False and row["status"] == "not_executed" and row["reject_reason"] == "not_executed"
        assert "no CUDA device" in row["reject_message"]
        assert json.loads(row["verdict_json"])["status"] == "not_executed"
        assert row["generator_backend"] == "template" and "ModelNew" in row["candidate_code"]
        assert json.loads(row["prompt_json"])[-1]["role"] == "user"
    assert json.loads(rows[0]["shape_json"]) == {"b": 1, "s": 4, "h": 8}


class ScriptedGenerator:
    """Returns fixed candidates: code per sample (None = no code block); raises for tasks it does not know."""

    backend = "scripted"
    model_name = "script-1"

    def __init__(self, codes):
        self.codes = codes

    def generate(self, task_pytorch_code, n, *, seed):
        if "rope" in task_pytorch_code.splitlines()[0]:
            raise UnsupportedTaskError("no template for rope here")
        return [GeneratedCandidate(text=str(code), code=code, backend=self.backend, model=self.model_name,
                                   prompt_messages=[{"role": "user", "content": "p"}], finish_reason="stop",
                                   latency_s=0.1, sample_index=i) for i, code in enumerate(self.codes[:n])]


def test_verdicts_decide_kept_and_every_other_row_has_a_reason():
    codes = ["fast", "slow", "wrong", None, "fast", "tiny", "untimed"]
    verdicts = {
        "fast": Verdict(status=Status.CORRECT, speedup=1.5),
        "slow": Verdict(status=Status.CORRECT, speedup=0.9),
        "wrong": Verdict(status=Status.INCORRECT, reasons=[Reason("mismatch", "max diff 3.2", "correctness")]),
        "tiny": Verdict(status=Status.CORRECT, speedup=3.0, flags=["overhead_dominated"]),
        "untimed": Verdict(status=Status.CORRECT),
    }
    rows = synthesize_structure_instances(
        [NORM, ROPE], ScriptedGenerator(codes), lambda jobs: [verdicts[code] for _, _, code in jobs],
        n_per_task=len(codes), threshold=1.0,
    )
    by_code = [(r["candidate_code"], r["kept"], r["reject_reason"]) for r in rows if r["task_id"] == NORM.task_id]
    assert by_code == [
        ("fast", True, None),
        ("slow", False, "below_threshold"),
        ("wrong", False, "failed_verification"),
        (None, False, "no_code_block"),
        ("fast", False, "duplicate_candidate"),
        ("tiny", False, "overhead_dominated"),
        ("untimed", False, "no_speedup"),
    ]
    [failed] = [r for r in rows if r["task_id"] == ROPE.task_id]
    assert failed["reject_reason"] == "generation_failed" and "no template for rope" in failed["reject_message"]
    assert failed["generator_backend"] == "scripted" and failed["kept"] is False
    assert rows[0]["speedup"] == 1.5 and rows[0]["threshold"] == 1.0


def test_threshold_is_inclusive():
    rows = synthesize_structure_instances([NORM], ScriptedGenerator(["k"]),
                                          lambda jobs: [Verdict(status=Status.CORRECT, speedup=2.0)], 1, 2.0)
    assert rows[0]["kept"] is True
