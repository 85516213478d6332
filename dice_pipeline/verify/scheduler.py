"""The batch scheduler: static checks and stored verdicts first, builds as a parallel CPU stage of isolated
workers (groups of candidates built as one library, then the rest), and GPU judgement, one isolated worker per
candidate, `gpu_lanes` at a time on each GPU, overlapping the builds still in flight (BatchRun, run_batch). What
runs one worker is injectable (`WorkerRunner`; run_worker_process by default), so the scheduling is testable without
processes. Standard library only in this process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import platform
import queue
import shutil
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dice_pipeline.gpu_pool import SharedGpu, device_lock
from dice_pipeline.paths import source_root
from dice_pipeline.verify import inventory
from dice_pipeline.verify.batched_build import BuildGroup, plan_build_groups
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.inventory import (
    BUILD_JOBS,
    GpuInfo,
    build_batch_size,
    choose_parallelism,
    nvcc_available,
    split_cpus,
)
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

ResultCallback = Callable[[VerifyJob, Verdict], None]


@dataclass(frozen=True)
class WorkerLaunch:
    """How one worker process runs (everything but its request): the GPU it sees, the gate it waits at before its
    turn, its time limits, the cores it may use, the shared GPU it asks for timed sections, its memory cap."""

    device: int | None
    gate: threading.Event | None
    timeout_s: float
    max_timeout_s: float | None
    cpus: set[int] | None
    gpu_share: SharedGpu | None
    memory_cap_mb: int | None
    isolate_network: bool
    build_cache_dir: str


# Runs one worker: (request, launch) -> (the sandbox's account of the process, the worker's result or None).
WorkerRunner = Callable[[dict[str, Any], WorkerLaunch], tuple[SandboxResult, "dict[str, Any] | None"]]


def run_worker_process(request: dict[str, Any], launch: WorkerLaunch) -> tuple[SandboxResult, dict[str, Any] | None]:
    """The worker runner: `python -m dice_pipeline.verify.worker` in a scratch directory, isolated (sandbox.py), its
    result read back (None where it died before writing one)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"dice_verify_{request['stage']}_"))
    try:
        result_path = scratch / "result.json"
        gate_path = scratch / "go" if launch.gate is not None else None
        request = {**request, "result_path": str(result_path), "gate_path": str(gate_path) if gate_path else None}
        (scratch / "request.json").write_text(json.dumps(request))
        env = scrubbed_environment({
            "HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONPATH": str(source_root()),
            "PYTHONUNBUFFERED": "1",
            # nvidia-smi numbers GPUs in PCI order; make CUDA use the same order so the index means the same GPU.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "" if launch.device is None else str(launch.device), "MAX_JOBS": str(BUILD_JOBS),
            "TORCH_EXTENSIONS_DIR": str(Path(launch.build_cache_dir).resolve() / "torch_extensions"),
        })
        outcome = run_isolated([sys.executable, "-m", "dice_pipeline.verify.worker", str(scratch / "request.json")],
                               cwd=scratch, env=env, timeout_s=launch.timeout_s, memory_cap_mb=launch.memory_cap_mb,
                               isolate_network=launch.isolate_network, gate=launch.gate, gate_path=gate_path,
                               cpus=launch.cpus, max_timeout_s=launch.max_timeout_s, gpu_share=launch.gpu_share)
        payload = json.loads(result_path.read_text()) if result_path.exists() else None
        return outcome, payload
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class BatchRun:
    """State of one batch: its config (with the host's parallelism chosen: inventory.choose_parallelism), its GPUs,
    and how each stage's worker result becomes a verdict. `gpus`: the GPUs to judge on (None: nvidia-smi's);
    `worker_runner`: what runs one isolated worker (run_worker_process; tests pass a fake one)."""

    def __init__(self, config: VerifyConfig, on_result: ResultCallback | None = None, *,
                 gpus: list[GpuInfo] | None = None, worker_runner: WorkerRunner | None = None):
        self.gpus = inventory.gpu_inventory() if gpus is None else list(gpus)
        if config.devices is not None:
            self.gpus = [g for g in self.gpus if g.index in config.devices]
        self.execute = bool(self.gpus) if config.execute is None else config.execute
        if self.execute and not self.gpus:
            raise RuntimeError("VerifyConfig.execute=True but no GPU is visible (nvidia-smi lists none)")
        config = choose_parallelism(config, self.gpus, self.execute)
        self.config = config
        self.worker_runner = worker_runner or run_worker_process
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
        cores = len(self.build_cpus) if self.build_cpus else len(inventory.host_cores())
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

    def run_worker(self, job: VerifyJob, stage: str, static: StaticReport | None, device: int | None,
                    gate: threading.Event | None = None, *, control: bool = False,
                    low_memory: bool = False, gpu_exclusive: bool = False,
                    extra_request: dict[str, Any] | None = None) -> tuple[SandboxResult, dict[str, Any] | None]:
        """One isolated worker for `stage` of `job`, through the worker runner: the request it reads and how its
        process runs."""
        request = {"stage": stage, "reference_src": job.reference_src, "candidate_src": job.candidate_src,
                   "config": self.config.to_dict(), "cache_dir": str(Path(self.config.build_cache_dir).resolve()),
                   "build_profile": self.config.build_profile, "arch": self.arch,
                   "static_kernel_names": static.kernel_names if static else [],
                   "control": control, "low_memory": low_memory,
                   "gpu_lanes": self.config.gpu_lanes, "gpu_exclusive": gpu_exclusive,
                   "memory_fraction": self.config.gpu_memory_fraction if gpu_exclusive
                   else self.lane_memory_fraction(),
                   # what a lane that foresees needing more than its share switches to (worker.needs_whole_gpu)
                   "exclusive_memory_fraction": self.config.gpu_memory_fraction or 0.9,
                   "run_cpus": sorted(self.gpu_worker_cpus) if stage == "run" and self.gpu_worker_cpus else None,
                   "run_threads": self.run_threads() if stage == "run" and self.gpu_worker_cpus else None,
                   **(extra_request or {})}
        launch = WorkerLaunch(
            device=device, gate=gate, timeout_s=self.config.stage_time_limit(stage),
            max_timeout_s=self.config.max_run_timeout_s if stage == "run" else None,
            cpus=self.build_cpus if stage in ("build", "pch", "group_build") else None,
            gpu_share=self.shared_gpus.get(device) if stage == "run" and device is not None else None,
            memory_cap_mb=self.config.memory_cap_mb, isolate_network=self.config.isolate_network,
            build_cache_dir=self.config.build_cache_dir)
        return self.worker_runner(request, launch)

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
        outcome, payload = self.run_worker(job, "build", static, device=None)
        if payload is None:
            return self._failure_verdict("build", outcome, static), {}
        facts = {"compile_seconds": payload.get("compile_seconds"), "build_cache_hit": payload.get("build_cache_hit"),
                 "builds": payload.get("builds"), "build_mode": payload.get("build_mode"),
                 "network_isolated": payload.get("network_isolated")}
        if payload.get("import_needs_gpu"):
            facts["import_needs_gpu"] = True
        if payload["status"] in ("compile_error", "infrastructure_error"):  # the latter: a header the host lacks
            reason = Reason(**payload["reason"])
            return Verdict(status=Status(payload["status"]), reasons=[reason], flags=list(static.flags),
                           compile_seconds=facts["compile_seconds"], build_cache_hit=facts["build_cache_hit"],
                           provenance=self.provenance(facts)), facts
        return None, facts

    def build_group(self, group: BuildGroup) -> dict[str, Any]:
        """Build a group's extensions as one library in an isolated build worker (batched_build); its members then
        find their extensions in the cache (in their run stage, or in their own build stage where that runs:
        VerifyConfig.skip_grouped_member_builds). What happened, for their provenance; a worker that fails or dies
        only means the members build alone."""
        job = VerifyJob(f"group_build:{group.indices[0]}", "", "")
        outcome, payload = self.run_worker(job, "group_build", None, device=None,
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
        self.run_worker(VerifyJob("pch", "", ""), "pch", None, device=None)

    def not_executed(self, static: StaticReport, facts: dict[str, Any], built: bool = True,
                     not_built_because: str = "build skipped by config") -> Verdict:
        code = "no_gpu" if not self.gpus else "execution_disabled"
        passed = "static checks and the compile passed" if built else f"static checks passed ({not_built_because})"
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
        outcome, payload = self.run_worker(job, "run", static, device=device, gate=gate, control=control,
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
            outcome, payload = self.run_worker(job, "run", static, device=device, control=control)
        first_attempt = None
        if payload is not None and payload.get("retry_low_memory"):
            # Out of memory with the verifier's full resident state: judged once more with less of it. What
            # that attempt finds stands (a candidate that exhausts memory alone is still its runtime error).
            first_attempt = {"status": payload.get("status"), "reasons": payload.get("reasons"),
                             "peak_gpu_memory_mb": payload.get("peak_gpu_memory_mb")}
            # With several lanes, the second attempt also has the GPU and its memory to itself: memory the other
            # lanes held is not the candidate's fault either.
            outcome, payload = self.run_worker(job, "run", static, device=device, control=control,
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
        store = (VerdictStore(config.verdict_store_dir, tuple(config.verdict_archives))
                 if config.verdict_store_dir or config.verdict_archives else None)
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

    def __init__(self, run: BatchRun, index: int, job: VerifyJob, static: StaticReport, facts: dict[str, Any],
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


def run_batch(run: BatchRun, jobs: list[VerifyJob]) -> list[Verdict]:
    """Judge every job: static checks and stored verdicts (screen), builds on the build cores (groups first, then
    the candidates that build alone), and the GPU loops, `gpu_lanes` a GPU, judging each candidate as soon as it is
    built. Verdicts come back in the order of `jobs` (one per job, none dropped)."""
    config = run.config
    results: list[Verdict | None] = [None] * len(jobs)
    ready: queue.Queue[tuple[int, StaticReport, dict[str, Any]] | None] = queue.Queue()

    statics, to_build, store = run.screen(jobs, results)

    def finish_measured(index: int, verdict: Verdict) -> None:
        if store is not None and run.execute:
            store.put(jobs[index], config, verdict)
        run.finish(jobs[index], verdict, results, index)

    # Where nothing executes, the build is only worth its minutes if it can happen: without nvcc a candidate would
    # fail to build through no fault of its own, so it is not built, and its verdict says why.
    nvcc_missing = not run.execute and config.build_without_gpu and not nvcc_available()
    builds_run = run.execute or (config.build_without_gpu and not nvcc_missing)
    batch_size = build_batch_size(config, len(to_build), run.group_build_slots())
    groups = plan_build_groups([(i, jobs[i].candidate_src) for i in to_build], batch_size) \
        if builds_run and config.build_profile == "fast" else []
    group_reports: dict[int, dict[str, Any]] = {}

    def build_one(index: int) -> None:
        job, static = jobs[index], statics[index]
        if not builds_run:
            why = "no nvcc here: not built" if nvcc_missing else "build skipped by config"
            run.finish(job, run.not_executed(static, {}, built=False, not_built_because=why), results, index)
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
