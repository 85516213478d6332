"""Timing conventions, checked against bare loops in one run on one GPU.

1. Launch-bound seed pairs judged by the verifier (both conventions per verdict), then, in this same process and on
   the same pairs, a bare CUDA-event loop that enqueues the L2 flush and the call back to back (KernelBench's and
   triton's do_bench convention) and one that synchronizes between them. Target: the verifier's `speedup_gpu`
   within 5% of the bare flush-then-call loop's ratio.
2. Harness overhead inside the timed region: a one-element `add_` timed by a bare loop and by the harness's own
   `_timed_gpu` / `_timed_host`, in a fresh state and after a profiler session (the worker runs one at start-up).

    python benchmarks/timing_conventions.py OUT_DIR [--pairs 01_relu 05_mul_add_tanh ...] [--calls 200]

Writes OUT_DIR/timing_conventions.json. torch + stdlib only; the seed pairs' candidates are this project's own
code (trusted), loaded in-process from the verifier's build cache after the verifier has built them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dice_pipeline.seed_corpus import load_manifest  # noqa: E402
from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch  # noqa: E402

# Seed pairs whose references took 0.12-0.18 ms in verifier 0.2's host-inclusive timing: launch-bound.
LAUNCH_BOUND = ["01_relu", "05_mul_add_tanh", "08_sum_last_dim", "09_mean_middle_dim", "10_max_last_dim",
                "12_min_last_dim_serial", "22_matvec_warp_per_row", "15_log_softmax"]


def _exec(code: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    sys.modules[name] = module
    exec(compile(code, module.__file__, "exec"), module.__dict__)  # noqa: S102 - the project's own seed corpus
    return module


def bare_ratio(reference: types.ModuleType, candidate: types.ModuleType, calls: int, sync_after_flush: bool) -> dict:
    """Interleaved bare loop: flush, (sync,) start event, call, end event, sync; median per model and of ratios."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in reference.get_init_inputs()]
    torch.manual_seed(0)
    ref_model = reference.Model(*init).to(device)
    torch.manual_seed(0)
    cand_model = candidate.ModelNew(*init).to(device)
    torch.manual_seed(1)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in reference.get_inputs()]
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = {"ref": [], "cand": []}
    with torch.no_grad():
        for _ in range(20):
            ref_model(*inputs)
            cand_model(*inputs)
        torch.cuda.synchronize()
        for i in range(calls):
            for which in (("ref", "cand") if i % 2 == 0 else ("cand", "ref")):
                model = ref_model if which == "ref" else cand_model
                flush.zero_()
                if sync_after_flush:
                    torch.cuda.synchronize()
                start.record()
                model(*inputs)
                end.record()
                torch.cuda.synchronize()
                times[which].append(start.elapsed_time(end))
    ratios = [r / c for r, c in zip(times["ref"], times["cand"])]
    return {"ref_median_ms": statistics.median(times["ref"]), "cand_median_ms": statistics.median(times["cand"]),
            "median_of_ratios": statistics.median(ratios),
            "ratio_of_medians": statistics.median(times["ref"]) / statistics.median(times["cand"])}


def do_bench_ratio(reference: types.ModuleType, candidate: types.ModuleType) -> dict | None:
    try:
        from triton.testing import do_bench
    except ImportError:
        return None
    device = torch.device("cuda")
    torch.manual_seed(0)
    init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in reference.get_init_inputs()]
    ref_model, cand_model = reference.Model(*init).to(device), candidate.ModelNew(*init).to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in reference.get_inputs()]
    with torch.no_grad():
        ref_ms = do_bench(lambda: ref_model(*inputs), warmup=100, rep=300, return_mode="median")
        cand_ms = do_bench(lambda: cand_model(*inputs), warmup=100, rep=300, return_mode="median")
    return {"ref_median_ms": ref_ms, "cand_median_ms": cand_ms, "ratio_of_medians": ref_ms / cand_ms}


