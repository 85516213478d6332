"""Resumable evaluation: stored generations and verdicts are reused, an interrupted run judges only what is left,
not_executed verdicts are judged again once a GPU is there; the evaluation's sanity rows and metrics on CPU."""

from __future__ import annotations

import pytest

from dice_pipeline.evaluation.evaluate import evaluate_level, evaluation_verify_config
from dice_pipeline.evaluation.runner import run_evaluation
from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.verify.verdict import Status, Verdict

CODE = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
TASKS = [KernelBenchTask(1, i, f"{i}_t", CODE) for i in (1, 2, 3, 4)]


class CountingGenerator:
    def __init__(self):
        self.calls = []

    def __call__(self, tasks, seed):
        self.calls.append([t.key for t in tasks])
        return [[{"text": "x", "code": None if t.problem_id == 4 else f"# answer {t.key}\nclass ModelNew: pass\n",
                  "finish_reason": "stop"}] for t in tasks]


class Judge:
    def __init__(self, status=Status.CORRECT, fail_after=None):
        self.judged, self.status, self.fail_after = [], status, fail_after

    def __call__(self, jobs, on_result):
        verdicts = []
        for job in jobs:
            if self.fail_after is not None and len(self.judged) >= self.fail_after:
                raise KeyboardInterrupt  # the evaluation is interrupted mid-level
            self.judged.append(job.job_id)
            verdict = Verdict(self.status, correct_at_1e2=True, correct_at_1e4=True, speedup=1.5,
                              provenance={"gpu": "H200"})
            on_result(job, verdict)
            verdicts.append(verdict)
        return verdicts


