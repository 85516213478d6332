"""The verifier on a Ray cluster: the stages and judgement of `verify_batch` (static checks here, then
`BatchRun.build` and `BatchRun.judge`, scheduler.py), spread out over Ray: builds as tasks on CPU workers, judgements by one
actor per GPU (prestarting the next worker as the local GPU loop does), verdicts streamed back (`on_result`) as
they finish.

Each task or actor call still runs the candidate in the verifier's isolated worker subprocess; the Ray worker
process only starts it and reads its result, so a candidate cannot poison a Ray worker. A Ray worker that dies
mid-task (OOM killer, lost node, a kill) is replaced by Ray and the work re-run (task `max_retries`; actor
`max_restarts` and `max_task_retries`); a job still without a verdict after its retries gets an infrastructure
verdict, never a second verdict or none. `ray` is an optional extra
(`pip install -e .[ray]`), imported only when this backend is used.

Cluster notes: every node needs this package importable (same image, or `runtime_env`), and for builds on one
node to be reused by judgements on another, `build_cache_dir` must be on storage both see (otherwise the run stage
rebuilds). `compile_arch` must match the cluster's GPUs when the driver has none to ask.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from dice_pipeline import settings
from dice_pipeline.gpu_pool import BUILD_MEMORY_MB, device_lock
from dice_pipeline.verify.scheduler import BatchRun, PrestartedJudge, ResultCallback
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.static_checks import StaticReport
from dice_pipeline.verify.verdict import Reason, Status, Verdict

# A directory where every task attempt leaves a file `<job>.<stage>.<pid>`: shows retries and which Ray worker
# ran what (operators), and lets the tests find a worker process to kill mid-task.
ATTEMPT_LOG_ENV = settings.RAY_ATTEMPT_LOG.name


def import_ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the Ray verifier backend needs ray: pip install -e '.[ray]'") from exc
    return ray


def attempt_file_name(job_id: str, stage: str, pid: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', job_id)}.{stage}.{pid}"


def _note_attempt(job_id: str, stage: str) -> None:
    directory = settings.RAY_ATTEMPT_LOG.get()
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / attempt_file_name(job_id, stage, os.getpid())).touch()


def build_task(config: VerifyConfig, job: VerifyJob, static: StaticReport) -> tuple[Verdict | None, dict[str, Any]]:
    """Body of a build task (CPU worker): `BatchRun.build`, the local backend's build stage."""
    _note_attempt(job.job_id, "build")
    run = BatchRun(replace(config, execute=False, devices=None), None)  # a CPU task: no GPU to judge on here
    return run.build(job, static)


class GpuJudge:
    """A Ray actor holding one GPU (which Ray names in CUDA_VISIBLE_DEVICES): judges candidates one at a time with
    `BatchRun.judge` under the device's host lock, as the local backend's GPU loop does. With
    `prestart_gpu_workers`, the next candidate's worker starts (interpreter and imports, no GPU) while the current
    one runs: the actor takes two calls at once and the second waits at its gate for the GPU turn."""

    def __init__(self, config: VerifyConfig):
        ray = import_ray()
        self.config = config
        self.device = int(ray.get_gpu_ids()[0])
        # One candidate on its GPU at a time (the turn below): one lane, the GPU's memory and device lock its own.
        self.run = BatchRun(replace(config, execute=True, devices=[self.device], gpu_lanes=1), None)
        self.turn = threading.Lock()  # one candidate on the GPU at a time

    def judge(self, job: VerifyJob, static: StaticReport, facts: dict[str, Any]) -> Verdict:
        _note_attempt(job.job_id, "judge")
        if not self.config.prestart_gpu_workers:
            with self.turn, device_lock(self.config.device_lock_dir, self.device):
                return self.run.judge(job, static, facts, self.device)
        waiting = PrestartedJudge(self.run, 0, job, static, facts, self.device)
        with self.turn, device_lock(self.config.device_lock_dir, self.device):
            return waiting.go_and_wait()


def _lost_verdict(run: BatchRun, static: StaticReport, stage: str, error: BaseException) -> Verdict:
    status = getattr(Status, "INFRASTRUCTURE_ERROR", None)
    if status is None:  # verifier before 0.3: no status says "the verifier failed, not the candidate"
        raise RuntimeError(f"Ray {stage} task failed after its retries: {error}") from error
    reason = Reason("ray_task_lost", f"{stage} task failed after its retries: {str(error)[-2000:]}",
                    "compile" if stage == "build" else "correctness")
    return Verdict(status=status, reasons=[reason], flags=list(static.flags),
                   provenance=run.provenance({"backend": "ray"}))


