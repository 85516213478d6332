"""The library API and `dice verify` on a machine without a GPU: static verdicts, isolation of candidate code in
the build worker (crash, hang, import error, secrets, network), order of batch results, and the verdict schema."""

from __future__ import annotations

import json
import os

import pytest
from verify_cases import HONEST, REFERENCE, STATIC_CASES, candidate

from dice_pipeline.cli import main as dice_main
from dice_pipeline.verify import (
    Reason,
    Status,
    TimingStats,
    Verdict,
    VerifyConfig,
    VerifyJob,
    compile_only,
    gpu_inventory,
    verify_batch,
    verify_candidate,
)
from dice_pipeline.verify.sandbox import network_isolation_prefix

needs_no_gpu = pytest.mark.skipif(bool(gpu_inventory()), reason="checks the no-GPU behaviour")


@pytest.fixture
def config(tmp_path) -> VerifyConfig:
    return VerifyConfig(build_cache_dir=str(tmp_path / "cache"), compile_timeout_s=120, use_precompiled_header=False)


def _module_code_candidate(statement: str) -> str:
    """An otherwise valid candidate whose module code runs `statement` before building its extension."""
    return HONEST.replace("cpp_src = ", f"{statement}\ncpp_src = ", 1)


def test_verdict_round_trips_through_json():
    verdict = Verdict(status=Status.CORRECT, reasons=[Reason("x", "y", "static")], speedup=1.5,
                      reference_timing=TimingStats(1.0, 0.1, 1.0, 100, 0.02), flags=["degenerate_task"],
                      provenance={"gpu": "H200"})
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert json.loads(verdict.to_json())["status"] == "correct"


def test_static_rejection_needs_no_build_and_carries_provenance(config):
    case = next(c for c in STATIC_CASES if c.name == "torch_only_forward")
    verdict = verify_candidate(REFERENCE, case.source, config)
    assert verdict.status == Status.DECEPTIVE and verdict.reason_codes() == ["torch_only_forward"]
    assert verdict.compile_seconds is None
    assert verdict.provenance["verifier_version"] and verdict.provenance["time"]


def test_batch_keeps_order_and_reports_every_job(config):
    cases = STATIC_CASES[:6]
    seen = []
    verdicts = verify_batch([VerifyJob(c.name, c.reference, c.source) for c in cases], config,
                            on_result=lambda job, verdict: seen.append(job.job_id))
    assert [v.status.value for v in verdicts] == [c.status for c in cases]
    assert sorted(seen) == sorted(c.name for c in cases)


def test_module_code_that_raises_is_a_compile_error_from_the_worker(config):
    verdict = verify_candidate(REFERENCE, _module_code_candidate("raise RuntimeError('boom at import')"), config)
    assert verdict.status == Status.COMPILE_ERROR and verdict.reason_codes() == ["import_failed"]
    assert "boom at import" in verdict.reasons[0].message


@needs_no_gpu
@pytest.mark.parametrize("statement", ["torch.cuda.get_device_capability()",
                                       "_warm = torch.zeros(4, device='cuda') + 1"])
def test_module_code_that_needs_a_gpu_is_not_a_compile_error(config, statement):
    """A device query or a CUDA tensor at import fails in the GPU-less build stage; that is left to the run stage,
    and here, with no GPU at all, the verdict says what could not be done instead of calling it a compile error."""
    verdict = verify_candidate(REFERENCE, _module_code_candidate(f"import torch\n{statement}"), config)
    assert verdict.status == Status.NOT_EXECUTED and verdict.reason_codes() == ["no_gpu"]
    assert "needs a GPU at import" in verdict.reasons[0].message
    assert verdict.provenance.get("import_needs_gpu") is True


