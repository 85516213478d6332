"""The GPU pool never hands one GPU to two workers at once (threads and processes contending for fake device
indices), and the verifier's GPU stage holds the lock of the device it times on."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dice_pipeline.gpu_pool import DevicePool, compile_workers, device_lock


def _overlaps(intervals: list[tuple[int, float, float]]) -> list[tuple]:
    """Pairs of holds of the same device whose time spans intersect."""
    clashes = []
    by_device: dict[int, list[tuple[float, float]]] = {}
    for device, start, end in intervals:
        by_device.setdefault(device, []).append((start, end))
    for device, spans in by_device.items():
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            if s2 < e1:
                clashes.append((device, (s1, e1), (s2, e2)))
    return clashes


def _hold_repeatedly(lock_dir: str, devices: list[int], rounds: int, log_path: str) -> None:
    pool = DevicePool(devices, lock_dir)
    for _ in range(rounds):
        with pool.lease() as lease:
            start = time.time()
            time.sleep(0.02)
            end = time.time()
        with open(log_path, "a") as log:
            log.write(f"{lease.devices[0]} {start!r} {end!r}\n")


def test_processes_and_threads_never_share_a_device(tmp_path):
    lock_dir, log_path = str(tmp_path / "locks"), str(tmp_path / "holds.txt")
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_hold_repeatedly, args=(lock_dir, [0, 1], 8, log_path)) for _ in range(3)]
    threads = [threading.Thread(target=_hold_repeatedly, args=(lock_dir, [0, 1], 8, log_path)) for _ in range(3)]
    for worker in processes + threads:
        worker.start()
    for worker in processes + threads:
        worker.join(timeout=60)
    assert all(p.exitcode == 0 for p in processes)
    holds = [(int(d), float(s), float(e)) for d, s, e in
             (line.split() for line in Path(log_path).read_text().splitlines())]
    assert len(holds) == 6 * 8
    assert {d for d, _, _ in holds} == {0, 1}  # both GPUs were handed out
    assert _overlaps(holds) == []


def test_a_lease_takes_all_its_devices_or_waits(tmp_path):
    pool = DevicePool([0, 1, 2], str(tmp_path))
    with pool.lease(2) as first:
        assert len(set(first.devices)) == 2
        assert first.env()["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, first.devices))
        with pytest.raises(TimeoutError):
            with pool.lease(2, timeout_s=0.2):
                pass
        with pool.lease(1, timeout_s=1) as second:  # the third device is still free
            assert set(second.devices).isdisjoint(first.devices)
    with pool.lease(3, timeout_s=1) as everything:
        assert sorted(everything.devices) == [0, 1, 2]
    with pytest.raises(ValueError):
        with pool.lease(4):
            pass


def test_a_dead_holder_releases_its_device(tmp_path):
    def hold_and_die():
        import os
        with device_lock(str(tmp_path), 0):
            os._exit(1)  # no cleanup runs: the kernel drops the flock with the process

    child = multiprocessing.get_context("fork").Process(target=hold_and_die)
    child.start()
    child.join(timeout=30)
    with device_lock(str(tmp_path), 0, timeout_s=2):
        pass


def test_compile_pool_is_sized_by_cores_and_memory():
    assert compile_workers(cpu_cores=16, memory_mb=256_000, reserved_cores=2) == 14
    assert compile_workers(cpu_cores=16, memory_mb=12_288, build_memory_mb=3072) == 4  # memory-bound
    assert compile_workers(cpu_cores=2, memory_mb=100, reserved_cores=2) == 1
    assert compile_workers() >= 1


@pytest.mark.parametrize("prestart", [True, False])
def test_two_verify_batches_never_judge_on_one_gpu_at_once(tmp_path, monkeypatch, prestart):
    """Two concurrent batches (as two Dagster runs would be) over the same two fake GPUs: with a shared lock
    directory, no two judge calls overlap on one device."""
    from dice_pipeline.verify import GpuInfo, VerifyConfig, VerifyJob, verify_batch

    holds: list[tuple[int, float, float]] = []
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "verify"))
    from fake_workers import FakeWorkers, correct
    from verify_cases import HONEST, REFERENCE

    def judge(request, launch):
        if launch.gate is not None:
            launch.gate.wait()  # as the real worker: nothing runs on the GPU before its turn
        start = time.time()
        time.sleep(0.05)
        holds.append((launch.device, start, time.time()))
        return correct("Test GPU")

    gpus = [GpuInfo(0, "Test GPU", "0", "9.0"), GpuInfo(1, "Test GPU", "0", "9.0")]
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), device_lock_dir=str(tmp_path / "locks"),
                          prestart_gpu_workers=prestart, max_parallel_builds=2, gpu_lanes=1)
    jobs = [VerifyJob(f"j{i}", REFERENCE, HONEST.replace("2.0f", f"{i + 2}.0f")) for i in range(6)]
    results: list = []
    batches = [threading.Thread(target=lambda: results.append(
        verify_batch(jobs, replace(config), gpus=gpus, worker_runner=FakeWorkers(run=judge)))) for _ in range(2)]
    for batch in batches:
        batch.start()
    for batch in batches:
        batch.join(timeout=60)
    assert len(results) == 2 and all(len(r) == 6 for r in results)
    assert len(holds) == 12
    assert _overlaps(holds) == []
