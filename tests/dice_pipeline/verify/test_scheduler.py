"""The batch scheduler (scheduler.py): builds in groups and waves, members of a built group straight to their run
stage, the GPU loops and their lanes, prestarted workers at their gate, the cores of GPU workers and builds, the
low-memory retry and the hand-back to the build stage. Workers are faked through the injectable worker runner
(fake_workers.FakeWorkers); the few tests that need a real worker process say so."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import pytest
from cpu_judge import DOUBLING_REFERENCE
from fake_workers import FakeWorkers, correct
from verify_cases import HONEST, HONEST_KERNEL, REFERENCE, candidate

from dice_pipeline.verify import GpuInfo, Status, VerifyConfig, VerifyJob, gpu_inventory, verify_batch
from dice_pipeline.verify.api import measure_references
from dice_pipeline.verify.inventory import BUILD_JOBS, split_cpus
from dice_pipeline.verify.scheduler import BatchRun, run_batch
from dice_pipeline.verify.static_checks import StaticReport, check_candidate_source

FAKE_GPU = [GpuInfo(0, "Fake GPU", "1", "9.0", 81559)]
needs_no_gpu = pytest.mark.skipif(bool(gpu_inventory()), reason="checks the no-GPU behaviour")


@pytest.fixture
def config(tmp_path) -> VerifyConfig:
    return VerifyConfig(build_cache_dir=str(tmp_path / "cache"), compile_timeout_s=120, use_precompiled_header=False,
                        verdict_store_dir=None, device_lock_dir=str(tmp_path / "locks"))


def _jobs(count: int) -> list[VerifyJob]:
    return [VerifyJob(f"c{n}", REFERENCE, candidate(cuda_source=HONEST_KERNEL.replace("256", str(n))))
            for n in range(32, 32 * (count + 1), 32)]


# --- builds ---------------------------------------------------------------------------------------------------------
def test_group_builds_compile_in_waves_of_the_configured_slots(config):
    running, peak, lock = 0, 0, threading.Lock()

    def group_build(request, launch):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.1)
        with lock:
            running -= 1
        return {"status": "ok", "grouped": [], "attempts": []}

    workers = FakeWorkers(group_build=group_build)
    verdicts = verify_batch(_jobs(8), replace(config, execute=False, max_parallel_builds=8, build_batch_size=2,
                                               parallel_group_builds=2), worker_runner=workers)
    assert [v.status for v in verdicts] == [Status.NOT_EXECUTED] * 8
    assert {v.provenance["build_group"]["candidates"] for v in verdicts} == {2}  # 4 groups of 2
    assert peak == 2  # never more than the slots at once, and the slots were used
    assert len(workers.stage("group_build")) == 4 and len(workers.stage("build")) == 8  # members left to build alone


def test_group_build_slots_default_to_the_build_cores_over_the_compile_jobs(config):
    run = BatchRun(replace(config, execute=False), gpus=[])
    run.build_cpus = set(range(12))
    assert run.group_build_slots() == 12 // BUILD_JOBS
    run.build_cpus = {0}
    assert run.group_build_slots() == 1
    run.config = replace(config, execute=False, parallel_group_builds=3)
    assert run.group_build_slots() == 3
    with pytest.raises(ValueError, match="parallel_group_builds"):
        VerifyConfig(parallel_group_builds=-1)


def _fake_gpu_batch(config, *, skip: bool, grouped_positions=None):
    """verify_batch on a fake GPU: group builds and judgements faked, the build stages that ran recorded."""
    def group_build(request, launch):
        grouped = list(range(len(request["group_extensions"]))) if grouped_positions is None else grouped_positions
        return {"status": "ok", "grouped": grouped, "attempts": [{"seconds": 4.0, "variant": "light", "built": True}]}

    workers = FakeWorkers(group_build=group_build, run=correct(),
                          build={"status": "ok", "builds": [{"name": "x", "cache_hit": True}], "compile_seconds": 0.1,
                                 "build_cache_hit": True})
    verdicts = verify_batch(_jobs(4), replace(config, build_batch_size=2, skip_grouped_member_builds=skip),
                            gpus=FAKE_GPU, worker_runner=workers)
    built_alone = [r["candidate_src"] for r in workers.stage("build")]
    return verdicts, [v for v in verdicts if v.candidate_timing is None], built_alone, workers


def test_members_built_in_their_group_skip_their_own_build_stage(config):
    verdicts, _, built_alone, workers = _fake_gpu_batch(config, skip=True)
    assert [v.status for v in verdicts] == [Status.CORRECT] * 4
    assert built_alone == []  # no build worker of their own
    assert all(r.get("builds_expected_cached") for r in workers.stage("run"))  # a build now would go back
    for verdict in verdicts:
        assert verdict.provenance["member_build_stage"] == "skipped" and verdict.build_cache_hit is False
        assert verdict.compile_seconds == 2.0  # its share of its group's 4 s
        assert verdict.provenance["build_group"]["candidates"] == 2


def test_members_left_out_of_their_group_or_with_the_setting_off_run_their_build_stage(config):
    verdicts, _, built_alone, _ = _fake_gpu_batch(config, skip=False)
    assert len(built_alone) == 4
    assert all("member_build_stage" not in v.provenance and v.compile_seconds == 2.0 for v in verdicts)
    verdicts, _, built_alone, _ = _fake_gpu_batch(config, skip=True, grouped_positions=[0])
    assert len(built_alone) == 2  # the second member of each group fell out of its build
    skipped = [v for v in verdicts if v.provenance.get("member_build_stage") == "skipped"]
    assert len(skipped) == 2


def test_a_run_stage_that_meets_an_uncached_extension_sends_the_candidate_back_to_its_build_stage(config):
    runs = [{"status": "needs_build", "missed_cache": ["second_ext"]}, correct(speedup=2.0)]
    workers = FakeWorkers(run=lambda request, launch: runs.pop(0),
                          build={"status": "ok", "compile_seconds": 30.0, "build_cache_hit": False,
                                 "builds": [{"name": "second_ext"}]})
    run = BatchRun(config, gpus=FAKE_GPU, worker_runner=workers)
    skipped = {"member_build_stage": "skipped", "compile_seconds": 2.0, "build_cache_hit": False}
    verdict = run.judge(VerifyJob("j", "ref", "cand"), StaticReport(), skipped, device=0)
    assert [(r["stage"], r.get("builds_expected_cached")) for r in workers.requests] == [
        ("run", True), ("build", None), ("run", None)]
    assert verdict.status == Status.CORRECT
    assert "second_ext" in verdict.provenance["member_build_stage"] and verdict.compile_seconds == 30.0
    # its build stage fails: that verdict stands, and no second run
    failing = FakeWorkers(run={"status": "needs_build", "missed_cache": ["bad_ext"]},
                          build={"status": "compile_error", "reason": {"code": "build_failed", "message": "nvcc: error",
                                                                       "stage": "compile"}})
    verdict = BatchRun(config, gpus=FAKE_GPU, worker_runner=failing).judge(
        VerifyJob("j", "ref", "cand"), StaticReport(), skipped, device=0)
    assert [r["stage"] for r in failing.requests] == ["run", "build"] and verdict.status == Status.COMPILE_ERROR
    assert "bad_ext" in verdict.provenance["member_build_stage"]
    # a member that ran its own build stage runs without the cached-only request
    alone = FakeWorkers(run={"status": "incorrect", "reasons": [], "flags": []})
    BatchRun(config, gpus=FAKE_GPU, worker_runner=alone).judge(VerifyJob("j", "ref", "cand"), StaticReport(),
                                                               {"compile_seconds": 1.0}, device=0)
    assert [(r["stage"], r.get("builds_expected_cached")) for r in alone.requests] == [("run", None)]


# --- the GPU loops --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prestart", [True, False])
def test_gpu_loop_judges_every_job_in_order_with_and_without_prestart(config, prestart):
    order: list[str] = []

    def judge(request, launch):
        if launch.gate is not None:
            assert launch.gate.wait(timeout=30)  # a prestarted worker runs nothing before its go
        order.append(request["candidate_src"])
        return correct()

    jobs = [VerifyJob(f"j{i}", REFERENCE, HONEST.replace("2.0f", f"{i + 2}.0f")) for i in range(3)]
    verdicts = verify_batch(jobs, replace(config, prestart_gpu_workers=prestart, gpu_lanes=1, build_batch_size=1),
                            gpus=FAKE_GPU, worker_runner=FakeWorkers(run=judge))
    assert [v.status for v in verdicts] == [Status.CORRECT] * 3
    assert sorted(order) == sorted(job.candidate_src for job in jobs)
    assert all(v.provenance["gpu"] == "Fake GPU" and v.provenance["run_seconds"] >= 0 for v in verdicts)


def test_several_lanes_judge_every_job_through_the_shared_gpu(config):
    seen: list = []

    def judge(request, launch):
        seen.append((request["gpu_lanes"], request["memory_fraction"], launch.gpu_share))
        return correct()

    jobs = [VerifyJob(f"j{i}", REFERENCE, HONEST.replace("2.0f", f"{i + 2}.0f")) for i in range(4)]
    run = BatchRun(replace(config, gpu_lanes=3, gpu_memory_fraction=0.6), gpus=FAKE_GPU,
                   worker_runner=FakeWorkers(run=judge))
    verdicts = run_batch(run, jobs)
    assert [v.status for v in verdicts] == [Status.CORRECT] * 4
    # every worker asks the parent's shared GPU for its timed sections, with a third of 0.6 of the memory
    assert len(seen) == 4 and all(lanes == 3 and fraction == pytest.approx(0.2) for lanes, fraction, _ in seen)
    assert all(share is run.shared_gpus[0] for _, _, share in seen)
    assert run.shared_gpus[0].state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0,
                                          "waiting_whole": 0, "residents": 0}


def test_a_lane_that_ran_out_of_memory_is_judged_again_with_the_gpu_to_itself(config):
    def runs():
        answers = [{"status": "runtime_error", "retry_low_memory": True,
                    "reasons": [{"code": "candidate_out_of_memory", "message": "oom", "stage": "correctness"}]},
                   correct(speedup=1.5)]
        return lambda request, launch: answers.pop(0)

    static = check_candidate_source(REFERENCE, HONEST)
    workers = FakeWorkers(run=runs())
    verdict = BatchRun(replace(config, gpu_lanes=2), gpus=FAKE_GPU, worker_runner=workers).judge(
        VerifyJob("j", REFERENCE, HONEST), static, {}, device=0)
    assert verdict.status == Status.CORRECT
    assert [(r["low_memory"], r["gpu_exclusive"], r["control"]) for r in workers.stage("run")] == [
        (False, False, False), (True, True, False)]
    assert verdict.provenance["first_attempt_out_of_memory"]["status"] == "runtime_error"
    one_lane = FakeWorkers(run=runs())
    BatchRun(replace(config, gpu_lanes=1), gpus=FAKE_GPU, worker_runner=one_lane).judge(
        VerifyJob("j", REFERENCE, HONEST), static, {}, device=0)
    assert one_lane.stage("run")[1]["gpu_exclusive"] is False  # one lane has the GPU to itself already


def test_an_out_of_memory_attempt_is_judged_again_with_less_state_and_the_second_verdict_stands(config):
    answers = [{"status": "infrastructure_error", "retry_low_memory": True, "peak_gpu_memory_mb": 130000.0,
                "reasons": [{"code": "harness_out_of_memory", "message": "24 GiB", "stage": "infrastructure"}]},
               correct(speedup=1.9, speedup_gpu=1.9, speedup_host=1.2, speedup_convention="gpu")]
    workers = FakeWorkers(run=lambda request, launch: answers.pop(0))
    verdict = BatchRun(replace(config, gpu_lanes=1), gpus=FAKE_GPU, worker_runner=workers).judge(
        VerifyJob("j", "ref", "cand"), StaticReport(), {}, device=0)
    assert [r["low_memory"] for r in workers.stage("run")] == [False, True]
    assert verdict.status == Status.CORRECT and verdict.speedup_gpu == 1.9 and verdict.speedup_host == 1.2
    assert verdict.provenance["first_attempt_out_of_memory"]["status"] == "infrastructure_error"


def test_no_retry_when_the_first_attempt_was_judged(config):
    workers = FakeWorkers(run={"status": "incorrect", "reasons": [], "flags": []})
    verdict = BatchRun(config, gpus=FAKE_GPU, worker_runner=workers).judge(
        VerifyJob("j", "ref", "cand"), StaticReport(), {}, device=0)
    assert len(workers.requests) == 1 and verdict.status == Status.INCORRECT


def test_measure_references_without_a_gpu_says_nothing_was_run():
    rows = measure_references([("L1/1", DOUBLING_REFERENCE), ("L1/2", DOUBLING_REFERENCE)], VerifyConfig(),
                              baselines=("eager", "compile"), gpus=[])
    assert [r["task_id"] for r in rows] == ["L1/1", "L1/2"]
    assert {r["status"] for r in rows} == {"not_executed"} and rows[0]["eager_ms_gpu"] is None
    with pytest.raises(ValueError, match="baselines"):
        measure_references([("t", DOUBLING_REFERENCE)], VerifyConfig(), baselines=("tensorrt",), gpus=[])


def test_measure_references_reads_both_conventions_from_the_control_verdict(config):
    payload = correct(speedup=1.0, speedup_gpu=1.01, speedup_host=0.99, speedup_convention="gpu",
                      peak_gpu_memory_mb=8200.0,
                      reference_timing={"median_ms": 2.0, "iqr_ms": 0.1, "mean_ms": 2.0, "n": 10, "cv": 0.01},
                      baseline_speedups={"compile": {"median_ms": 1.5, "n": 10, "convention": "gpu", "speedup": 1.3}},
                      provenance={"gpu": "Fake GPU", "reference_median_ms_host": 2.2,
                                  "input_draw": "get_inputs() on the host"})
    workers = FakeWorkers(run=payload)
    [row] = measure_references([("L1/5", DOUBLING_REFERENCE)], config, baselines=("eager", "compile"), gpus=FAKE_GPU,
                               worker_runner=workers)
    assert [r["control"] for r in workers.requests] == [True] and row["status"] == "measured"
    assert (row["eager_ms_gpu"], row["eager_ms_host"], row["compile_ms_gpu"]) == (2.0, 2.2, 1.5)
    assert row["peak_gpu_mb"] == 8200.0 and row["control_speedup_gpu"] == 1.01


# --- real worker processes --------------------------------------------------------------------------------------------
def _module_code_candidate(statement: str) -> str:
    return HONEST.replace("cpp_src = ", f"{statement}\ncpp_src = ", 1)


def test_prestarted_gpu_worker_waits_at_its_gate_without_running_task_code(config, tmp_path):
    marker = tmp_path / "candidate_ran"
    job = VerifyJob("j", REFERENCE, _module_code_candidate(f"open({str(marker)!r}, 'w').close()"))
    run = BatchRun(config, gpus=[])
    static = check_candidate_source(job.reference_src, job.candidate_src)
    gate, outcome = threading.Event(), {}
    worker = threading.Thread(target=lambda: outcome.update(
        result=run.run_worker(job, "run", static, device=None, gate=gate)))
    worker.start()
    time.sleep(4)  # long enough to import torch and reach the gate on a slow machine
    assert worker.is_alive() and not marker.exists()
    gate.set()
    worker.join(timeout=120)
    sandbox_result, payload = outcome["result"]
    # No GPU here: the run stage stops at its first CUDA check, after the gate.
    assert payload["status"] == "runtime_error" and payload["reason"]["code"] == "no_gpu_in_worker"
    assert sandbox_result.wall_seconds < 60


def test_run_worker_moves_to_its_cores_after_the_gate(config):
    run = BatchRun(config, gpus=[])
    core = min(os.sched_getaffinity(0))
    run.gpu_worker_cpus = {core}
    gate = threading.Event()
    gate.set()
    _, payload = run.run_worker(VerifyJob("j", REFERENCE, HONEST), "run", check_candidate_source(REFERENCE, HONEST),
                                device=None, gate=gate)
    assert payload["worker_cpus"] == [core]
    assert payload["worker_threads"] == 1  # torch's pool sized to its core, not to the host seen at import


@needs_no_gpu
def test_the_batch_on_a_host_without_a_gpu_reports_the_workers_own_finding(config):
    # A GPU the loop believes in; the real worker finds none, which is a real, reported runtime error.
    verdicts = verify_batch([VerifyJob("j", REFERENCE, HONEST)], replace(config, gpu_lanes=1), gpus=FAKE_GPU,
                            worker_runner=None)
    assert verdicts[0].status == Status.RUNTIME_ERROR and verdicts[0].reason_codes() == ["no_gpu_in_worker"]


# --- cores -------------------------------------------------------------------------------------------------------------
def test_cpu_split_keeps_cores_for_gpu_workers():
    cores = list(range(16))
    assert split_cpus(2, cores) == ({14, 15}, set(range(14)))
    assert split_cpus(0, cores) == (None, None)
    assert split_cpus(5, cores) == (None, None)  # 16 cores < 4 x 5: not worth splitting


def test_gpu_workers_share_their_cores_by_lane(config):
    run = BatchRun(config, gpus=[])
    run.gpus, run.gpu_worker_cpus = ["gpu0"], {0, 1, 2, 3}
    for lanes, threads in ((1, 4), (2, 2), (3, 1), (8, 1)):
        run.config = replace(run.config, gpu_lanes=lanes)
        assert run.run_threads() == threads
    run.gpus = ["gpu0", "gpu1"]
    run.config = replace(run.config, gpu_lanes=2)
    assert run.run_threads() == 1
