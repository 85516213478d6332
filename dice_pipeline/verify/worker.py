"""Entry point of the isolated worker process: `python -m dice_pipeline.verify.worker REQUEST.json`.

Stage "pch" precompiles torch/extension.h into the build cache (once per toolchain); stage "group_build" builds
several candidates' extensions as one library (batched_build) and enters each in the cache; stage "build" imports the candidate with load_inline intercepted (cached build, or compile-only where torch has no
CUDA); stage "run" imports reference and candidate (builds now hit the cache) and judges on the visible GPU. The
result is written as JSON to the request's `result_path`; a crash leaves no result, which the parent reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dice_pipeline import settings
from dice_pipeline.gpu_pool import SharedGpu
from dice_pipeline.verify.build_cache import BuildInterceptor, ExtensionCompileError
from dice_pipeline.verify.build_environment import missing_toolkit_header
from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.gpu_share import GpuShareClient
from dice_pipeline.verify.static_checks import CANDIDATE_MODULE, REFERENCE_MODULE, cuda_kernel_names

if TYPE_CHECKING:  # imported where used: the harness imports torch
    from dice_pipeline.verify.judge import DispatcherSnapshot


def _import_source(name: str, source: str, directory: Path) -> Any:
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _network_isolated() -> bool:
    return all(name == "lo" for _, name in socket.if_nameindex())


def _build_summary(interceptor: BuildInterceptor) -> dict[str, Any]:
    return {
        "compile_seconds": sum(r.seconds for r in interceptor.records),
        "build_cache_hit": all(r.cache_hit for r in interceptor.records) if interceptor.records else None,
        "builds": [{"name": r.name, "key": r.key[:16], "cache_hit": r.cache_hit, "seconds": round(r.seconds, 3),
                    "variant": r.variant} for r in interceptor.records],
    }


def _compile_failure(interceptor: BuildInterceptor, exc: BaseException) -> dict[str, Any]:
    log = exc.log if isinstance(exc, ExtensionCompileError) else "".join(traceback.format_exception(exc))
    missing = missing_toolkit_header(log) if isinstance(exc, ExtensionCompileError) else None
    if missing is not None:
        # A header of the CUDA toolkit's libraries this host lacks: the host's fault, never the candidate's (not
        # stored, never a reward of 0); a host with the headers judges it.
        searched = ", ".join([str(interceptor.toolkit_include()), *interceptor.library_include_dirs()])
        return {"status": "infrastructure_error", "reason": {
            "code": "toolkit_header_missing", "stage": "compile",
            "message": (f"the build needs {missing}, a CUDA library header this host lacks (searched {searched}; "
                        f"pip install -e '.[cuda-headers]' gives a CPU host a GPU host's): not the candidate's fault\n"
                        + log[-3000:])}, **_build_summary(interceptor)}
    return {"status": "compile_error", "reason": {"code": "build_failed" if isinstance(exc, ExtensionCompileError)
                                                   else "import_failed", "message": log[-4000:], "stage": "compile"},
            **_build_summary(interceptor)}


# What torch raises when module code touches CUDA where there is none: the build stage never sees a GPU.
_NO_GPU_MESSAGES = ("No CUDA GPUs are available", "Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
                    "no CUDA-capable device is detected", "CUDA driver initialization failed")


def needs_gpu(exc: BaseException) -> bool:
    """Whether an import failed only because it touched CUDA (torch's lazy CUDA init, or its messages for that)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = traceback.extract_tb(exc.__traceback__)
        if any(f.name == "_lazy_init" and f"torch{os.sep}cuda" in f.filename for f in frames):
            return True
        if any(message in str(exc) for message in _NO_GPU_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def run_build_stage(request: dict[str, Any], interceptor: BuildInterceptor, scratch: Path) -> dict[str, Any]:
    try:
        _import_source(CANDIDATE_MODULE, request["candidate_src"], scratch)
    except ExtensionCompileError as exc:
        return _compile_failure(interceptor, exc)
    except BaseException as exc:  # noqa: BLE001 - anything the candidate's module code raises is its failure
        if needs_gpu(exc):
            # Module code that needs a GPU (a device query, a CUDA tensor) is not a compile error: the builds
            # reached so far are cached, and the run stage imports it again, on the GPU, with the same limits.
            return {"status": "ok", "import_needs_gpu": True,
                    "note": f"the candidate's module needs a GPU at import ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); builds after that point happen in the run stage",
                    **_build_summary(interceptor)}
        return _compile_failure(interceptor, exc)
    if not interceptor.records:
        return {"status": "ok", "note": "candidate built no extension", **_build_summary(interceptor)}
    return {"status": "ok", **_build_summary(interceptor)}


def _warm_up_lazy_torch_state() -> None:
    """Run the profiler once on a trivial op before the guard snapshot: its first use imports torch._dynamo,
    which rebinds functions such as torch.manual_seed, and initialises CUPTI. Candidate code must not be blamed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        (torch.ones(1, device="cuda") + 1).sum().item()


def _send_run_limit(config: VerifyConfig, draw_s: float, call_s: float) -> float | None:
    """Tell the parent how long this task's judgement may take (VerifyConfig.run_time_limit), through the pipe it
    gave us, and close the pipe: it is written once, before any candidate code runs, so a candidate cannot extend
    its own limit."""
    fd = settings.RUN_LIMIT_FD.take()
    if fd is None:
        return None
    limit = config.run_time_limit(draw_s, call_s)
    try:
        os.write(int(fd), json.dumps({"limit_s": limit, "draw_s": draw_s, "reference_call_s": call_s}).encode())
    finally:
        os.close(int(fd))
    return limit


# The judgement's peak GPU memory, as a multiple of the task's input and output bytes: the inputs, their pristine
# clone and a fresh draw (3x); the reference's and two candidate outputs, earlier outputs kept for the stale-result
# check and the comparison's chunks (about 5.5x); what one model call needs beyond its inputs and output (its clone
# of the inputs and its temporaries: the reference's, measured on the probe call, 1x); plus the CUDA context and
# library workspaces. On the level-1 tasks whose outputs are as large as their inputs the peak was 8.25x the inputs;
# the call's workspace was added after cumsum-style and loss tasks (temporaries as large as the input, scalar
# outputs) ran out of their share (sweeps of 2026-12-05, benchmarks/RESULTS.md).
PEAK_PER_INPUT_BYTE = 3.0
PEAK_PER_OUTPUT_BYTE = 5.5
PEAK_PER_WORKSPACE_BYTE = 1.0
PEAK_OVERHEAD_BYTES = 1 << 30
# How long a worker granted the whole GPU waits for the memory to be free in fact: the driver frees a finished
# worker's memory a little after its process has gone.
WHOLE_GPU_MEMORY_WAIT_S = 30.0


def expected_peak_bytes(input_bytes: int, output_bytes: int, workspace_bytes: int = 0) -> float:
    return (PEAK_PER_INPUT_BYTE * input_bytes + PEAK_PER_OUTPUT_BYTE * output_bytes
            + PEAK_PER_WORKSPACE_BYTE * workspace_bytes + PEAK_OVERHEAD_BYTES)


def needs_whole_gpu(input_bytes: int, output_bytes: int, lane_budget_bytes: float, workspace_bytes: int = 0) -> bool:
    """Whether a judgement sharing its GPU with other lanes should have the GPU and its memory to itself from the
    start: its expected peak does not fit its lane's share of the memory, where it would run out and be judged
    again alone (the time of that first attempt is saved)."""
    return expected_peak_bytes(input_bytes, output_bytes, workspace_bytes) > lane_budget_bytes


def wait_for_free_memory(needed_bytes: float, mem_get_info: Callable[[], tuple[int, int]],
                         timeout_s: float = WHOLE_GPU_MEMORY_WAIT_S, poll_s: float = 0.1,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> dict[str, float | bool]:
    """After the whole GPU is granted: wait until the device reports `needed_bytes` free (memory other processes
    still hold, a finished worker's included, is not ours to use), at most `timeout_s`. Says what it saw; the
    judgement goes on either way (an out-of-memory then is still the verifier's, retried with less state)."""
    started = clock()
    while True:
        free, total = mem_get_info()
        enough = free >= needed_bytes
        if enough or clock() - started >= timeout_s:
            return {"free_mb": round(free / 2**20, 1), "needed_mb": round(needed_bytes / 2**20, 1),
                    "waited_s": round(clock() - started, 3), "enough": enough}
        sleep(poll_s)


def _prepare_reference(judge: Any, config: VerifyConfig, send_limit: bool, phase: str = "prepare_reference") -> None:
    """The judge's trusted set-up (input draw, reference model, probe call), its seconds kept as phase `phase`; with
    `send_limit`, the run limit sized from it goes to the parent (always sent, even when the set-up failed). A
    rejection becomes the judgement's."""
    from dice_pipeline.verify.judge import Rejection

    limit = None
    try:
        with judge.phase(phase):
            draw_s, call_s = judge.prepare_reference()  # trusted code only: no candidate module exists yet
        if send_limit:
            limit = _send_run_limit(config, draw_s, call_s)
            judge.judgement.fields.setdefault("provenance", {}).update(
                run_limit_s=limit, input_draw_s=round(draw_s, 4), reference_call_s=round(call_s, 6))
    except Rejection as rejection:
        judge.judgement.status, judge.judgement.reasons = rejection.status, [rejection.reason]
        if getattr(rejection, "retry_low_memory", False):
            judge.judgement.fields["retry_low_memory"] = True
    if send_limit and limit is None:
        _send_run_limit(config, 0.0, 0.0)


def _share_client() -> GpuShareClient:
    """The run stage's end of the GPU shared with other judging lanes (a no-op with one lane)."""
    import torch

    return GpuShareClient.from_env(before_release=torch.cuda.synchronize)


def _memory_fraction(request: dict[str, Any]) -> float | None:
    """The share of the GPU's memory this worker may use: its lane's (scheduler.BatchRun), else the config's."""
    return request.get("memory_fraction", request["config"].get("gpu_memory_fraction"))


def _start_cuda(fraction: float | None) -> None:
    """CUDA context, this lane's memory share, and the profiler's lazy state: trusted start-up, no task code."""
    import torch

    if fraction:
        torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.init()
    _warm_up_lazy_torch_state()


def start_cuda_before_go(request: dict[str, Any], share: GpuShareClient) -> dict[str, Any] | None:
    """A prestarted run-stage worker beside other lanes starts CUDA while it waits for its go (about 1-2 s a
    candidate off the lane's critical path), in untracked shared use of the GPU (gpu_share.py), so never inside
    another lane's timed section. Not with one lane (the GPU is the previous candidate's alone until the go), nor
    for a retry that needs the whole GPU (it waits for the other workers first), nor where the config turns it off
    (VerifyConfig.start_cuda_before_go). Returns what it did, or None."""
    import torch

    if not (share.active and request.get("stage") == "run" and not request.get("gpu_exclusive")
            and request.get("config", {}).get("start_cuda_before_go", True)):
        return None
    if not torch.cuda.is_available():
        return None  # the run stage reports it
    started = time.perf_counter()
    with share.starting_cuda():
        granted = time.perf_counter()
        _start_cuda(_memory_fraction(request))
    return {"seconds": round(time.perf_counter() - granted, 4), "gpu_wait_s": round(granted - started, 4)}


def run_judge_stage(request: dict[str, Any], interceptor: BuildInterceptor, scratch: Path,
                    share: GpuShareClient | None = None,
                    cuda_started_before_go: dict[str, Any] | None = None,
                    dispatcher: DispatcherSnapshot | None = None) -> dict[str, Any]:
    """The GPU judgement. With request["control"], the reference is judged against itself (measure_references):
    the candidate source is not imported and no profiler pass runs. `share`: the client to the GPU's other lanes
    when main() made it before the gate; `cuda_started_before_go`: what start_cuda_before_go did, if it ran."""
    import torch

    from dice_pipeline.verify.judge import CandidateJudge, Rejection, RuntimeGuard

    config = VerifyConfig.from_dict(request["config"])
    if request.get("low_memory"):
        config.low_memory = True
    control = bool(request.get("control"))
    # Other judging lanes on this GPU: every GPU use below is shared with them, the timed sections are not.
    share = share or _share_client()
    phases: dict[str, float] = {}
    started = time.perf_counter()
    # A retry after running out of memory beside other lanes has the GPU and its memory whole from the start.
    share.start(SharedGpu.WHOLE if request.get("gpu_exclusive") else SharedGpu.SHARED)
    phases["gpu_wait_at_start"] = round(time.perf_counter() - started, 4)
    if not torch.cuda.is_available():
        return {"status": "runtime_error", "reason": {"code": "no_gpu_in_worker", "stage": "correctness",
                                                      "message": "the run stage found no CUDA device"}}
    fraction = _memory_fraction(request)
    started = time.perf_counter()
    if cuda_started_before_go is None:
        _start_cuda(fraction)
    phases["cuda_start"] = round(time.perf_counter() - started, 4)
    guard = RuntimeGuard(dispatcher)  # before any task code is imported
    try:
        reference = _import_source(REFERENCE_MODULE, request["reference_src"], scratch)
    except BaseException as exc:  # noqa: BLE001
        return {"status": "runtime_error", "reason": {"code": "reference_import_failed", "stage": "correctness",
                                                      "message": "".join(traceback.format_exception(exc))[-3000:]}}
    judge = CandidateJudge(reference, None, config, guard, list(request.get("static_kernel_names", [])),
                           control=control, gpu_share=share)
    judge.phase_seconds.update(phases)
    _prepare_reference(judge, config, send_limit=True)
    exclusive_fraction = request.get("exclusive_memory_fraction")
    if judge.prepared and share.active and share.mode == SharedGpu.SHARED and fraction and exclusive_fraction:
        from dice_pipeline.verify.judge import output_bytes

        total = torch.cuda.get_device_properties(0).total_memory
        input_bytes = judge.judgement.fields.get("provenance", {}).get("input_bytes") or 0
        out_bytes = output_bytes([judge.probe])  # the reference's output, from the trusted probe call
        workspace = judge.reference_workspace_bytes
        if needs_whole_gpu(input_bytes, out_bytes, fraction * total, workspace):
            # Whole use of the GPU is granted once the other lanes' workers hold no task memory; this worker holds
            # none while it waits either (two lanes both waiting with their tensors would starve each other), and
            # prepares the same inputs again afterwards (seeded draws). Trusted code only: no candidate module yet.
            judge.release_prepared()
            with judge.phase("gpu_wait_for_whole_gpu"):
                share.start(SharedGpu.WHOLE)
            torch.cuda.set_per_process_memory_fraction(exclusive_fraction)
            expected = expected_peak_bytes(input_bytes, out_bytes, workspace)
            with judge.phase("gpu_wait_for_free_memory"):
                free_memory = wait_for_free_memory(min(expected, exclusive_fraction * total),
                                                   torch.cuda.mem_get_info)
            whole_gpu = {"input_mb": round(input_bytes / 2**20, 1), "output_mb": round(out_bytes / 2**20, 1),
                         "reference_workspace_mb": round(workspace / 2**20, 1),
                         "expected_peak_mb": round(expected / 2**20, 1), "free_memory_at_start": free_memory,
                         "lane_budget_mb": round(fraction * total / 2**20, 1), "memory_fraction": exclusive_fraction,
                         "memory_held_while_waiting_mb": round(torch.cuda.memory_reserved() / 2**20, 1)}
            judge.judgement.fields.setdefault("provenance", {})["whole_gpu_from_the_start"] = whole_gpu
            fraction = exclusive_fraction
            _prepare_reference(judge, config, send_limit=False, phase="prepare_reference_whole_gpu")
    if judge.prepared:
        if not control:
            try:
                with judge.phase("candidate_import"):
                    judge.candidate = _import_source(CANDIDATE_MODULE, request["candidate_src"], scratch)
            except BaseException as exc:  # noqa: BLE001
                return _compile_failure(interceptor, exc)
            names = [name for record in interceptor.records
                     for name in cuda_kernel_names("\n".join(record.cuda_sources))]
            # From the build's records and the request, not from the judge's state the candidate's import could reach.
            judge.custom_kernel_names = tuple(dict.fromkeys(names + list(request.get("static_kernel_names", []))))
            guard.watch_judge(judge, fields=("custom_kernel_names",))
        try:
            guard.check("while importing the candidate")
        except Rejection as rejection:
            judge.judgement.status, judge.judgement.reasons = rejection.status, [rejection.reason]
        else:
            judge.run(with_timing=request.get("with_timing", True))
    j = judge.judgement
    result = {"status": j.status.value, "reasons": [r.__dict__ for r in j.reasons], "flags": j.flags, **j.fields,
              **_build_summary(interceptor)}
    for key in ("reference_timing", "candidate_timing"):
        if result.get(key) is not None:
            result[key] = result[key].__dict__
    props = torch.cuda.get_device_properties(0)
    provenance = result.setdefault("provenance", {})
    provenance["phase_seconds"] = {**provenance.get("phase_seconds", {}), **judge.phase_seconds}
    if cuda_started_before_go is not None:
        provenance["cuda_started_before_go"] = cuda_started_before_go
    if share.active:
        provenance["gpu_share"] = {**share.summary(), "lanes": request.get("gpu_lanes"),
                                   "whole_run_exclusive": share.mode == SharedGpu.WHOLE,
                                   "memory_fraction": fraction, "timed_alone": True}
    provenance.update(
        gpu=props.name, compute_capability=f"{props.major}.{props.minor}", torch=torch.__version__,
        cuda=torch.version.cuda, low_memory=config.low_memory,
        timing_method=(f"CUDA events on the current stream, L2 flushed ({config.l2_flush_mb} MB) before each call, "
                       f"{config.warmup_min_seconds:g}-{config.warmup_seconds:g} s warm-up (until steady), "
                       f"{config.timing_min_samples}-{config.timing_max_samples} "
                       f"reference/candidate pairs in alternating order on fresh inputs, each pair timed in both "
                       f"conventions (gpu: flush and call enqueued back to back; host: device synchronized before "
                       f"the call), until the {config.speedup_convention} median is known to "
                       f"{config.timing_target_precision:.0%} or {config.timing_budget_s:g} s of timing; buffers "
                       f"re-allocated every {config.timing_round_samples} pairs; speedup = median of the "
                       f"{config.speedup_convention}-convention paired ratios"))
    return result


def _prepare_and_wait_at_gate(gate_path: Path, request: dict[str, Any], share: GpuShareClient | None
                              ) -> tuple[dict[str, Any] | None, DispatcherSnapshot | None]:
    """Trusted start-up only (the harness and the lazy torch modules it will need; CUDA too beside other lanes:
    start_cuda_before_go, and then the guard's dispatcher snapshot; no task code), then wait for the parent to
    create `gate_path`: the previous candidate may still be on the GPU. Returns start_cuda_before_go's report and
    the snapshot (None where CUDA starts after the go: the guard takes its snapshot then)."""
    import torch._dynamo  # noqa: F401 - imported by the profiler's first use otherwise
    import torch.profiler  # noqa: F401

    from dice_pipeline.verify.judge import DispatcherSnapshot

    started_cuda = start_cuda_before_go(request, share) if share is not None else None
    dispatcher = DispatcherSnapshot() if started_cuda is not None else None
    while not gate_path.exists():
        time.sleep(0.005)
    return started_cuda, dispatcher


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    scratch = Path.cwd()
    arch = request.get("arch") or None
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    import torch

    mode = "torch" if torch.version.cuda is not None else "compile_only"
    interceptor = BuildInterceptor(request["cache_dir"], mode=mode, profile=request["build_profile"], arch=arch,
                                   use_precompiled_header=request["config"].get("use_precompiled_header", True),
                                   light_cuda_headers=request["config"].get("light_cuda_headers", True))
    interceptor.install()
    # Its group built every extension it declares, so its own build stage was skipped: a build now goes back to
    # the parent (status needs_build), which runs that stage on the build cores and judges the candidate again.
    interceptor.cached_only = request["stage"] == "run" and bool(request.get("builds_expected_cached"))
    share = _share_client() if request["stage"] == "run" else None
    cuda_started_before_go = dispatcher = None
    if request.get("gate_path"):
        cuda_started_before_go, dispatcher = _prepare_and_wait_at_gate(Path(request["gate_path"]), request, share)
    if request.get("run_cpus"):
        # The GPU stage's own cores (no builds there); imports before the gate ran on any core.
        os.sched_setaffinity(0, request["run_cpus"])
        torch.set_num_threads(request.get("run_threads") or len(request["run_cpus"]))
    started = time.time()
    if request["stage"] == "build":
        result = run_build_stage(request, interceptor, scratch)
    elif request["stage"] == "group_build":
        result = {"status": "ok", **interceptor.build_group(request["group_extensions"])}
    elif request["stage"] == "pch":
        result = {"status": "ok", "pch_flags": interceptor.ensure_precompiled_header([], wait=True)}
    elif request["stage"] == "run":
        result = run_judge_stage(request, interceptor, scratch, share, cuda_started_before_go, dispatcher)
        if interceptor.missed_cache:  # whatever the judgement found, it was not of the candidate as built alone
            result = {"status": "needs_build", "missed_cache": interceptor.missed_cache,
                      **_build_summary(interceptor)}
    else:
        raise ValueError(f"unknown stage {request['stage']!r}")
    result["build_mode"] = mode
    result["worker_seconds"] = time.time() - started
    result["network_isolated"] = _network_isolated()
    result["worker_cpus"] = sorted(os.sched_getaffinity(0))
    result["worker_threads"] = torch.get_num_threads()
    tmp = Path(request["result_path"] + ".tmp")
    tmp.write_text(json.dumps(result, default=str))
    tmp.replace(request["result_path"])
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # The result is on disk: skip the interpreter's teardown (torch's, the profiler's, the CUDA context's module
    # by module), which the lane waiting for this process would otherwise sit through. The parent kills the
    # process group either way, and the driver frees the context when the process ends.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
