"""Judging lanes on one GPU (VerifyConfig.gpu_lanes): the parent's shared/exclusive hold and the worker's pipe to it.
No GPU needed: the workers are plain processes that record when they held what."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from dice_pipeline.gpu_pool import SharedGpu, _try_lock
from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.sandbox import run_isolated, scrubbed_environment

REPO_ROOT = str(Path(__file__).resolve().parents[3])

# A stand-in for a run-stage worker: shared use of the GPU, a timed section alone, shared again; it records when.
LANE_WORKER = """
import json, sys, time
from dice_pipeline.verify.gpu_share import GpuShareClient
client = GpuShareClient.from_env()
spans = []
client.start()
t = time.monotonic(); time.sleep({untimed}); spans.append(["shared", t, time.monotonic()])
with client.exclusive():
    t = time.monotonic(); time.sleep({timed}); spans.append(["exclusive", t, time.monotonic()])
t = time.monotonic(); time.sleep({untimed}); spans.append(["shared", t, time.monotonic()])
open(sys.argv[1], "w").write(json.dumps({{"spans": spans, "summary": client.summary()}}))
"""


def _run_lane(tmp_path: Path, name: str, gpu: SharedGpu, code: str, timeout_s: float = 30.0):
    work = tmp_path / name
    work.mkdir()
    out = work / "spans.json"
    result = run_isolated([sys.executable, "-c", code, str(out)], cwd=work,
                          env=scrubbed_environment({"PYTHONPATH": REPO_ROOT}), timeout_s=timeout_s,
                          isolate_network=False, gpu_share=gpu)
    return result, (json.loads(out.read_text()) if out.exists() else None)


def _overlap(a: list, b: list) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_shared_holds_overlap_and_an_exclusive_one_waits_for_them(tmp_path):
    gpu = SharedGpu(0, lock_dir=tmp_path / "locks")
    gpu.acquire(SharedGpu.SHARED)
    gpu.acquire(SharedGpu.SHARED)  # two lanes' untimed work side by side
    assert gpu.state() == {"shared": 2, "exclusive": False, "waiting_exclusive": 0,
                            "waiting_whole": 0, "residents": 0}
    assert _try_lock(tmp_path / "locks", 0) is None  # another process cannot take the GPU meanwhile
    granted = threading.Event()
    waiter = threading.Thread(target=lambda: (gpu.acquire(SharedGpu.EXCLUSIVE), granted.set()))
    waiter.start()
    time.sleep(0.2)
    assert not granted.is_set()
    gpu.release(SharedGpu.SHARED)
    time.sleep(0.1)
    assert not granted.is_set()  # one shared holder left
    gpu.release(SharedGpu.SHARED)
    waiter.join(timeout=5)
    assert granted.is_set() and gpu.state()["exclusive"] is True
    gpu.release(SharedGpu.EXCLUSIVE)
    fd = _try_lock(tmp_path / "locks", 0)  # idle again: the device's lock file is free
    assert fd is not None


def test_a_waiting_exclusive_request_keeps_new_shared_holders_out(tmp_path):
    """Writers first: a timed section never waits behind an endless stream of untimed work."""
    gpu = SharedGpu(0, lock_dir=None)
    gpu.acquire(SharedGpu.SHARED)
    order: list[str] = []
    writer = threading.Thread(target=lambda: (gpu.acquire(SharedGpu.EXCLUSIVE), order.append("exclusive"),
                                              time.sleep(0.1), gpu.release(SharedGpu.EXCLUSIVE)))
    writer.start()
    time.sleep(0.1)
    reader = threading.Thread(target=lambda: (gpu.acquire(SharedGpu.SHARED), order.append("shared"),
                                              gpu.release(SharedGpu.SHARED)))
    reader.start()
    time.sleep(0.1)
    assert order == []  # the new shared holder waits behind the exclusive request
    gpu.release(SharedGpu.SHARED)
    writer.join(timeout=5)
    reader.join(timeout=5)
    assert order == ["exclusive", "shared"]


def test_exclusive_requests_are_served_in_order(tmp_path):
    gpu = SharedGpu(0, lock_dir=None)
    gpu.acquire(SharedGpu.EXCLUSIVE)
    order: list[int] = []
    threads = []
    for k in range(4):
        thread = threading.Thread(target=lambda k=k: (gpu.acquire(SharedGpu.EXCLUSIVE), order.append(k),
                                                      gpu.release(SharedGpu.EXCLUSIVE)))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)
    gpu.release(SharedGpu.EXCLUSIVE)
    for thread in threads:
        thread.join(timeout=5)
    assert order == [0, 1, 2, 3]


def test_release_of_what_is_not_held_is_an_error():
    gpu = SharedGpu(0, lock_dir=None)
    with pytest.raises(RuntimeError):
        gpu.release(SharedGpu.SHARED)
    with pytest.raises(ValueError):
        gpu.acquire("both")


def test_worker_processes_time_alone_and_share_the_rest(tmp_path):
    """Three lane processes through the sandbox: no exclusive span overlaps any other process's span, shared spans
    do overlap (the point of lanes), and every worker's summary says it shared."""
    gpu = SharedGpu(0, lock_dir=tmp_path / "locks")
    code = LANE_WORKER.format(untimed=0.6, timed=0.3)
    results: dict[str, tuple] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, _run_lane(tmp_path, n, gpu, code)))
               for n in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    spans = {name: payload["spans"] for name, (result, payload) in results.items()}
    assert all(result.returncode == 0 and not result.timed_out for result, _ in results.values())
    for name, own in spans.items():
        for other_name, other in spans.items():
            if other_name == name:
                continue
            for span in own:
                if span[0] == "exclusive":
                    assert not any(_overlap(span, o) for o in other), (name, other_name)
    assert any(_overlap(a, b) for a in spans["a"] for b in spans["b"] if a[0] == b[0] == "shared")
    for result, payload in results.values():
        assert payload["summary"]["lanes_shared"] is True and payload["summary"]["gate_requests"] == 3
    assert sum(result.gpu_wait_s for result, _ in results.values()) > 0.2  # someone waited for a timed section
    assert gpu.state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0,
                            "waiting_whole": 0, "residents": 0}
    assert _try_lock(tmp_path / "locks", 0) is not None