def harness_overhead(calls: int) -> dict:
    """A scalar add_ timed bare and through the harness's timers, before and after a profiler session."""
    from torch.profiler import ProfilerActivity, profile

    from dice_pipeline.verify.judge import CandidateJudge

    device = torch.device("cuda")
    judge = CandidateJudge.__new__(CandidateJudge)
    judge._synchronize, judge._perf_counter = torch.cuda.synchronize, time.perf_counter
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)
    scalar = torch.zeros(1, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def bare(sync: bool) -> float:
        samples = []
        for _ in range(calls):
            flush.zero_()
            if sync:
                torch.cuda.synchronize()
            start.record()
            scalar.add_(1)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    def measure() -> dict:
        with torch.no_grad():
            bare(False)  # warm
            return {
                "bare_gpu_ms": bare(False),
                "harness_gpu_ms": statistics.median(judge._timed_gpu(lambda: scalar.add_(1), flush, start, end)[1]
                                                    for _ in range(calls)),
                "bare_host_ms": bare(True),
                "harness_host_ms": statistics.median(judge._timed_host(lambda: scalar.add_(1), flush, start, end)[1]
                                                     for _ in range(calls)),
            }

    fresh = measure()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        (torch.ones(1, device=device) + 1).sum().item()
    return {"fresh_process": fresh, "after_a_profiler_session": measure()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--pairs", nargs="+", default=LAUNCH_BOUND)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = {Path(spec.directory).name: spec for spec in load_manifest()}
    chosen = [specs[name] for name in args.pairs]
    cache = str((out / "build_cache").resolve())
    config = VerifyConfig(build_cache_dir=cache, verdict_store_dir=None)
    started = time.monotonic()
    verdicts = verify_batch([VerifyJob(name, specs[name].read("reference.py"), specs[name].read("candidate.py"))
                             for name in args.pairs], config)
    verify_s = time.monotonic() - started

    from dice_pipeline.verify.build_cache import BuildInterceptor

    import os

    arch = "{}.{}".format(*torch.cuda.get_device_capability())
    # As in the verifier's workers, so the in-process loads find the extensions they built.
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(cache).resolve() / "torch_extensions")
    BuildInterceptor(cache, mode="torch", profile=config.build_profile, arch=arch,
                     use_precompiled_header=config.use_precompiled_header).install()
    results = []
    for name, spec, verdict in zip(args.pairs, chosen, verdicts):
        row = {"pair": name, "status": verdict.status.value, "speedup_gpu": verdict.speedup_gpu,
               "speedup_host": verdict.speedup_host, "flags": verdict.flags,
               "verifier_reference_ms": verdict.reference_timing.median_ms if verdict.reference_timing else None}
        if verdict.status.value == "correct":
            reference = _exec(spec.read("reference.py"), f"ref_{name}")
            candidate = _exec(spec.read("candidate.py"), f"cand_{name}")
            row["bare_flush_then_call"] = bare_ratio(reference, candidate, args.calls, sync_after_flush=False)
            row["bare_flush_sync_call"] = bare_ratio(reference, candidate, args.calls, sync_after_flush=True)
            row["do_bench"] = do_bench_ratio(reference, candidate)
            bare = row["bare_flush_then_call"]["median_of_ratios"]
            row["speedup_gpu_vs_bare"] = verdict.speedup_gpu / bare if verdict.speedup_gpu else None
        results.append(row)
        print(json.dumps(row, default=str), flush=True)
    within = [r["speedup_gpu_vs_bare"] for r in results if r.get("speedup_gpu_vs_bare")]
    summary = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "verify_seconds": round(verify_s, 1),
               "pairs": results, "harness_overhead": harness_overhead(args.calls),
               "speedup_gpu_over_bare_range": [min(within), max(within)] if within else None,
               "pairs_within_5_percent": sum(abs(x - 1) <= 0.05 for x in within), "pairs_compared": len(within)}
    (out / "timing_conventions.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "pairs"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
