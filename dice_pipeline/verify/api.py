"""The verifier's public entry points: judge one candidate or a batch. Static checks run here (AST only), builds
run as a parallel CPU stage of isolated workers, and GPU judgement runs one isolated worker per candidate, sharded
over the configured devices and overlapping the builds still in flight. Standard library only in this process.
"""

from __future__ import annotations

import contextlib

import datetime as dt
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import dice_pipeline
from dice_pipeline.gpu_pool import SharedGpu, device_lock
from dice_pipeline.verify.batched_build import BuildGroup, plan_build_groups
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.sandbox import SandboxResult, run_isolated, scrubbed_environment
from dice_pipeline.verify.static_checks import StaticReport, check_candidate_source
from dice_pipeline.verify.store import VerdictStore
from dice_pipeline.verify.verdict import (
    VERIFIER_VERSION,
    Reason,
    Status,
    Verdict,
    generated_kernel_names,
    generated_kernels_reason,
)

REPO_ROOT = str(Path(dice_pipeline.__file__).resolve().parent.parent)
ResultCallback = Callable[[VerifyJob, Verdict], None]


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    driver: str
    compute_capability: str


def _visible_indices() -> set[int] | None:
    """GPU indices this process was given through CUDA_VISIBLE_DEVICES (e.g. by a Dagster GPU pool); None = all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None  # GPU UUIDs: nvidia-smi indices cannot be matched to them here, so do not filter
    return {int(p) for p in parts}


def gpu_inventory() -> list[GpuInfo]:
    """GPUs as nvidia-smi reports them (no torch in this process), limited to CUDA_VISIBLE_DEVICES when it lists
    indices; empty where there is no driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        index, name, driver, cap = [part.strip() for part in line.split(",")]
        gpus.append(GpuInfo(int(index), name, driver, cap))
    visible = _visible_indices()
    return [g for g in gpus if visible is None or g.index in visible]


# Compiler processes one build worker runs at once (ninja's MAX_JOBS: a candidate's C++ and CUDA files side by side).
BUILD_JOBS = 2


