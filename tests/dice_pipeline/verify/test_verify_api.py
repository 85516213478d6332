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
    from dice_pipeline.verify.scheduler import BatchRun
    from dice_pipeline.verify.static_checks import check_candidate_source

    clean = check_candidate_source(REFERENCE, HONEST)  # a report with no findings
    verdict, _ = BatchRun(config, gpus=[]).build(VerifyJob("j", REFERENCE, candidate_src), clean)
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


@needs_no_gpu
def test_without_nvcc_a_candidate_is_not_built_rather_than_called_a_compile_error(config, monkeypatch, tmp_path):
    # The build would fail for want of the compiler, not for anything in the candidate: it is not built, and the
    # verdict says so (a host with nvcc builds it, as the README says).
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda"))
    verdict = verify_candidate(REFERENCE, HONEST, config)
    assert verdict.status == Status.NOT_EXECUTED
    assert "no nvcc here: not built" in verdict.reasons[0].message
