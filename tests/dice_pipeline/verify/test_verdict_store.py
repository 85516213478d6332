"""The verdict store: what its key depends on, what it keeps, when it reuses a verdict, and verify_batch with a
store filled elsewhere (the GPU-host -> GPU-less-host hand-off)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from verify_cases import HONEST, REFERENCE, STATIC_CASES

from dice_pipeline.verify import Reason, Status, TimingStats, Verdict, VerifyConfig, VerifyJob, verify_batch
from dice_pipeline.verify.store import VerdictStore, verdict_key

JOB = VerifyJob("job", REFERENCE, HONEST)


def _measured(status: Status = Status.CORRECT, gpu: str | None = "NVIDIA H200") -> Verdict:
    return Verdict(status=status, reasons=[] if status == Status.CORRECT else [Reason("x", "y", "correctness")],
                   speedup=1.7, reference_timing=TimingStats(1.0, 0.1, 1.0, 100, 0.02),
                   candidate_timing=TimingStats(0.6, 0.1, 0.6, 100, 0.02), provenance={"gpu": gpu, "time": "t"})


@pytest.fixture
def config(tmp_path) -> VerifyConfig:
    return VerifyConfig(build_cache_dir=str(tmp_path / "builds"), verdict_store_dir=str(tmp_path / "store"))


def test_key_follows_sources_and_judging_config_only(config):
    key = verdict_key(JOB, config)
    assert key == verdict_key(VerifyJob("another id", REFERENCE, HONEST), config)  # the id is not content
    assert key != verdict_key(VerifyJob("job", REFERENCE + "\n", HONEST), config)
    assert key != verdict_key(VerifyJob("job", REFERENCE, HONEST + "\n"), config)
    for judged in (dict(correctness_trials=3), dict(tolerance_policy="current"), dict(timing_samples=200),
                   dict(build_profile="default"), dict(seed=7)):
        assert verdict_key(JOB, replace(config, **judged)) != key, judged
    for incidental in (dict(build_cache_dir="/elsewhere"), dict(max_parallel_builds=64), dict(run_timeout_s=5.0),
                       dict(devices=[3]), dict(verdict_store_dir="/other/store")):
        assert verdict_key(JOB, replace(config, **incidental)) == key, incidental


def test_only_verdicts_executed_on_a_gpu_are_stored(config):
    store = VerdictStore(config.verdict_store_dir)
    assert not store.put(JOB, config, _measured(Status.NOT_EXECUTED))
    assert not store.put(JOB, config, _measured(Status.TIMEOUT))  # may be the host's fault: judge again
    assert not store.put(JOB, config, _measured(gpu=None))
    assert len(store) == 0
    assert store.put(JOB, config, _measured(Status.INCORRECT))
    assert store.put(JOB, config, _measured())  # the newer verdict replaces the older
    assert len(store) == 1
    assert store.get(JOB, config, local_gpu=None).status == Status.CORRECT


def test_reuse_needs_the_same_gpu_model_where_there_is_a_gpu(config):
    store = VerdictStore(config.verdict_store_dir)
    store.put(JOB, config, _measured())
    assert store.get(JOB, config, local_gpu="NVIDIA A100-SXM4-80GB") is None
    hit = store.get(JOB, config, local_gpu="NVIDIA H200")
    assert hit.speedup == 1.7 and hit.provenance["from_verdict_store"] and hit.provenance["gpu"] == "NVIDIA H200"
    assert store.get(JOB, replace(config, correctness_trials=2), local_gpu=None) is None


def test_a_damaged_entry_is_a_miss(config):
    store = VerdictStore(config.verdict_store_dir)
    store.put(JOB, config, _measured())
    next(store.root.glob("*/*.json")).write_text("{not json")
    assert store.get(JOB, config, local_gpu=None) is None


def test_batch_on_a_gpu_less_host_reuses_stored_verdicts(config, monkeypatch):
    monkeypatch.setattr("dice_pipeline.verify.api.gpu_inventory", lambda: [])
    config = replace(config, build_without_gpu=False)  # without the store: not_executed, no build
    VerdictStore(config.verdict_store_dir).put(JOB, config, _measured())
    static_case = next(c for c in STATIC_CASES if c.name == "torch_only_forward")
    other = VerifyJob("other", REFERENCE, HONEST.replace("2.0f", "3.0f"))
    verdicts = verify_batch([JOB, VerifyJob("static", REFERENCE, static_case.source), other], config)
    assert [v.status for v in verdicts] == [Status.CORRECT, Status.DECEPTIVE, Status.NOT_EXECUTED]
    assert verdicts[0].provenance["from_verdict_store"] and verdicts[0].speedup == 1.7
    # Nothing measured here, so nothing new was stored.
    assert len(VerdictStore(config.verdict_store_dir)) == 1


def test_the_pipeline_verifier_and_the_standalone_config_share_keys():
    # `dice synthesize` / the benchmarks on a GPU host use VerifyConfig defaults; the assets use KernelVerifier.
    from dice_pipeline.resources import KernelVerifier

    assert verdict_key(JOB, KernelVerifier().verify_config()) == verdict_key(JOB, VerifyConfig())


def test_extra_baselines_enter_the_key_only_when_asked_for():
    job = VerifyJob("j", "reference", "candidate")
    plain, with_graph = VerifyConfig(), VerifyConfig(extra_baselines=("cuda_graph",))
    # Eager-only judging is what it was before the option existed, so stores made then stay valid.
    assert verdict_key(job, plain) == verdict_key(job, VerifyConfig(extra_baselines=()))
    assert verdict_key(job, plain) != verdict_key(job, with_graph)
    assert verdict_key(job, with_graph) == verdict_key(job, VerifyConfig(extra_baselines=["cuda_graph", "cuda_graph"]))


def test_a_stored_verdict_whose_recorded_kernels_were_compiler_generated_is_judged_again_by_the_rule(config,
                                                                                                   monkeypatch):
    # Stored before the profiler rule existed: correct, though torch.compile's Triton kernels did the work.
    monkeypatch.setattr("dice_pipeline.verify.api.gpu_inventory", lambda: [])
    config = replace(config, build_without_gpu=False)
    compiled = _measured()
    compiled.provenance["kernels_seen"] = ["relu2_kernel(float const*, float*, long)", "triton_poi_fused_mul_relu_0"]
    VerdictStore(config.verdict_store_dir).put(JOB, config, compiled)
    (verdict,) = verify_batch([JOB], config)
    assert verdict.status == Status.DECEPTIVE and verdict.reason_codes() == ["generated_kernels_ran"]
    assert "triton_poi_fused_mul_relu_0" in verdict.reasons[0].message


def test_verdicts_round_trip_both_conventions():
    verdict = Verdict(status=Status.CORRECT, speedup=2.5, speedup_gpu=2.5, speedup_host=1.4, speedup_convention="gpu",
                      peak_gpu_memory_mb=12.0)
    again = Verdict.from_json(verdict.to_json())
    assert (again.speedup_gpu, again.speedup_host, again.speedup_convention) == (2.5, 1.4, "gpu")
    old = Verdict.from_dict({"status": "correct", "speedup": 1.7, "reasons": []})  # a 0.2 verdict stays readable
    assert old.speedup == 1.7 and old.speedup_gpu is None

def test_older_verdicts_are_used_only_when_asked_for_and_say_so(tmp_path):
    store, job, config = VerdictStore(tmp_path), VerifyJob("j", "ref", "cand"), VerifyConfig()
    old = Verdict(status=Status.CORRECT, speedup=3.0, provenance={"gpu": "NVIDIA H200", "verifier_version": "0.2.0"})
    path = tmp_path / verdict_key(job, config, "0.2.0")[:2] / f"{verdict_key(job, config, '0.2.0')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(old.to_json())
    assert store.get(job, config, "NVIDIA H200") is None
    found = store.get(job, config, "NVIDIA H200", accept_versions=("0.2.0",))
    assert found is not None and "older_verifier_version" in found.flags
    assert found.provenance["judged_by_verifier"] == "0.2.0" and found.speedup_host == 3.0
    assert found.speedup_convention == "host"
    with pytest.raises(ValueError, match="cannot be read"):
        store.get(job, config, None, accept_versions=("0.1.0",))


def test_verifier_0_3_1_verdicts_are_read_only_on_request_and_their_keys_are_unchanged(tmp_path):
    import hashlib
    import json

    from dice_pipeline.verify.store import _NOT_IN_KEY

    store, job, config = VerdictStore(tmp_path), VerifyJob("j", "ref", "cand"), VerifyConfig()
    # the key 0.3.1 computed: every judging field it knew, none of 0.4's (null_output_share)
    known = {k: v for k, v in sorted(config.to_dict().items())
             if k not in _NOT_IN_KEY and k != "null_output_share" and (v or k != "extra_baselines")}
    expected = hashlib.sha256(json.dumps({"verifier_version": "0.3.1", "reference": "ref", "candidate": "cand",
                                          "config": known}, sort_keys=True).encode()).hexdigest()
    assert verdict_key(job, config, "0.3.1") == expected != verdict_key(job, config)
    old = Verdict(status=Status.CORRECT, speedup=2.0, speedup_gpu=2.0, speedup_convention="gpu",
                  flags=["degenerate_task"], provenance={"gpu": "NVIDIA H100 80GB HBM3"})
    path = tmp_path / expected[:2] / f"{expected}.json"
    path.parent.mkdir(parents=True)
    path.write_text(old.to_json())
    assert store.get(job, config, "NVIDIA H100 80GB HBM3") is None  # never silently: it lacks 0.4's checks
    found = store.get(job, config, "NVIDIA H100 80GB HBM3", accept_versions=("0.3.1",))
    assert found.provenance["judged_by_verifier"] == "0.3.1" and "older_verifier_version" in found.flags


def test_new_config_fields_do_not_enter_an_older_versions_key():
    job = VerifyJob("j", "ref", "cand")
    assert verdict_key(job, VerifyConfig(), "0.2.0") == verdict_key(
        job, VerifyConfig(speedup_convention="host", baseline_kernel_policy="report"), "0.2.0")
    assert verdict_key(job, VerifyConfig()) != verdict_key(job, VerifyConfig(speedup_convention="host"))
    assert verdict_key(job, VerifyConfig()) == verdict_key(job, VerifyConfig(low_memory=True))

def test_infrastructure_errors_are_not_stored(tmp_path):
    store = VerdictStore(tmp_path)
    verdict = Verdict(status=Status.INFRASTRUCTURE_ERROR, reasons=[Reason("harness_out_of_memory", "x")],
                      provenance={"gpu": "NVIDIA H200"})
    assert not store.put(VerifyJob("j", "r", "c"), VerifyConfig(), verdict)