def split_cpus(reserved: int) -> tuple[set[int] | None, set[int] | None]:
    """(cores for the GPU workers, cores for builds) out of this process's cores, or (None, None) where the host
    has fewer than 4x `reserved` of them."""
    allowed = sorted(os.sched_getaffinity(0))
    if reserved <= 0 or len(allowed) < 4 * reserved:
        return None, None
    return set(allowed[-reserved:]), set(allowed[:-reserved])


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _BatchRun:
    """State of one verify_batch call: config, GPUs, and how each stage's worker result becomes a verdict."""

    def __init__(self, config: VerifyConfig, on_result: ResultCallback | None):
        self.config = config
        self.gpus = gpu_inventory()
        if config.devices is not None:
            self.gpus = [g for g in self.gpus if g.index in config.devices]
        self.execute = bool(self.gpus) if config.execute is None else config.execute
        if self.execute and not self.gpus:
            raise RuntimeError("VerifyConfig.execute=True but no GPU is visible (nvidia-smi lists none)")
        self.arch = self.gpus[0].compute_capability if self.gpus else config.compile_arch
        self.on_result = on_result
        self.lock = threading.Lock()
        Path(config.build_cache_dir).mkdir(parents=True, exist_ok=True)
        # Builds stay off the cores the GPU workers run on (see VerifyConfig.gpu_worker_cpus).
        self.gpu_worker_cpus, self.build_cpus = (split_cpus(config.gpu_worker_cpus * len(self.gpus))
                                                 if self.execute else (None, None))
        # Several judging lanes a GPU share it through the parent (timed sections alone); one lane holds the
        # device's lock file around each judgement instead.
        self.shared_gpus = ({g.index: SharedGpu(g.index, config.device_lock_dir) for g in self.gpus}
                            if config.gpu_lanes > 1 else {})

    def gpu_turn(self, device: int) -> contextlib.AbstractContextManager[None]:
        """What a GPU loop holds around one judgement: the device's lock with one lane; nothing with several
        (the shared GPU takes the lock while any lane holds it)."""
        return contextlib.nullcontext() if self.shared_gpus else device_lock(self.config.device_lock_dir, device)

    def run_threads(self) -> int:
        """torch threads of one GPU worker: the GPU workers' cores shared by every lane of every GPU (a worker's
        intra-op pool otherwise keeps the size of the whole host it saw at import and oversubscribes them)."""
        workers = max(1, self.config.gpu_lanes) * max(1, len(self.gpus))
        return max(1, len(self.gpu_worker_cpus or ()) // workers)

    def group_build_slots(self) -> int:
        """Group builds compiling at once: config.parallel_group_builds, else as many as the build cores run
        without oversubscription (BUILD_JOBS compiler processes each). All groups at once would finish together,
        each slowed by the others, and leave the GPU idle until then; in waves the first groups reach it sooner."""
        if self.config.parallel_group_builds > 0:
            return self.config.parallel_group_builds
        cores = len(self.build_cpus) if self.build_cpus else len(os.sched_getaffinity(0))
        return max(1, cores // BUILD_JOBS)

    def lane_memory_fraction(self) -> float | None:
        base = self.config.gpu_memory_fraction
        return (base or 0.9) / self.config.gpu_lanes if self.shared_gpus else base

    def provenance(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        gpu = self.gpus[0] if self.gpus else None
        base = {"verifier_version": VERIFIER_VERSION, "time": _utc_now(), "host": platform.node(),
                "gpu": gpu.name if gpu else None, "driver": gpu.driver if gpu else None, "arch": self.arch,
                "build_profile": self.config.build_profile, "tolerance_policy": self.config.tolerance_policy}
        base.update(extra or {})
        return base

    def _run_worker(self, job: VerifyJob, stage: str, static: StaticReport | None, device: int | None,
                    gate: threading.Event | None = None, *, control: bool = False,
                    low_memory: bool = False, gpu_exclusive: bool = False,
                    extra_request: dict[str, Any] | None = None) -> tuple[SandboxResult, dict[str, Any] | None]:
        scratch = Path(tempfile.mkdtemp(prefix=f"dice_verify_{stage}_"))
        try:
            result_path = scratch / "result.json"
            gate_path = scratch / "go" if gate is not None else None
            request = {"stage": stage, "reference_src": job.reference_src, "candidate_src": job.candidate_src,
                       "config": self.config.to_dict(), "cache_dir": str(Path(self.config.build_cache_dir).resolve()),
                       "build_profile": self.config.build_profile, "arch": self.arch, "result_path": str(result_path),
                       "static_kernel_names": static.kernel_names if static else [],
                       "gate_path": str(gate_path) if gate_path else None,
                       "control": control, "low_memory": low_memory,
                       "gpu_lanes": self.config.gpu_lanes, "gpu_exclusive": gpu_exclusive,
                       "memory_fraction": self.config.gpu_memory_fraction if gpu_exclusive
                       else self.lane_memory_fraction(),
                       # what a lane that foresees needing more than its share switches to (worker.needs_whole_gpu)
                       "exclusive_memory_fraction": self.config.gpu_memory_fraction or 0.9,
                       "run_cpus": sorted(self.gpu_worker_cpus) if stage == "run" and self.gpu_worker_cpus else None,
                       "run_threads": self.run_threads() if stage == "run" and self.gpu_worker_cpus else None,
                       **(extra_request or {})}
            (scratch / "request.json").write_text(json.dumps(request))
            env = scrubbed_environment({
                "HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONPATH": REPO_ROOT, "PYTHONUNBUFFERED": "1",
                # nvidia-smi numbers GPUs in PCI order; make CUDA use the same order so the index means the same GPU.
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": "" if device is None else str(device), "MAX_JOBS": str(BUILD_JOBS),
                "TORCH_EXTENSIONS_DIR": str(Path(self.config.build_cache_dir).resolve() / "torch_extensions"),
            })
            timeout = self.config.stage_time_limit(stage)
            outcome = run_isolated([sys.executable, "-m", "dice_pipeline.verify.worker", str(scratch / "request.json")],
                                   cwd=scratch, env=env, timeout_s=timeout, memory_cap_mb=self.config.memory_cap_mb,
                                   isolate_network=self.config.isolate_network, gate=gate, gate_path=gate_path,
                                   cpus=self.build_cpus if stage in ("build", "pch", "group_build") else None,
                                   max_timeout_s=self.config.max_run_timeout_s if stage == "run" else None,
                                   gpu_share=self.shared_gpus.get(device) if stage == "run" else None)
            payload = json.loads(result_path.read_text()) if result_path.exists() else None
            return outcome, payload
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _failure_verdict(self, stage: str, outcome: SandboxResult, static: StaticReport) -> Verdict:
        sandbox_facts = {"network_isolated": outcome.network_isolated, "peak_rss_mb": round(outcome.peak_rss_mb, 1)}
        if outcome.timed_out:
            status, code = Status.TIMEOUT, f"{stage}_timeout"
            limit = outcome.limit_s or self.config.stage_time_limit(stage)
            sized = " (the limit this task's size asked for)" if stage == "run" and limit != self.config.stage_time_limit(stage) else ""
            message = f"{stage} stage exceeded {limit:g} s{sized}; process group killed"
        elif outcome.memory_exceeded:
            status = Status.COMPILE_ERROR if stage == "build" else Status.RUNTIME_ERROR
            code, message = "memory_cap_exceeded", f"worker group passed {self.config.memory_cap_mb} MB resident"
        else:
            status = Status.COMPILE_ERROR if stage == "build" else Status.RUNTIME_ERROR
            how = f"signal {outcome.killed_by_signal}" if outcome.killed_by_signal else f"exit code {outcome.returncode}"
            code, message = "worker_crashed", f"{stage} worker died ({how}): {outcome.output_tail[-2000:]}"
        return Verdict(status=status, reasons=[Reason(code, message, "compile" if stage == "build" else "correctness")],
                       flags=list(static.flags), provenance=self.provenance(sandbox_facts))

    def static_verdict(self, static: StaticReport) -> Verdict:
        assert static.status is not None
        return Verdict(status=static.status, reasons=list(static.reasons), flags=list(static.flags),
                       provenance=self.provenance())

    def build(self, job: VerifyJob, static: StaticReport) -> tuple[Verdict | None, dict[str, Any]]:
        """Build stage; returns a final verdict if the candidate ends here, and the build facts."""
        outcome, payload = self._run_worker(job, "build", static, device=None)
        if payload is None:
            return self._failure_verdict("build", outcome, static), {}
        facts = {"compile_seconds": payload.get("compile_seconds"), "build_cache_hit": payload.get("build_cache_hit"),
                 "builds": payload.get("builds"), "build_mode": payload.get("build_mode"),
                 "network_isolated": payload.get("network_isolated")}
        if payload.get("import_needs_gpu"):
            facts["import_needs_gpu"] = True
        if payload["status"] == "compile_error":
            reason = Reason(**payload["reason"])
            return Verdict(status=Status.COMPILE_ERROR, reasons=[reason], flags=list(static.flags),
                           compile_seconds=facts["compile_seconds"], build_cache_hit=facts["build_cache_hit"],
                           provenance=self.provenance(facts)), facts
        return None, facts

    def build_group(self, group: BuildGroup) -> dict[str, Any]:
        """Build a group's extensions as one library in an isolated build worker (batched_build); its members then
        find their extensions in the cache (in their run stage, or in their own build stage where that runs:
        VerifyConfig.skip_grouped_member_builds). What happened, for their provenance; a worker that fails or dies
        only means the members build alone."""
        job = VerifyJob(f"group_build:{group.indices[0]}", "", "")
        outcome, payload = self._run_worker(job, "group_build", None, device=None,
                                            extra_request={"group_extensions": group.extensions})
        if payload is None:
            reason = "timed out" if outcome.timed_out else f"died: {outcome.output_tail[-300:]}"
            return {"candidates": len(group.indices), "extensions": len(group.extensions), "grouped": [],
                    "worker": reason, "seconds": round(outcome.wall_seconds, 2)}
        return {"candidates": len(group.indices), "extensions": len(group.extensions),
                "grouped": payload.get("grouped", []), "attempts": payload.get("attempts", []),
                "seconds": round(outcome.wall_seconds, 2)}

    def warm_precompiled_header(self) -> None:
        """Build the torch/extension.h PCH for the common flag set (no extra cflags) while the first candidates
        build without it; later builds pick it up. A failure only means builds go on without a PCH."""
        self._run_worker(VerifyJob("pch", "", ""), "pch", None, device=None)

    def not_executed(self, static: StaticReport, facts: dict[str, Any], built: bool = True) -> Verdict:
        code = "no_gpu" if not self.gpus else "execution_disabled"
        passed = "static checks and the compile passed" if built else "static checks passed (build skipped by config)"
        if facts.get("import_needs_gpu"):
            passed = ("static checks passed; the candidate's module needs a GPU at import, so its build stopped "
                      "there (the builds before that point passed)")
        message = (f"no GPU here: {passed}; correctness, anti-gaming runtime checks and timing were not run"
                   if code == "no_gpu" else f"execution disabled by config: {passed}; nothing was run")
        return Verdict(status=Status.NOT_EXECUTED, reasons=[Reason(code, message, "correctness")],
                       flags=list(static.flags), compile_seconds=facts.get("compile_seconds"),
                       build_cache_hit=facts.get("build_cache_hit"), provenance=self.provenance(facts))

    def judge(self, job: VerifyJob, static: StaticReport, facts: dict[str, Any], device: int,
              gate: threading.Event | None = None, *, control: bool = False) -> Verdict:
        cached_only = {"builds_expected_cached": True} if facts.get("member_build_stage") == "skipped" else None
        outcome, payload = self._run_worker(job, "run", static, device=device, gate=gate, control=control,
                                            extra_request=cached_only)
        if payload is not None and payload.get("status") == "needs_build":
            # An extension its group did not build (e.g. one its source builds in a way not read statically): the
            # skipped build stage now, on the build cores, then the judgement again.
            verdict, built = self.build(job, static)
            facts = {**facts, **built, "member_build_stage": f"run: the run stage met extension(s) "
                                                            f"{payload.get('missed_cache')} its group had not built"}
            if verdict is not None:
                verdict.provenance = {**(verdict.provenance or {}), "build_group": facts.get("build_group"),
                                      "member_build_stage": facts["member_build_stage"]}
                return verdict
            outcome, payload = self._run_worker(job, "run", static, device=device, control=control)
        first_attempt = None
        if payload is not None and payload.get("retry_low_memory"):
            # Out of memory with the verifier's full resident state: judged once more with less of it. What
            # that attempt finds stands (a candidate that exhausts memory alone is still its runtime error).
            first_attempt = {"status": payload.get("status"), "reasons": payload.get("reasons"),
                             "peak_gpu_memory_mb": payload.get("peak_gpu_memory_mb")}
            # With several lanes, the second attempt also has the GPU and its memory to itself: memory the other
            # lanes held is not the candidate's fault either.
            outcome, payload = self._run_worker(job, "run", static, device=device, control=control,
                                                low_memory=True, gpu_exclusive=bool(self.shared_gpus))
        if payload is None:
            return self._failure_verdict("run", outcome, static)
        payload.pop("retry_low_memory", None)
        if first_attempt is not None:
            payload.setdefault("provenance", {})["first_attempt_out_of_memory"] = first_attempt
        provenance = self.provenance({**facts, **payload.pop("provenance", {}),
                                      "device_index": device, "run_seconds": round(outcome.wall_seconds, 2),
                                      # the worker's own main() after its go; the rest of run_seconds is the
                                      # process's start after the go and its exit
                                      "worker_seconds": round(payload.get("worker_seconds", 0.0), 2),
                                      **({"gpu_wait_s": round(outcome.gpu_wait_s, 3)}
                                         if outcome.gpu_wait_s is not None else {}),
                                      "extension_load_seconds": payload.get("compile_seconds"),
                                      "worker_cpus": payload.get("worker_cpus"),
                                      "worker_threads": payload.get("worker_threads"),
                                      "network_isolated": payload.get("network_isolated")})
        if "reason" in payload:  # early exits (import failures) carry one reason
            payload["reasons"] = [payload.pop("reason")]
        payload.update(provenance=provenance, compile_seconds=facts.get("compile_seconds"),
                       build_cache_hit=facts.get("build_cache_hit"))
        verdict = Verdict.from_dict(payload)
        verdict.flags = list(dict.fromkeys(static.flags + verdict.flags))
        return verdict

    def screen(self, jobs: list[VerifyJob], results: list[Verdict | None]
               ) -> tuple[list[StaticReport], list[int], VerdictStore | None]:
        """What every backend does before any worker runs: static checks (AST only, milliseconds; rejected
        candidates never reach a build worker), then verdicts already measured for these exact jobs and config
        (on this GPU model; any GPU where there is none). Finishes those jobs; returns (static reports, the indices
        still to build, the verdict store or None)."""
        config = self.config
        statics = [check_candidate_source(job.reference_src, job.candidate_src,
                                          forbid_torch_compute_on_forward=config.forbid_torch_compute_on_forward)
                   for job in jobs]
        to_build = [i for i, static in enumerate(statics) if static.status is None]
        for index, static in enumerate(statics):
            if static.status is not None:
                self.finish(jobs[index], self.static_verdict(static), results, index)
        store = VerdictStore(config.verdict_store_dir) if config.verdict_store_dir else None
        if store is not None:
            local_gpu = self.gpus[0].name if self.gpus else None
            for index in list(to_build):
                stored = store.get(jobs[index], config, local_gpu, tuple(config.accept_verdicts_from))
                if stored is not None:
                    stored.flags = list(dict.fromkeys(statics[index].flags + stored.flags))
                    _apply_generated_kernel_rule(stored, statics[index].kernel_names)
                    self.finish(jobs[index], stored, results, index)
                    to_build.remove(index)
        return statics, to_build, store

    def finish(self, job: VerifyJob, verdict: Verdict, results: list[Verdict | None], index: int) -> None:
        with self.lock:
            results[index] = verdict
            if self.on_result is not None:
                self.on_result(job, verdict)


class PrestartedJudge:
    """A run-stage worker started ahead of its turn, held at its gate until `go_and_wait`."""

    def __init__(self, run: _BatchRun, index: int, job: VerifyJob, static: StaticReport, facts: dict[str, Any],
                 device: int, *, control: bool = False):
        self.index = index
        self._gate = threading.Event()
        self._verdict: Verdict | None = None
        self._error: BaseException | None = None

        def work() -> None:
            try:
                self._verdict = run.judge(job, static, facts, device, gate=self._gate, control=control)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the GPU loop's thread
                self._error = exc

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def go_and_wait(self) -> Verdict:
        self._gate.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._verdict is not None
        return self._verdict


def _apply_generated_kernel_rule(verdict: Verdict, own_kernel_names: list[str]) -> None:
    """The profiler rule `generated_kernels_ran` on a stored verdict, from the kernels it recorded: verdicts stored
    before the rule existed get the judgement a fresh run gives."""
    provenance = verdict.provenance or {}
    recorded = provenance.get("generated_kernels") or provenance.get("kernels_seen") or []
    generated = generated_kernel_names(recorded, own_kernel_names)
    if generated and verdict.status == Status.CORRECT:
        verdict.status = Status.DECEPTIVE
        verdict.reasons = [*verdict.reasons, generated_kernels_reason(generated)]


def verify_batch(jobs: list[VerifyJob], config: VerifyConfig | None = None, *,
                 on_result: ResultCallback | None = None) -> list[Verdict]:
    """Judge every job; verdicts come back in the order of `jobs` (one per job, none dropped)."""
    config = config or VerifyConfig()
    run = _BatchRun(config, on_result)
    results: list[Verdict | None] = [None] * len(jobs)
    ready: queue.Queue[tuple[int, StaticReport, dict[str, Any]] | None] = queue.Queue()

    statics, to_build, store = run.screen(jobs, results)

    def finish_measured(index: int, verdict: Verdict) -> None:
        if store is not None and run.execute:
            store.put(jobs[index], config, verdict)
        run.finish(jobs[index], verdict, results, index)

    builds_run = run.execute or config.build_without_gpu
    groups = plan_build_groups([(i, jobs[i].candidate_src) for i in to_build], config.build_batch_size) \
        if builds_run and config.build_profile == "fast" else []
    group_reports: dict[int, dict[str, Any]] = {}

    def build_one(index: int) -> None:
        job, static = jobs[index], statics[index]
        if not builds_run:
            run.finish(job, run.not_executed(static, {}, built=False), results, index)
            return
        report = group_reports.get(index)
        built_in_group = report is not None and set(report["members"]) <= set(report.get("grouped", []))
        # Built moments ago in its group, not found from an earlier run: a cold build, its share of the group's
        # compile time.
        group_share = (round(sum(a.get("seconds", 0.0) for a in report.get("attempts", []))
                             / max(1, len(report["grouped"])), 3) if built_in_group else None)
        if built_in_group and run.execute and config.skip_grouped_member_builds:
            # Its run stage imports it against the cache its group filled (a miss there sends it back to this
            # build stage: judge); no build worker of its own on the build cores meanwhile.
            ready.put((index, static, {"compile_seconds": group_share, "build_cache_hit": False,
                                       "build_group": report, "member_build_stage": "skipped"}))
            return
        verdict, facts = run.build(job, static)
        if report is not None:
            facts["build_group"] = report
            if verdict is not None:
                verdict.provenance["build_group"] = report
            if facts.get("builds") and built_in_group:
                facts.update(build_cache_hit=False, compile_seconds=group_share)
                if verdict is not None:
                    verdict.build_cache_hit, verdict.compile_seconds = False, facts["compile_seconds"]
        if verdict is None and run.execute:
            ready.put((index, static, facts))
            return
        finish_measured(index, verdict or run.not_executed(static, facts))

    def gpu_loop(device: int) -> None:
        # One candidate on the GPU at a time. With prestart_gpu_workers, the next candidate's worker is already
        # started (interpreter and imports, no CUDA, no task code) and waits at its gate meanwhile.
        if not config.prestart_gpu_workers:
            while (item := ready.get()) is not None:
                index, static, facts = item
                with run.gpu_turn(device):
                    verdict = run.judge(jobs[index], static, facts, device)
                finish_measured(index, verdict)
            return
        started: queue.Queue[PrestartedJudge | None] = queue.Queue(maxsize=1)

        def prestart() -> None:
            while (item := ready.get()) is not None:
                index, static, facts = item
                started.put(PrestartedJudge(run, index, jobs[index], static, facts, device))
            started.put(None)

        threading.Thread(target=prestart, daemon=True).start()
        while (judge := started.get()) is not None:
            with run.gpu_turn(device):  # the prestarted worker touches no GPU before go
                verdict = judge.go_and_wait()
            finish_measured(judge.index, verdict)

    gpu_threads = [threading.Thread(target=gpu_loop, args=(g.index,), daemon=True)
                   for g in run.gpus for _ in range(config.gpu_lanes)] if run.execute else []
    for thread in gpu_threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=config.max_parallel_builds) as pool:
        # A PCH pays off only when many builds share a host with cores to spare; a lone build does not wait for it.
        if config.build_profile == "fast" and config.use_precompiled_header and len(to_build) >= 4 \
                and config.max_parallel_builds >= 4:
            pool.submit(run.warm_precompiled_header)
        # Groups first (each is one long build), then the candidates that build alone; a group's candidates go on
        # as soon as their group is done (to the GPU, or to their own, now cached, build stages: build_one).
        slots = threading.BoundedSemaphore(run.group_build_slots())

        def build_group(group: BuildGroup) -> dict[str, Any]:
            with slots:
                return run.build_group(group)

        group_futures: dict[Future[dict[str, Any]], BuildGroup] = {pool.submit(build_group, g): g for g in groups}
        grouped = {i for g in groups for i in g.indices}
        builds = [pool.submit(build_one, i) for i in to_build if i not in grouped]
        for done in as_completed(group_futures):
            group = group_futures[done]
            try:
                report = done.result()
            except Exception as exc:  # noqa: BLE001 - a group that cannot build leaves its members to build alone
                report = {"candidates": len(group.indices), "grouped": [], "error": repr(exc)[-300:]}
            for index in group.indices:
                group_reports[index] = {**report, "members": group.members[index]}
            builds += [pool.submit(build_one, i) for i in group.indices]
        for build in builds:
            build.result()
    for _ in gpu_threads:
        ready.put(None)
    for thread in gpu_threads:
        thread.join()
    missing = [jobs[i].job_id for i, v in enumerate(results) if v is None]
    if missing:
        raise RuntimeError(f"verifier produced no verdict for {missing}")
    return [v for v in results if v is not None]


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
                           "flags": [], "provenance": {}}
    if verdict is None:
        return row
    provenance = verdict.provenance or {}
    row.update(peak_gpu_mb=verdict.peak_gpu_memory_mb, input_draw=provenance.get("input_draw"),
               control_speedup_gpu=verdict.speedup_gpu, control_speedup_host=verdict.speedup_host,
               flags=list(verdict.flags), provenance=provenance)
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
                       lanes_per_gpu: int = 1) -> list[dict[str, Any]]:
    """Time each KernelBench-format reference (`(task_id, reference_src)`) alone on the local GPU, in an isolated
    worker, through the verifier's correctness and timing path: the reference is judged against itself (a trusted
    control whose speedup should come out at 1.0), so every verdict-making stage runs at the task's real size.

    Returns one row per task, in order: `status` is "measured", "not_executed" (no GPU here), "runtime_error",
    "timeout" or "infrastructure_error"; `eager_ms_gpu` / `eager_ms_host` are the reference's medians in both
    timing conventions, `compile_ms_gpu` (or `_host`) the torch.compile'd reference's median in the config's convention when
    "compile" is among `baselines`, `peak_gpu_mb` the worker's peak allocated GPU memory, `input_draw` how inputs
    were drawn, and `provenance` the GPU, torch and timing method. Each worker is started while the previous one
    runs. `lanes_per_gpu` > 1 runs that many tasks on a GPU at once (VerifyConfig.gpu_lanes): their untimed work
    overlaps, every timed section still has the GPU to itself (rows say so in provenance["gpu_share"])."""
    unknown = set(baselines) - {"eager", "compile", "cuda_graph"}
    if unknown:
        raise ValueError(f"baselines must be among eager, compile, cuda_graph; got {sorted(unknown)}")
    extra = tuple(name for name in baselines if name != "eager")
    config = replace(config or VerifyConfig(), extra_baselines=extra, verdict_store_dir=None,
                     gpu_lanes=max(1, lanes_per_gpu))
    run = _BatchRun(config, None)
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
