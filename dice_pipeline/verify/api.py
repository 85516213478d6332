"""The verifier's public entry points: judge one candidate or a batch, build only, or time references. The batch
itself is scheduled by scheduler.py (static checks here in this process, builds and GPU judgement in isolated
workers); what the host has, and the parallelism chosen from it, is inventory.py. Standard library only in this
process.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from typing import Any, Callable

from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.inventory import BUILD_JOBS, GpuInfo, gpu_inventory, nvcc_available, split_cpus
from dice_pipeline.verify.scheduler import BatchRun, PrestartedJudge, ResultCallback, WorkerRunner, run_batch
from dice_pipeline.verify.static_checks import StaticReport
from dice_pipeline.verify.verdict import Status, Verdict

__all__ = ["BUILD_JOBS", "BatchRun", "GpuInfo", "ResultCallback", "WorkerRunner", "compile_only", "gpu_inventory",
           "measure_references", "nvcc_available", "split_cpus", "verify_batch", "verify_candidate"]


def verify_batch(jobs: list[VerifyJob], config: VerifyConfig | None = None, *,
                 on_result: ResultCallback | None = None, gpus: list[GpuInfo] | None = None,
                 worker_runner: WorkerRunner | None = None) -> list[Verdict]:
    """Judge every job; verdicts come back in the order of `jobs` (one per job, none dropped). `on_result` sees
    each verdict as it is made. `gpus`: the GPUs to judge on (default: nvidia-smi's, within CUDA_VISIBLE_DEVICES);
    `worker_runner`: what runs each isolated worker (scheduler.run_worker_process; tests pass fakes)."""
    run = BatchRun(config or VerifyConfig(), on_result, gpus=gpu_inventory() if gpus is None else gpus,
                   worker_runner=worker_runner)
    return run_batch(run, jobs)


def verify_candidate(reference_src: str, candidate_src: str, config: VerifyConfig | None = None) -> Verdict:
    """Judge one candidate `ModelNew` source against one KernelBench-format reference source."""
    return verify_batch([VerifyJob("candidate", reference_src, candidate_src)], config)[0]


def compile_only(reference_src: str, candidate_src: str, config: VerifyConfig | None = None) -> Verdict:
    """Static checks and the build, never execution (works with nvcc and no GPU): NOT_EXECUTED when both pass."""
    # Never answered from a verdict store: the point is the build (and its cache).
    return verify_candidate(reference_src, candidate_src,
                            replace(config or VerifyConfig(), execute=False, verdict_store_dir=None))


def _reference_row(task_id: str, verdict: Verdict | None, payload_status: str | None, message: str) -> dict[str, Any]:
    """One measure_references row from the control judgement's verdict."""
    row: dict[str, Any] = {"task_id": task_id, "status": payload_status, "message": message, "eager_ms_gpu": None,
                           "eager_ms_host": None, "compile_ms_gpu": None, "compile_ms_host": None,
                           "compile_error": None, "peak_gpu_mb": None,
                           "input_draw": None, "control_speedup_gpu": None, "control_speedup_host": None,
                           "flags": [], "null_output_check": None, "provenance": {}}
    if verdict is None:
        return row
    provenance = verdict.provenance or {}
    row.update(peak_gpu_mb=verdict.peak_gpu_memory_mb, input_draw=provenance.get("input_draw"),
               control_speedup_gpu=verdict.speedup_gpu, control_speedup_host=verdict.speedup_host,
               flags=list(verdict.flags), null_output_check=verdict.null_output_check, provenance=provenance)
    if verdict.reference_timing is not None:
        chosen = verdict.speedup_convention or "gpu"
        other = "host" if chosen == "gpu" else "gpu"
        row[f"eager_ms_{chosen}"] = verdict.reference_timing.median_ms
        row[f"eager_ms_{other}"] = provenance.get(f"reference_median_ms_{other}")
    compiled = (verdict.baseline_speedups or {}).get("compile") or {}
    row[f"compile_ms_{compiled.get('convention') or verdict.speedup_convention or 'gpu'}"] = compiled.get("median_ms")
    row["compile_error"] = compiled.get("error")
    return row


def measure_references(tasks: list[tuple[str, str]], config: VerifyConfig | None = None,
                       baselines: tuple[str, ...] = ("eager",), *,
                       on_result: Callable[[dict[str, Any]], None] | None = None,
                       lanes_per_gpu: int = 1, gpus: list[GpuInfo] | None = None,
                       worker_runner: WorkerRunner | None = None) -> list[dict[str, Any]]:
    """Time each KernelBench-format reference (`(task_id, reference_src)`) alone on the local GPU, in an isolated
    worker, through the verifier's correctness and timing path: the reference is judged against itself (a trusted
    control whose speedup should come out at 1.0), so every verdict-making stage runs at the task's real size.

    Returns one row per task, in order: `status` is "measured", "not_executed" (no GPU here), "runtime_error",
    "timeout" or "infrastructure_error"; `eager_ms_gpu` / `eager_ms_host` are the reference's medians in both
    timing conventions, `compile_ms_gpu` (or `_host`) the torch.compile'd reference's median in the config's convention when
    "compile" is among `baselines`, `peak_gpu_mb` the worker's peak allocated GPU memory, `input_draw` how inputs
    were drawn, and `provenance` the GPU, torch and timing method. Each worker is started while the previous one
    runs. `lanes_per_gpu` > 1 runs that many tasks on a GPU at once (VerifyConfig.gpu_lanes): their untimed work
    overlaps, every timed section still has the GPU to itself (rows say so in provenance["gpu_share"]). `gpus` and
    `worker_runner` as for verify_batch."""
    unknown = set(baselines) - {"eager", "compile", "cuda_graph"}
    if unknown:
        raise ValueError(f"baselines must be among eager, compile, cuda_graph; got {sorted(unknown)}")
    extra = tuple(name for name in baselines if name != "eager")
    config = replace(config or VerifyConfig(), extra_baselines=extra, verdict_store_dir=None,
                     gpu_lanes=max(1, lanes_per_gpu))
    run = BatchRun(config, None, gpus=gpu_inventory() if gpus is None else gpus, worker_runner=worker_runner)
    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    lock = threading.Lock()

    def finish(index: int, row: dict[str, Any]) -> None:
        with lock:
            rows[index] = row
            if on_result is not None:
                on_result(row)

    if not run.execute:
        for index, (task_id, _) in enumerate(tasks):
            finish(index, _reference_row(task_id, None, Status.NOT_EXECUTED.value,
                                         "no GPU here: the reference was not run" if not run.gpus
                                         else "execution disabled by config: the reference was not run"))
        return [row for row in rows if row is not None]
    pending: queue.Queue[int | None] = queue.Queue()
    for index in range(len(tasks)):
        pending.put(index)
    empty = StaticReport(status=None)

    def start(index: int, device: int) -> PrestartedJudge:
        return PrestartedJudge(run, index, VerifyJob(tasks[index][0], tasks[index][1], ""), empty, {}, device,
                               control=True)

    def gpu_loop(device: int) -> None:
        def take() -> int | None:
            try:
                return pending.get_nowait()
            except queue.Empty:
                return None

        index = take()
        waiting = start(index, device) if index is not None else None
        while waiting is not None:
            current, following = waiting, take()
            waiting = start(following, device) if following is not None else None  # starts while current runs
            with run.gpu_turn(device):
                verdict = current.go_and_wait()
            status = {Status.CORRECT: "measured"}.get(verdict.status, verdict.status.value)
            message = "; ".join(f"{r.code}: {r.message}" for r in verdict.reasons)[:2000]
            finish(current.index, _reference_row(tasks[current.index][0], verdict, status, message))

    threads = [threading.Thread(target=gpu_loop, args=(gpu.index,), daemon=True)
               for gpu in run.gpus for _ in range(max(1, lanes_per_gpu))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [row for row in rows if row is not None]