def test_interrupted_evaluation_resumes_without_regenerating_or_rejudging(tmp_path):
    generator, first = CountingGenerator(), Judge(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(TASKS, state_dir=tmp_path, generate=generator, judge=first, can_execute=True,
                       generation_batch=2, progress=False, log=lambda m: None)
    assert generator.calls == [["L1/1_t", "L1/2_t"], ["L1/3_t", "L1/4_t"]]
    second = Judge()
    run = run_evaluation(TASKS, state_dir=tmp_path, generate=generator, judge=second, can_execute=True,
                         progress=False, log=lambda m: None)
    assert len(generator.calls) == 2  # nothing generated again
    assert first.judged == ["L1/1_t#s0", "L1/2_t#s0"] and second.judged == ["L1/3_t#s0"]
    assert [r.verdict.status for r in run.results] == [Status.CORRECT] * 3 + [Status.COMPILE_ERROR]
    assert [r.reused_verdict for r in run.results] == [True, True, False, True]
    assert run.results[3].verdict.reason_codes() == ["no_code_block"] and run.stopped_early is None
    third = Judge()
    run_evaluation(TASKS, state_dir=tmp_path, generate=generator, judge=third, can_execute=True, progress=False,
                   log=lambda m: None)
    assert third.judged == []


def test_not_executed_verdicts_are_judged_again_when_a_gpu_is_there(tmp_path):
    cpu = Judge(Status.NOT_EXECUTED)
    run_evaluation(TASKS[:2], state_dir=tmp_path, generate=CountingGenerator(), judge=cpu, progress=False,
                   log=lambda m: None)
    again_on_cpu = Judge(Status.NOT_EXECUTED)
    run_evaluation(TASKS[:2], state_dir=tmp_path, generate=None, judge=again_on_cpu, progress=False,
                   log=lambda m: None)
    on_gpu = Judge()
    run_evaluation(TASKS[:2], state_dir=tmp_path, generate=None, judge=on_gpu, can_execute=True, progress=False,
                   log=lambda m: None)
    assert len(cpu.judged) == 2 and again_on_cpu.judged == [] and len(on_gpu.judged) == 2


def test_deadline_stops_between_chunks_and_says_so(tmp_path):
    judge = Judge()
    run = run_evaluation(TASKS[:3], state_dir=tmp_path, generate=CountingGenerator(), judge=judge, judge_chunk=1,
                         deadline=0.0, progress=False, log=lambda m: None)
    assert judge.judged == [] and "deadline" in run.stopped_early


def test_evaluate_level_on_cpu_scores_every_task_and_runs_sanity_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    config = evaluation_verify_config(execute=False, build_without_gpu=False, build_cache_dir=str(tmp_path / "b"))
    assert config.tolerance_policy == "v0.1"
    evaluation = evaluate_level(TASKS, checkpoint="fake", level=1, generate=CountingGenerator(), config=config,
                                state_dir=str(tmp_path / "state"), progress=False, log=lambda m: None)
    assert not evaluation.executed and evaluation.complete
    assert [m["n_tasks"] for m in evaluation.metrics] == [4, 4]
    statuses = {r["task_key"]: r["status"] for r in evaluation.results}
    assert statuses["L1/4_t"] == "compile_error"
    # the placeholder answers have no CUDA extension: the static checks reject them, no GPU needed
    assert {statuses[k] for k in ("L1/1_t", "L1/2_t", "L1/3_t")} <= {"deceptive", "compile_error"}
    checks = {row["check"] for row in evaluation.sanity}
    assert checks == {"reference_as_modelnew", "zeros_kernel", "known_good"}
    assert all(row["passed"] for row in evaluation.sanity), evaluation.sanity


def test_no_chunk_starts_that_the_longest_so_far_says_would_overrun(tmp_path):
    import time

    class SlowJudge(Judge):
        def __call__(self, jobs, on_result):
            time.sleep(0.3)
            return super().__call__(jobs, on_result)

    judge = SlowJudge()
    run = run_evaluation(TASKS[:3], state_dir=tmp_path, generate=CountingGenerator(), judge=judge, judge_chunk=1,
                         deadline=time.monotonic() + 0.5, progress=False, log=lambda m: None)
    assert len(judge.judged) == 1 and "1 answers" not in run.stopped_early and "2 answers" in run.stopped_early


def test_state_key_changes_with_the_checkpoint_or_settings():
    from dice_pipeline.evaluation.runner import state_key

    base = state_key("sft", {"path": "/a", "steps": 4})
    assert base.startswith("sft-") and base == state_key("sft", {"steps": 4, "path": "/a"})
    assert base != state_key("sft", {"path": "/b", "steps": 4}) != state_key("sft", {"path": "/a", "steps": 2})


def test_result_rows_compute_speedups_against_the_local_baselines(tmp_path):
    from dice_pipeline.evaluation.evaluate import result_row
    from dice_pipeline.evaluation.runner import SampleResult
    from dice_pipeline.verify.verdict import TimingStats

    verdict = Verdict(Status.CORRECT, correct_at_1e2=True, correct_at_1e4=False, speedup=2.0, trials_run=5,
                      candidate_timing=TimingStats(0.5, 0.01, 0.5, 100, 0.01), provenance={"gpu": "H200"})
    result = SampleResult(TASKS[0], 0, {"code": "x", "usage": {"completion_tokens": 7}}, verdict)
    row = result_row("sft", result, {"status": "measured", "eager_ms_gpu": 1.0, "compile_ms_gpu": 0.25})
    assert row["speedup_vs_eager_baseline"] == 2.0 and row["speedup_vs_compile"] == 0.5
    assert row["correct_at_1e2"] and not row["correct_at_1e4"] and row["executed"] and row["completion_tokens"] == 7
    assert result_row("sft", SampleResult(TASKS[1], 0, None, None), None)["status"] == "missing"


def test_a_training_asset_registers_its_checkpoint_and_partition(tmp_path):
    import dagster as dg

    from dice_pipeline.evaluation.registry import load_registry, register_checkpoint

    instance = dg.DagsterInstance.ephemeral()
    register_checkpoint("sft", str(tmp_path), instance=instance, registry=tmp_path / "r.json")
    register_checkpoint("sft", str(tmp_path / "v2"), instance=instance, registry=tmp_path / "r.json")
    assert instance.get_dynamic_partitions("eval_checkpoint") == ["sft"]
    assert load_registry(tmp_path / "r.json")["sft"].path == str(tmp_path / "v2")
    with pytest.raises(ValueError, match="partition key"):
        register_checkpoint("a|b", str(tmp_path), registry=tmp_path / "r.json")
