"""Defaults from measurement (verify/inventory.py): judging lanes, the GPU workers' cores, builds side by side and
build groups are chosen from the GPUs' memory and the host's cores, so a default batch on a 16-core H100 or H200
host runs the best measured configuration (8 lanes, every core shared; benchmarks/RESULTS.md); and the pipeline's
KernelVerifier resource takes VerifyConfig's defaults, passing validated overrides through. Fake inventories."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from fake_workers import FakeWorkers, correct
from verify_cases import HONEST_KERNEL, REFERENCE, candidate

from dice_pipeline.verify import GpuInfo, VerifyConfig, VerifyJob, gpu_inventory, verify_batch
from dice_pipeline.verify.inventory import build_batch_size, choose_parallelism, default_lanes
from dice_pipeline.verify.scheduler import BatchRun

H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "580.159.04", "9.0", 81559)
H200 = GpuInfo(0, "NVIDIA H200", "580.159.04", "9.0", 143771)
SIXTEEN_CORES = list(range(16))


@pytest.mark.parametrize("gpu", [H100, H200], ids=["h100", "h200"])
def test_a_16_core_h100_or_h200_host_gets_the_best_measured_configuration(gpu):
    chosen = choose_parallelism(VerifyConfig(), [gpu], True, cores=SIXTEEN_CORES, memory_mb=256_000)
    # 8 lanes, a core a lane, which on 16 cores keeps none apart: workers and builds share every core
    assert (chosen.gpu_lanes, chosen.gpu_worker_cpus, chosen.max_parallel_builds) == (8, 8, 16)
    run = BatchRun(VerifyConfig(), gpus=[gpu])
    assert run.config.gpu_lanes == default_lanes([gpu], len(os.sched_getaffinity(0)))


def test_lanes_follow_the_gpus_memory_and_the_hosts_cores():
    small = replace(H100, memory_mb=24_576)  # a 24 GB card: three lanes of 8 GiB
    assert default_lanes([small], 64) == 3
    assert default_lanes([H200], 64) == 8  # never more than the most measured
    assert default_lanes([H100], 8) == 4  # two cores a lane
    assert default_lanes([H100, replace(H100, index=1)], 16) == 4  # the cores shared by both GPUs' lanes
    assert default_lanes([replace(H100, memory_mb=None)], 16) == 8  # memory unknown: the cores decide
    assert default_lanes([], 16) == 1


def test_a_big_host_keeps_a_core_a_lane_for_the_gpu_workers_and_builds_on_the_rest():
    chosen = choose_parallelism(VerifyConfig(), [H100], True, cores=list(range(64)), memory_mb=512_000)
    assert (chosen.gpu_lanes, chosen.gpu_worker_cpus, chosen.max_parallel_builds) == (8, 8, 56)
    memory_bound = choose_parallelism(VerifyConfig(), [H100], True, cores=list(range(64)), memory_mb=9_216)
    assert memory_bound.max_parallel_builds == 3  # 3 GiB a build
    cpu_host = choose_parallelism(VerifyConfig(), [], False, cores=[0, 1], memory_mb=16_000)
    assert (cpu_host.gpu_lanes, cpu_host.max_parallel_builds) == (1, 2)


def test_set_values_are_kept_as_given():
    given = VerifyConfig(gpu_lanes=3, gpu_worker_cpus=0, max_parallel_builds=5)
    chosen = choose_parallelism(given, [H100], True, cores=SIXTEEN_CORES, memory_mb=256_000)
    assert (chosen.gpu_lanes, chosen.gpu_worker_cpus, chosen.max_parallel_builds) == (3, 0, 5)
    with pytest.raises(ValueError, match="gpu_lanes"):
        VerifyConfig(gpu_lanes=0)


def test_build_groups_give_every_build_slot_a_share_up_to_the_measured_size():
    config = VerifyConfig()
    assert build_batch_size(config, 67, 8) == 8  # the measured batch: groups of 8
    assert build_batch_size(config, 16, 8) == 2  # a small batch: every slot busy
    assert build_batch_size(config, 3, 8) == 2  # identical extensions still planned once in a group of 2 or more
    assert build_batch_size(replace(config, build_batch_size=1), 67, 8) == 1


def test_a_default_batch_plans_its_groups_from_the_build_slots(tmp_path):
    workers = FakeWorkers(run=correct())
    jobs = [VerifyJob(f"c{n}", REFERENCE, candidate(cuda_source=HONEST_KERNEL.replace("256", str(n))))
            for n in range(32, 32 * 9, 32)]
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), verdict_store_dir=None, execute=False,
                          use_precompiled_header=False, parallel_group_builds=4)
    verify_batch(jobs, config, gpus=[], worker_runner=workers)
    # 8 candidates over 4 group-build slots: 4 groups of 2, not one of 8 with three slots idle
    assert sorted(len(r["group_extensions"]) for r in workers.stage("group_build")) == [2, 2, 2, 2]


def test_gpu_inventory_reads_each_gpus_memory(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nprintf '0, NVIDIA H200, 580.159.04, 9.0, 143771\\n1, NVIDIA H200, 580.159.04, 9.0, "
                      "[N/A]\\n'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.memory_mb for g in gpu_inventory()] == [143771, None]


# --- the pipeline's resource --------------------------------------------------------------------------------------
def test_the_verifier_resource_takes_verifyconfigs_defaults_and_its_own_two_settings():
    from dice_pipeline.resources import KernelVerifier, pipeline_verify_settings

    config = KernelVerifier().verify_config()
    library = VerifyConfig()
    differ = {k for k, v in config.to_dict().items() if library.to_dict()[k] != v}
    assert differ == set(pipeline_verify_settings()) == {"verdict_store_dir", "build_without_gpu"}
    assert config.gpu_lanes is None and config.build_cache_dir == library.build_cache_dir  # one cache folder


def test_the_verifier_resource_passes_validated_overrides_through():
    from dice_pipeline.resources import KernelVerifier

    config = KernelVerifier(execute="never", overrides={"gpu_lanes": 4, "extra_baselines": ["compile"],
                                                       "device_lock_dir": "", "verdict_store_dir": ""}
                            ).verify_config()
    assert (config.execute, config.gpu_lanes, config.extra_baselines) == (False, 4, ("compile",))
    assert config.device_lock_dir is None and config.verdict_store_dir is None  # "" is None (no null in a map)
    with pytest.raises(ValueError, match="not VerifyConfig fields"):
        KernelVerifier(overrides={"gpu_lane": 4}).verify_config()
    with pytest.raises(ValueError, match="gpu_lanes"):
        KernelVerifier(overrides={"gpu_lanes": 0}).verify_config()
    with pytest.raises(ValueError, match="execute"):
        KernelVerifier(execute="sometimes").verify_config()