def verify_batch_ray(jobs: list[VerifyJob], config: VerifyConfig | None = None, *,
                     on_result: ResultCallback | None = None, address: str | None = None,
                     max_retries: int = 3, build_cpus: float = 1.0, build_memory_mb: int = BUILD_MEMORY_MB,
                     judge_cpus: float = 1.0, max_pending_builds: int | None = None,
                     init_kwargs: dict[str, Any] | None = None) -> list[Verdict]:
    """`verify_batch` on Ray: one verdict per job, in the order of `jobs`. Connects to `address` (or the Ray
    instance this process already joined; with neither, starts a local one and stops it at the end)."""
    ray = import_ray()
    config = config or VerifyConfig()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address or None, **(init_kwargs or {}))
    try:
        return _verify_on_ray(ray, jobs, config, on_result, max_retries, build_cpus, build_memory_mb, judge_cpus,
                              max_pending_builds)
    finally:
        if started_here:
            ray.shutdown()


def _verify_on_ray(ray, jobs, config, on_result, max_retries, build_cpus, build_memory_mb, judge_cpus,
                   max_pending_builds) -> list[Verdict]:
    cluster = ray.cluster_resources()
    cluster_gpus = cluster.get("GPU", 0)
    execute = cluster_gpus > 0 if config.execute is None else bool(config.execute)
    if execute and not cluster_gpus:
        raise RuntimeError("VerifyConfig.execute=True but the Ray cluster has no GPU resources")
    run = BatchRun(replace(config, execute=False), on_result)  # this process: static verdicts and bookkeeping
    results: list[Verdict | None] = [None] * len(jobs)
    remote_build = ray.remote(build_task).options(
        num_cpus=build_cpus, memory=build_memory_mb * 2**20, max_retries=max_retries, retry_exceptions=True)
    # One judge actor per GPU of the cluster, restarted (and its call re-run) if its process dies. Two calls in
    # flight per actor: the one on the GPU and the prestarted next.
    judges = [ray.remote(GpuJudge).options(num_cpus=judge_cpus, num_gpus=1, max_concurrency=2,
                                           max_restarts=max_retries, max_task_retries=max_retries).remote(config)
              for _ in range(int(cluster_gpus))] if execute else []
    judge_load = [0] * len(judges)
    judge_queue: list[tuple[int, dict[str, Any]]] = []

    statics, to_build, store = run.screen(jobs, results)  # the same static checks and store lookups as local

    def finish_measured(index: int, verdict: Verdict) -> None:
        if store is not None and execute:  # the store itself refuses what it must not keep (timeouts, ...)
            store.put(jobs[index], config, verdict)
        run.finish(jobs[index], verdict, results, index)

    if not execute and not config.build_without_gpu:
        for index in to_build:
            run.finish(jobs[index], run.not_executed(statics[index], {}, built=False), results, index)
        to_build = []

    # The config travels once through the object store, not once per task.
    config_ref = ray.put(config)
    pending: dict[Any, tuple[int, str, int]] = {}
    waiting = list(reversed(to_build))
    limit = max_pending_builds or max(4, 2 * int(cluster.get("CPU", 1)))
    builds_in_flight = 0
    try:
        while waiting or pending or judge_queue:
            while waiting and builds_in_flight < limit:
                index = waiting.pop()
                pending[remote_build.remote(config_ref, jobs[index], statics[index])] = (index, "build", -1)
                builds_in_flight += 1
            while judge_queue and min(judge_load) < 2:
                actor = judge_load.index(min(judge_load))
                index, facts = judge_queue.pop(0)
                pending[judges[actor].judge.remote(jobs[index], statics[index], facts)] = (index, "judge", actor)
                judge_load[actor] += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index, stage, actor = pending.pop(ref)
                if stage == "build":
                    builds_in_flight -= 1
                else:
                    judge_load[actor] -= 1
                static = statics[index]
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    finish_measured(index, _lost_verdict(run, static, stage, exc))
                    continue
                if stage == "judge":
                    finish_measured(index, value)
                    continue
                verdict, facts = value
                if verdict is None and execute:
                    judge_queue.append((index, facts))
                else:
                    finish_measured(index, verdict or run.not_executed(static, facts))
    finally:
        for judge in judges:  # the GPUs go back to the cluster with the batch
            ray.kill(judge)
    missing = [jobs[i].job_id for i, v in enumerate(results) if v is None]
    if missing:
        raise RuntimeError(f"verifier produced no verdict for {missing}")
    return [v for v in results if v is not None]