def test_needs_gpu_tells_a_cuda_failure_from_other_import_errors():
    from dice_pipeline.verify.worker import needs_gpu

    def raised(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            return exc
        raise AssertionError("expected an exception")

    import torch
    if not torch.cuda.is_available():
        assert needs_gpu(raised(lambda: torch.zeros(1, device="cuda")))
    assert needs_gpu(RuntimeError("No CUDA GPUs are available"))
    wrapped = raised(lambda: exec("try:\n    raise RuntimeError('No CUDA GPUs are available')\n"
                                  "except RuntimeError as e:\n    raise ValueError('while warming up') from e"))
    assert needs_gpu(wrapped)
    assert not needs_gpu(raised(lambda: 1 / 0))
    assert not needs_gpu(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_module_code_that_hangs_times_out(config):
    config.compile_timeout_s = 8
    verdict = verify_candidate(REFERENCE, _module_code_candidate("import time\ntime.sleep(120)"), config)
    assert verdict.status == Status.TIMEOUT and verdict.reason_codes() == ["build_timeout"]


def _build_past_static_checks(config, candidate_src: str) -> Verdict:
    """The build stage for code the static checks would reject: the sandbox must hold on its own as well."""
    from dice_pipeline.verify.api import _BatchRun
    from dice_pipeline.verify.static_checks import check_candidate_source

    clean = check_candidate_source(REFERENCE, HONEST)  # a report with no findings
    verdict, _ = _BatchRun(config, None).build(VerifyJob("j", REFERENCE, candidate_src), clean)
    assert verdict is not None
    return verdict


def test_module_code_that_kills_its_process_is_reported_not_raised(config):
    code = _module_code_candidate("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert set(verify_candidate(REFERENCE, code, config).reason_codes()) == {"process_spawn"}  # caught statically
    verdict = _build_past_static_checks(config, code)
    assert verdict.status == Status.COMPILE_ERROR and verdict.reason_codes() == ["worker_crashed"]
    assert "signal 9" in verdict.reasons[0].message


def test_candidate_sees_no_secrets_and_no_network(config, monkeypatch):
    monkeypatch.setenv("DICE_TEST_TOKEN", "leaked-secret-value")
    probe = "import os, socket\nraise RuntimeError(repr(sorted(os.environ)) + repr(socket.if_nameindex()))"
    verdict = _build_past_static_checks(config, _module_code_candidate(probe))
    message = verdict.reasons[0].message
    assert verdict.reason_codes() == ["import_failed"] and "PATH" in message
    assert "DICE_TEST_TOKEN" not in message and "leaked-secret-value" not in message
    if network_isolation_prefix():
        assert "eth0" not in message and "'lo'" in message


def test_execute_true_without_gpu_is_an_error_not_a_fabricated_verdict(config):
    if gpu_inventory():
        pytest.skip("a GPU is present")
    config.execute = True
    with pytest.raises(RuntimeError, match="no GPU"):
        verify_candidate(REFERENCE, HONEST, config)


def test_cli_prints_json_verdict_and_fails_on_rejection(tmp_path, capsys, config):
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(candidate(forward="return torch.relu(x) * 2.0"))
    code = dice_main(["verify", str(tmp_path / "ref.py"), str(tmp_path / "cand.py"), "--json",
                      "--cache-dir", config.build_cache_dir])
    verdict = json.loads(capsys.readouterr().out)
    assert code == 1 and verdict["status"] == "deceptive"


def test_cli_judges_the_code_block_of_a_markdown_answer(tmp_path, capsys, config):
    (tmp_path / "ref.py").write_text(REFERENCE)
    answer = "Here is the faster model:\n```python\n" + candidate(forward="return torch.relu(x) * 2.0") + "```\n"
    (tmp_path / "answer.md").write_text(answer)
    code = dice_main(["verify", str(tmp_path / "ref.py"), str(tmp_path / "answer.md"), "--json",
                      "--cache-dir", config.build_cache_dir])
    captured = capsys.readouterr()
    # Judged as code (the static checks ran on it), not rejected as a file that does not parse.
    assert code == 1 and json.loads(captured.out)["status"] == "deceptive"
    assert "torch_only_forward" in captured.out and "markdown answer" in captured.err


def test_cli_reports_missing_file(tmp_path, capsys):
    assert dice_main(["verify", str(tmp_path / "nope.py"), str(tmp_path / "nope2.py")]) == 2
    assert "no such file" in capsys.readouterr().err


@needs_no_gpu
@pytest.mark.nvcc
@pytest.mark.slow
def test_compile_only_builds_with_nvcc_and_reports_not_executed(config):
    broken = candidate(cuda_source="__global__ void relu2_kernel(float* y) { y[0] = undefined_name; }\n"
                                   "torch::Tensor relu2(torch::Tensor x) { return x; }")
    config.max_parallel_builds = 2
    config.compile_timeout_s = 900  # two nvcc builds of torch headers on a 2-core machine: minutes, not seconds
    honest, bad = verify_batch([VerifyJob("honest", REFERENCE, HONEST), VerifyJob("broken", REFERENCE, broken)],
                               VerifyConfig(**{**config.to_dict(), "execute": False}))
    assert honest.status == Status.NOT_EXECUTED and honest.reason_codes() == ["no_gpu"], honest.to_json()
    assert honest.provenance["build_mode"] == "compile_only" and honest.compile_seconds > 0
    assert bad.status == Status.COMPILE_ERROR and "undefined_name" in bad.reasons[0].message
    again = compile_only(REFERENCE, HONEST, config)  # same content: served from the build cache
    assert again.status == Status.NOT_EXECUTED and again.build_cache_hit and again.compile_seconds < 1


def _fake_nvidia_smi(tmp_path, monkeypatch, lines: str) -> None:
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")


def test_gpu_inventory_parses_nvidia_smi_and_honours_visible_devices(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "0, NVIDIA H200, 580.159.04, 9.0\\n1, NVIDIA H200, 580.159.04, 9.0\\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.index, g.name, g.driver, g.compute_capability) for g in gpu_inventory()] == [
        (0, "NVIDIA H200", "580.159.04", "9.0"), (1, "NVIDIA H200", "580.159.04", "9.0")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.index for g in gpu_inventory()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_inventory() == []


def test_prestarted_gpu_worker_waits_at_its_gate_without_running_task_code(config, tmp_path):
    import threading
    import time

    from dice_pipeline.verify.api import _BatchRun
    from dice_pipeline.verify.static_checks import check_candidate_source

    marker = tmp_path / "candidate_ran"
    job = VerifyJob("j", REFERENCE, _module_code_candidate(f"open({str(marker)!r}, 'w').close()"))
    run = _BatchRun(config, None)
    static = check_candidate_source(job.reference_src, job.candidate_src)
    gate, outcome = threading.Event(), {}
    worker = threading.Thread(target=lambda: outcome.update(
        result=run._run_worker(job, "run", static, device=None, gate=gate)))
    worker.start()
    time.sleep(4)  # long enough to import torch and reach the gate on a slow machine
    assert worker.is_alive() and not marker.exists()
    gate.set()
    worker.join(timeout=120)
    sandbox_result, payload = outcome["result"]
    # No GPU here: the run stage stops at its first CUDA check, after the gate.
    assert payload["status"] == "runtime_error" and payload["reason"]["code"] == "no_gpu_in_worker"
    assert sandbox_result.wall_seconds < 60


@pytest.mark.parametrize("prestart", [True, False])
def test_gpu_loop_judges_every_job_in_order_with_and_without_prestart(config, monkeypatch, prestart):
    from dataclasses import replace

    from dice_pipeline.verify import api

    # A GPU the loop believes in; the workers find none, which is a real, reported runtime error.
    monkeypatch.setattr(api, "gpu_inventory", lambda: [api.GpuInfo(0, "Test GPU", "0", "9.0")])
    monkeypatch.setattr(api._BatchRun, "build", lambda self, job, static: (None, {"compile_seconds": 0.0}))
    jobs = [VerifyJob(f"j{i}", REFERENCE, HONEST.replace("2.0f", f"{i + 2}.0f")) for i in range(3)]
    verdicts = verify_batch(jobs, replace(config, prestart_gpu_workers=prestart))
    assert [v.status for v in verdicts] == [Status.RUNTIME_ERROR] * 3
    assert all(v.reason_codes() == ["no_gpu_in_worker"] for v in verdicts)
    assert all(v.provenance["gpu"] == "Test GPU" and v.provenance["run_seconds"] >= 0 for v in verdicts)


def test_cpu_split_keeps_cores_for_gpu_workers(monkeypatch):
    from dice_pipeline.verify.api import split_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert split_cpus(2) == ({14, 15}, set(range(14)))
    assert split_cpus(0) == (None, None)
    assert split_cpus(5) == (None, None)  # 16 cores < 4 x 5: not worth splitting


def test_run_worker_moves_to_its_cores_after_the_gate(config):
    import threading

    from dice_pipeline.verify.api import _BatchRun
    from dice_pipeline.verify.static_checks import check_candidate_source

    run = _BatchRun(config, None)
    core = min(os.sched_getaffinity(0))
    run.gpu_worker_cpus = {core}
    gate = threading.Event()
    gate.set()
    _, payload = run._run_worker(VerifyJob("j", REFERENCE, HONEST), "run", check_candidate_source(REFERENCE, HONEST),
                                 device=None, gate=gate)
    assert payload["worker_cpus"] == [core]
    assert payload["worker_threads"] == 1  # torch's pool sized to its core, not to the host seen at import


def test_gpu_workers_share_their_cores_by_lane(config):
    from dice_pipeline.verify.api import _BatchRun

    run = _BatchRun(config, None)
    run.gpus, run.gpu_worker_cpus = ["gpu0"], {0, 1, 2, 3}
    for lanes, threads in ((1, 4), (2, 2), (3, 1), (8, 1)):
        run.config.gpu_lanes = lanes
        assert run.run_threads() == threads
    run.gpus = ["gpu0", "gpu1"]
    run.config.gpu_lanes = 2
    assert run.run_threads() == 1


def test_extra_baselines_are_checked_deduplicated_and_given_time():
    with pytest.raises(ValueError, match="extra_baselines"):
        VerifyConfig(extra_baselines=("cuda_graphs",))
    config = VerifyConfig(extra_baselines=["compile", "cuda_graph", "compile"], run_timeout_s=100)
    assert config.extra_baselines == ("compile", "cuda_graph")
    assert config.stage_time_limit("run") == 100 + 120 + 10
    assert config.stage_time_limit("build") == config.compile_timeout_s
    assert VerifyConfig.from_dict(config.to_dict()) == config


def test_baseline_speedups_round_trip_and_show_in_the_summary():
    verdict = Verdict(status=Status.CORRECT, speedup=2.0,
                      baseline_speedups={"cuda_graph": {"median_ms": 0.1, "n": 100, "speedup": 1.25},
                                         "compile": {"error": "BackendCompilerFailed: no triton"}})
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert "speedup=2.00x vs_cuda_graph=1.25x vs_compile=failed" in verdict.summary()


def test_cli_rejects_an_unknown_baseline(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dice_main(["verify", "ref.py", "cand.py", "--baseline", "tensorrt"])
    assert exit_info.value.code == 2 and "tensorrt" in capsys.readouterr().err


def test_several_lanes_judge_every_job_through_the_shared_gpu(config, monkeypatch):
    from dataclasses import replace

    from dice_pipeline.verify import api

    monkeypatch.setattr(api, "gpu_inventory", lambda: [api.GpuInfo(0, "Test GPU", "0", "9.0")])
    monkeypatch.setattr(api._BatchRun, "build", lambda self, job, static: (None, {"compile_seconds": 0.0}))
    runs: list[api._BatchRun] = []
    original_init = api._BatchRun.__init__

    def remember(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(api._BatchRun, "__init__", remember)
    jobs = [VerifyJob(f"j{i}", REFERENCE, HONEST.replace("2.0f", f"{i + 2}.0f")) for i in range(4)]
    verdicts = verify_batch(jobs, replace(config, gpu_lanes=3, gpu_memory_fraction=0.6))
    assert [v.reason_codes() for v in verdicts] == [["no_gpu_in_worker"]] * 4
    # each worker asked the parent for the GPU (its wait is recorded), and nothing is held after the batch
    assert all("gpu_wait_s" in v.provenance for v in verdicts)
    (run,) = runs
    assert run.shared_gpus[0].state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0,
                            "waiting_whole": 0, "residents": 0}
    assert run.lane_memory_fraction() == pytest.approx(0.2)


def test_a_lane_that_ran_out_of_memory_is_judged_again_with_the_gpu_to_itself(config, monkeypatch):
    from dataclasses import replace

    from dice_pipeline.verify import api
    from dice_pipeline.verify.sandbox import SandboxResult
    from dice_pipeline.verify.static_checks import check_candidate_source

    monkeypatch.setattr(api, "gpu_inventory", lambda: [api.GpuInfo(0, "Test GPU", "0", "9.0")])
    calls: list[dict] = []
    outcome = SandboxResult(0, False, False, 1.0, 10.0, "", True)

    def fake_worker(self, job, stage, static, device, gate=None, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            return outcome, {"status": "runtime_error", "retry_low_memory": True,
                             "reasons": [{"code": "candidate_out_of_memory", "message": "oom", "stage": "correctness"}]}
        return outcome, {"status": "correct", "reasons": [], "speedup": 1.5}

    monkeypatch.setattr(api._BatchRun, "_run_worker", fake_worker)
    static = check_candidate_source(REFERENCE, HONEST)
    lanes = api._BatchRun(replace(config, gpu_lanes=2), None)
    verdict = lanes.judge(VerifyJob("j", REFERENCE, HONEST), static, {}, device=0)
    assert verdict.status == Status.CORRECT
    assert calls[1] == {"control": False, "low_memory": True, "gpu_exclusive": True}
    assert verdict.provenance["first_attempt_out_of_memory"]["status"] == "runtime_error"
    calls.clear()
    one_lane = api._BatchRun(replace(config, gpu_lanes=1), None)
    one_lane.judge(VerifyJob("j", REFERENCE, HONEST), static, {}, device=0)
    assert calls[1]["gpu_exclusive"] is False  # one lane has the GPU to itself already