# A worker whose timed section is its last GPU use: it gives the GPU up after it and records when it got there.
LAST_USE_WORKER = """
import json, sys, time
from dice_pipeline.verify.gpu_share import GpuShareClient
client = GpuShareClient.from_env()
client.start()
with client.exclusive(then_release={then_release}):
    started = time.monotonic(); time.sleep(1.0); timed_end = time.monotonic()
after = time.monotonic()
open(sys.argv[1], "w").write(json.dumps({{"timed": [started, timed_end], "after": after, "mode": client.mode,
                                          "summary": client.summary()}}))
"""


@pytest.mark.parametrize("then_release", [True, False])
def test_a_lane_whose_timing_is_its_last_gpu_use_does_not_wait_for_the_queued_timed_sections(tmp_path, then_release):
    """Shared use gives way to queued timed sections (writers first): a lane asking for it again after its own
    timed section waits for all of them; one that gives the GPU up goes on at once, and the queued section starts
    right after its own."""
    gpu = SharedGpu(0, lock_dir=None)
    lane = threading.Thread(target=lambda: result.append(_run_lane(
        tmp_path, "lane", gpu, LAST_USE_WORKER.format(then_release=then_release))))
    result: list = []
    lane.start()
    deadline = time.monotonic() + 20
    while not gpu.state()["exclusive"] and time.monotonic() < deadline:  # the lane's timed section began
        time.sleep(0.01)
    queued: dict[str, float] = {}

    def other_lane() -> None:  # another lane's timed section, queued behind the first, 1.5 s long
        gpu.acquire(SharedGpu.EXCLUSIVE)
        queued["start"] = time.monotonic()
        time.sleep(1.5)
        queued["end"] = time.monotonic()
        gpu.release(SharedGpu.EXCLUSIVE)

    other = threading.Thread(target=other_lane)
    other.start()
    lane.join(timeout=30)
    other.join(timeout=30)
    outcome, payload = result[0]
    assert outcome.returncode == 0 and payload is not None
    assert queued["start"] >= payload["timed"][1]  # timed sections never overlap either way
    if then_release:
        assert payload["mode"] is None and payload["after"] < queued["end"] - 1.0
    else:
        assert payload["mode"] == SharedGpu.SHARED and payload["after"] >= queued["end"]
    assert gpu.state()["shared"] == 0 and not gpu.state()["exclusive"]


def test_time_waiting_for_the_gpu_does_not_count_against_a_worker(tmp_path):
    """A worker whose own work fits its limit is not timed out because another lane had the GPU."""
    gpu = SharedGpu(0, lock_dir=None)
    gpu.acquire(SharedGpu.EXCLUSIVE)  # another lane's timed section, 2 s long
    threading.Timer(2.0, gpu.release, args=(SharedGpu.EXCLUSIVE,)).start()
    result, payload = _run_lane(tmp_path, "late", gpu, LANE_WORKER.format(untimed=0.1, timed=0.1), timeout_s=1.5)
    assert not result.timed_out and result.returncode == 0
    assert result.gpu_wait_s >= 1.5
    assert payload["summary"]["gate_wait_s"] >= 1.5


def test_a_worker_killed_while_timing_gives_the_gpu_back(tmp_path):
    """A hung candidate holding the GPU alone is killed at its limit and the other lanes go on."""
    gpu = SharedGpu(0, lock_dir=tmp_path / "locks")
    hung = LANE_WORKER.format(untimed=0.0, timed=600)
    result, payload = _run_lane(tmp_path, "hung", gpu, hung, timeout_s=1.0)
    assert result.timed_out and payload is None
    assert gpu.state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0,
                            "waiting_whole": 0, "residents": 0}
    result, payload = _run_lane(tmp_path, "next", gpu, LANE_WORKER.format(untimed=0.0, timed=0.0))
    assert result.returncode == 0 and payload["summary"]["gate_requests"] == 3


def test_garbage_on_the_pipe_is_ignored_and_a_release_frees_the_gpu(tmp_path):
    gpu = SharedGpu(0, lock_dir=None)
    code = """
import os, sys, time
from dice_pipeline.verify.gpu_share import ENV_VAR
request_w, grant_r = (int(x) for x in os.environ[ENV_VAR].split(","))
os.write(request_w, b"zz")  # nothing
os.write(request_w, b"X"); os.read(grant_r, 1)
open(sys.argv[1], "w").write("{}")
os.write(request_w, b"R")
time.sleep(0.5)
"""
    holder: dict[str, object] = {}
    thread = threading.Thread(target=lambda: holder.__setitem__("r", _run_lane(tmp_path, "raw", gpu, code)))
    thread.start()
    deadline = time.monotonic() + 20
    while not (tmp_path / "raw" / "spans.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert gpu.state()["exclusive"] is False  # released while the worker still runs
    thread.join(timeout=20)


def test_the_client_without_a_parent_is_a_no_op():
    from dice_pipeline.verify.gpu_share import GpuShareClient

    calls: list[str] = []
    client = GpuShareClient(None, before_release=lambda: calls.append("sync"))
    client.start()
    with client.exclusive():
        assert client.mode == SharedGpu.EXCLUSIVE
    assert client.mode == SharedGpu.SHARED and calls == ["sync", "sync"]
    assert client.summary() == {"lanes_shared": False, "gate_requests": 0, "gate_wait_s": 0.0}


def test_gpu_lanes_is_validated_and_kept_out_of_the_verdict_key():
    from dice_pipeline.verify.store import _NOT_IN_KEY

    with pytest.raises(ValueError):
        VerifyConfig(gpu_lanes=0)
    assert "gpu_lanes" in _NOT_IN_KEY


def test_a_lane_takes_the_whole_gpu_from_the_start_when_its_task_will_not_fit_its_share():
    from dice_pipeline.verify.worker import needs_whole_gpu

    gib = 2**30
    h200_third = 0.3 * 139 * gib  # three lanes on an H200
    # Level-1 elementwise tasks: 6 GiB in, 6 GiB out, peaked at 49.5 GiB and ran out of a third of an H200.
    assert needs_whole_gpu(6 * gib, 6 * gib, h200_third)
    # A matrix-vector product: 8 GiB in, a small output, peaked at 18.7 GiB inside its third.
    assert not needs_whole_gpu(8 * gib, 1 << 20, h200_third)
    # A 2 GiB convolution (peak 20 GiB) shares the GPU.
    assert not needs_whole_gpu(2 * gib, 2 * gib, h200_third)


def test_the_whole_gpu_rule_separates_the_swept_tasks_that_ran_out_of_their_share():
    # The level-1 rows of the 2026-12-05 sweeps (three lanes on an H200, two on an H100): every task that ran out of
    # its lane's memory is foreseen, and none that fit is. Outputs are sized on the meta device (nothing allocated).
    import json
    from pathlib import Path

    import torch

    from dice_pipeline.paths import kernelbench_tasks_path
    from dice_pipeline.verify.worker import needs_whole_gpu

    tasks_path = kernelbench_tasks_path()
    if tasks_path is None or not tasks_path.is_file() or tasks_path.suffix != ".jsonl":
        pytest.skip("KernelBench's tasks.jsonl is not beside the checkout (DICE_KERNELBENCH_TASKS)")
    codes = {}
    for line in tasks_path.read_text().splitlines():
        task = json.loads(line)
        codes[f"L{task['level']}/{task['name']}"] = task["code"]
    root = Path(__file__).resolve().parents[3]
    sweep = root / "benchmarks/results/kernelbench_l1_sweep_gated_lanes_2026-12-05/sweep_state.jsonl"
    outcome = {"foreseen": 0, "missed": 0, "needless": 0, "shared": 0}
    for row in map(json.loads, sweep.read_text().splitlines()):
        provenance = row["provenance"]
        total_mb = 143771 if "H200" in provenance["gpu"] else 81559  # nvidia-smi's memory.total of each
        budget = 0.9 / provenance["gpu_share"]["lanes"] * total_mb * 2**20  # the sweep's lane share
        namespace: dict = {}
        exec(compile(codes[row["task_id"]], row["task_id"], "exec"), namespace)  # noqa: S102 - KernelBench's code
        with torch.device("meta"):
            output = namespace["Model"](*namespace["get_init_inputs"]())(*namespace["get_inputs"]())
        outputs = output if isinstance(output, (tuple, list)) else [output]
        out_bytes = sum(o.numel() * o.element_size() for o in outputs if isinstance(o, torch.Tensor))
        predicted = needs_whole_gpu(provenance["input_bytes"], out_bytes, budget)
        ran_out = provenance.get("first_attempt_out_of_memory") is not None
        outcome[("foreseen" if predicted else "missed") if ran_out else ("needless" if predicted else "shared")] += 1
    assert outcome == {"foreseen": 23, "missed": 0, "needless": 0, "shared": 53}


# --- whole use: the GPU and its memory, granted only when no other lane's worker holds task memory ---------------
def _in_thread(fn) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (fn(), done.set()), daemon=True)
    thread.start()
    return thread, done


def test_a_whole_request_waits_for_a_resident_that_only_waits_for_its_timed_section():
    """The sweep's out-of-memory case: lane A needs the whole GPU while lane B's worker is in mid-task. Holding the
    gate alone is not enough (B's tensors stay resident while B waits), so A waits until B's worker has ended; B's
    own timed section and its return to shared use go ahead meanwhile."""
    gpu = SharedGpu(0, lock_dir=None)
    a, b = object(), object()
    gpu.acquire(SharedGpu.SHARED, holder=a)
    gpu.acquire(SharedGpu.SHARED, holder=b)
    gpu.release(SharedGpu.SHARED)  # A frees its share and asks for the whole GPU
    _, whole = _in_thread(lambda: gpu.acquire(SharedGpu.WHOLE, holder=a))
    time.sleep(0.1)
    assert not whole.is_set() and gpu.state()["waiting_whole"] == 1
    gpu.release(SharedGpu.SHARED)  # B: its timed section, alone
    _, timed = _in_thread(lambda: gpu.acquire(SharedGpu.EXCLUSIVE, holder=b))
    assert timed.wait(2) and not whole.is_set()  # the exclusive gate alone is not A's grant
    gpu.release(SharedGpu.EXCLUSIVE)
    _, back = _in_thread(lambda: gpu.acquire(SharedGpu.SHARED, holder=b))
    assert back.wait(2)  # a resident goes on with its task although a whole request is queued
    time.sleep(0.1)
    assert not whole.is_set()
    gpu.release(SharedGpu.SHARED)
    time.sleep(0.1)
    assert not whole.is_set()  # B's worker is still alive (its memory too) until it leaves
    gpu.leave(b)
    assert whole.wait(2) and gpu.whole_grants == 1
    gpu.release(SharedGpu.WHOLE)
    gpu.leave(a)
    assert gpu.state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0, "waiting_whole": 0,
                           "residents": 0}


def test_a_new_worker_waits_while_a_whole_request_is_queued_and_held():
    gpu = SharedGpu(0, lock_dir=None)
    a, b, c = object(), object(), object()
    gpu.acquire(SharedGpu.SHARED, holder=b)
    _, whole = _in_thread(lambda: gpu.acquire(SharedGpu.WHOLE, holder=a))
    time.sleep(0.05)
    _, newcomer = _in_thread(lambda: gpu.acquire(SharedGpu.SHARED, holder=c))
    _, newcomer_timed = _in_thread(lambda: gpu.acquire(SharedGpu.EXCLUSIVE, holder=object()))
    time.sleep(0.1)
    assert not newcomer.is_set() and not newcomer_timed.is_set()  # no new task memory on the GPU meanwhile
    gpu.release(SharedGpu.SHARED)
    gpu.leave(b)
    assert whole.wait(2) and not newcomer.is_set()
    gpu.release(SharedGpu.WHOLE)
    gpu.leave(a)
    assert newcomer_timed.wait(2) and not newcomer.is_set()  # writers first, as ever
    gpu.release(SharedGpu.EXCLUSIVE)
    assert newcomer.wait(2)


def test_two_lanes_asking_for_the_whole_gpu_at_once_take_turns():
    """Both lanes' next tasks are big: each frees its memory and asks; the first asked goes first, the second
    after the first's worker ends (no deadlock of two residents waiting for each other)."""
    gpu = SharedGpu(0, lock_dir=None)
    a, b = object(), object()
    gpu.acquire(SharedGpu.SHARED, holder=a)
    gpu.acquire(SharedGpu.SHARED, holder=b)
    gpu.release(SharedGpu.SHARED)
    order: list[str] = []
    _, first = _in_thread(lambda: (gpu.acquire(SharedGpu.WHOLE, holder=a), order.append("a")))
    time.sleep(0.05)
    gpu.release(SharedGpu.SHARED)
    _, second = _in_thread(lambda: (gpu.acquire(SharedGpu.WHOLE, holder=b), order.append("b")))
    assert first.wait(2)
    time.sleep(0.1)
    assert not second.is_set()
    gpu.release(SharedGpu.WHOLE)
    time.sleep(0.1)
    assert not second.is_set()  # A's worker is still alive
    gpu.leave(a)
    assert second.wait(2) and order == ["a", "b"]
    gpu.release(SharedGpu.WHOLE)
    gpu.leave(b)


WHOLE_WORKER = """
import json, sys, time
from dice_pipeline.gpu_pool import SharedGpu
from dice_pipeline.verify.gpu_share import GpuShareClient
client = GpuShareClient.from_env()
client.start()
time.sleep({before})
client.start(SharedGpu.WHOLE)
t = time.monotonic(); time.sleep(0.3); spans = [["whole", t, time.monotonic()]]
with client.exclusive():  # a timed section inside whole use needs no other grant
    pass
open(sys.argv[1], "w").write(json.dumps({{"spans": spans, "summary": client.summary()}}))
"""


def test_worker_processes_whole_use_overlaps_no_other_workers_life(tmp_path):
    """Through the sandbox: the whole span overlaps no span of a lane whose worker was alive when it asked, nor of
    one that started after, and the server forgets each worker once it exits."""
    gpu = SharedGpu(0, lock_dir=tmp_path / "locks")
    results: dict[str, tuple] = {}

    def lane(name: str, code: str, delay: float = 0.0) -> threading.Thread:
        def run() -> None:
            time.sleep(delay)
            results[name] = _run_lane(tmp_path, name, gpu, code)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = [lane("small", LANE_WORKER.format(untimed=0.8, timed=0.2)),
               lane("big", WHOLE_WORKER.format(before=0.3)),
               lane("later", LANE_WORKER.format(untimed=0.1, timed=0.1), delay=1.0)]
    for thread in threads:
        thread.join(timeout=60)
    assert all(result.returncode == 0 and not result.timed_out for result, _ in results.values())
    [whole] = results["big"][1]["spans"]
    for name in ("small", "later"):
        spans = results[name][1]["spans"]
        life = ["life", spans[0][1], spans[-1][2]]
        assert not _overlap(whole, life), name
    assert whole[1] > results["small"][1]["spans"][-1][2]  # it waited for the small lane's worker to finish
    assert results["big"][1]["summary"]["gate_requests"] == 2
    assert gpu.whole_grants == 1 and gpu.state()["residents"] == 0


def test_a_reference_call_s_workspace_counts_toward_the_whole_gpu_rule():
    """The 2026-12-05 H100 sweep (two lanes): HuberLoss (8 GiB in, a scalar out) and the cumsum variants (4 GiB in
    and out) ran out of their share because their reference calls hold temporaries as large as the input. With
    the probe call's measured workspace (its input clone and temporaries) they are foreseen."""
    from dice_pipeline.verify.worker import needs_whole_gpu

    gib = 2**30
    h100_half = 0.45 * 81559 * 2**20
    assert not needs_whole_gpu(8 * gib, 4, h100_half)  # the rule without the workspace missed HuberLoss
    assert needs_whole_gpu(8 * gib, 4, h100_half, workspace_bytes=12 * gib)
    assert not needs_whole_gpu(4 * gib, 4 * gib, h100_half)  # nor exclusive cumsum
    assert needs_whole_gpu(4 * gib, 4 * gib, h100_half, workspace_bytes=8 * gib)
    # A task whose call needs little beyond its input and output still shares the GPU.
    assert not needs_whole_gpu(2 * gib, 2 * gib, h100_half, workspace_bytes=2 * gib)


def test_whole_use_waits_until_the_device_reports_the_memory_free():
    from dice_pipeline.verify.worker import wait_for_free_memory

    gib = 2**30
    now = [0.0]
    frees = iter([10 * gib, 20 * gib, 60 * gib])  # a finished worker's memory being freed by the driver
    seen = wait_for_free_memory(50 * gib, lambda: (next(frees), 80 * gib), timeout_s=30, poll_s=0.5,
                                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert seen == {"free_mb": 60 * 1024, "needed_mb": 50 * 1024, "waited_s": 1.0, "enough": True}
    now[0] = 0.0
    held = wait_for_free_memory(50 * gib, lambda: (10 * gib, 80 * gib), timeout_s=2, poll_s=0.5,
                                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert held["enough"] is False and held["waited_s"] == 2.0  # it gives up and says so


def test_a_worker_leaves_the_residents_only_once_its_process_is_reaped():
    """The pipe closes as a worker exits, before the driver has freed its memory: the server releases the gate on
    EOF, but the worker stays a resident (whole requests keep waiting) until close(), which the sandbox calls after
    the process group is dead."""
    import os

    from dice_pipeline.verify.gpu_share import GpuShareServer

    gpu = SharedGpu(0, lock_dir=None)
    server = GpuShareServer(gpu)
    request_w, grant_r = (os.dup(fd) for fd in server.child_fds())
    server.start()
    os.write(request_w, b"S")
    assert os.read(grant_r, 1) == b"G"
    assert gpu.state()["residents"] == 1 and gpu.state()["shared"] == 1
    os.close(request_w)  # the worker exits
    os.close(grant_r)
    deadline = time.monotonic() + 5
    while gpu.state()["shared"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gpu.state()["shared"] == 0 and gpu.state()["residents"] == 1
    server.close()
    assert gpu.state()["residents"] == 0


def test_the_measured_workspace_foresees_the_h100_rows_that_ran_out_of_their_share():
    """The evening H100 sweep's second run (two lanes): every task it took whole was foreseen with the reference
    call's measured workspace, and the three whose temporaries the input/output estimate left out (the cumsum
    variants and HuberLoss, which ran out of their share in the run before) are not foreseen without it."""
    import json

    from dice_pipeline.verify.worker import needs_whole_gpu

    root = Path(__file__).resolve().parents[3]
    rows = root / "benchmarks/results/kernelbench_l1_sweep_h100_2026-12-05_evening/run2_rows.jsonl"
    budget = 0.45 * 81559 * 2**20  # nvidia-smi's memory.total of the H100, 0.9 split between two lanes
    without_workspace = []
    for row in map(json.loads, rows.read_text().splitlines()):
        whole = row["provenance"]["whole_gpu_from_the_start"]
        input_bytes, out_bytes = row["provenance"]["input_bytes"], int(whole["output_mb"] * 2**20)
        assert needs_whole_gpu(input_bytes, out_bytes, budget, row["provenance"]["reference_workspace_bytes"])
        if not needs_whole_gpu(input_bytes, out_bytes, budget):
            without_workspace.append(row["task_id"])
    assert sorted(without_workspace) == ["L1/91_cumsum_reverse", "L1/92_cumsum_exclusive", "L1/96_HuberLoss"]


# --- a prestarted worker starting CUDA before its go (worker.start_cuda_before_go) --------------------------------
PRESTARTED_WORKER = """
import json, sys, time
from pathlib import Path
from dice_pipeline.verify.gpu_share import GpuShareClient
client = GpuShareClient.from_env()
spans = []
with client.starting_cuda():
    t = time.monotonic(); time.sleep(0.2); spans.append(["starting_cuda", t, time.monotonic()])
Path(sys.argv[1] + ".waiting").write_text("")
while not Path({gate!r}).exists():
    time.sleep(0.005)
client.start()
t = time.monotonic(); time.sleep(0.1); spans.append(["shared", t, time.monotonic()])
open(sys.argv[1], "w").write(json.dumps({{"spans": spans, "summary": client.summary()}}))
"""


def test_cuda_start_before_the_go_waits_out_timed_sections_holds_no_residency_and_no_limit(tmp_path):
    """The prestarted worker's CUDA start-up is shared use (it waits for another lane's timed section), leaves it
    no resident (a lane waiting for the whole GPU is not held up by a worker still waiting for its go), and its
    wait is not added to the limit, which counts from the go."""
    gpu = SharedGpu(0, lock_dir=None)
    work = tmp_path / "pre"
    work.mkdir()
    out, gate_path = work / "spans.json", work / "go"
    gate = threading.Event()
    gpu.acquire(SharedGpu.EXCLUSIVE)  # another lane's timed section
    released_at: list[float] = []

    def end_timed_section() -> None:
        time.sleep(1.0)
        released_at.append(time.monotonic())
        gpu.release(SharedGpu.EXCLUSIVE)

    threading.Thread(target=end_timed_section, daemon=True).start()
    holder: dict[str, object] = {}
    thread = threading.Thread(target=lambda: holder.__setitem__("r", run_isolated(
        [sys.executable, "-c", PRESTARTED_WORKER.format(gate=str(gate_path)), str(out)], cwd=work,
        env=scrubbed_environment({"PYTHONPATH": REPO_ROOT}), timeout_s=1.0, isolate_network=False,
        gate=gate, gate_path=gate_path, gpu_share=gpu)))
    thread.start()
    deadline = time.monotonic() + 20
    while not Path(str(out) + ".waiting").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gpu.state() == {"shared": 0, "exclusive": False, "waiting_exclusive": 0, "waiting_whole": 0,
                           "residents": 0}
    lane = object()  # another lane's worker, whose next task needs the whole GPU: not held up by this one
    _, whole = _in_thread(lambda: gpu.acquire(SharedGpu.WHOLE, holder=lane))
    assert whole.wait(2)
    gpu.release(SharedGpu.WHOLE)
    gpu.leave(lane)
    time.sleep(0.5)  # past the 1 s limit if the limit counted before the go
    gate.set()
    thread.join(timeout=20)
    result = holder["r"]
    payload = json.loads(out.read_text())
    assert result.returncode == 0 and not result.timed_out
    starting = payload["spans"][0]
    assert starting[1] >= released_at[0]  # never inside the timed section
    assert payload["summary"]["cuda_start_wait_before_go_s"] >= 0.8
    assert payload["summary"]["gate_requests"] == 1  # the go's shared request; the start-up is kept apart
    assert result.gpu_wait_s < 0.5  # the wait before the go is not the judgement's
    assert gpu.state()["residents"] == 0


def test_cuda_is_started_before_the_go_only_beside_other_lanes():
    from dice_pipeline.verify.gpu_share import GpuShareClient
    from dice_pipeline.verify.worker import start_cuda_before_go

    alone = GpuShareClient(None)
    assert start_cuda_before_go({"stage": "run"}, alone) is None  # one lane: the GPU is the previous candidate's
    lanes = GpuShareClient((-1, -1))  # a parent's pipes (never written: every case below returns first)
    assert start_cuda_before_go({"stage": "run", "gpu_exclusive": True}, lanes) is None  # waits for the others
    assert start_cuda_before_go({"stage": "build"}, lanes) is None
    assert start_cuda_before_go({"stage": "run", "config": {"start_cuda_before_go": False}}, lanes) is None
    from dice_pipeline.verify.store import _NOT_IN_KEY

    assert {"start_cuda_before_go", "skip_grouped_member_builds"} <= _NOT_IN_KEY  # how, not what, is judged
    import torch

    if not torch.cuda.is_available():
        assert start_cuda_before_go({"stage": "run"}, lanes) is None  # the run stage reports the missing GPU
