"""GPU smoke check of the seed corpus: every reference runs on CUDA; every candidate meant to compile builds and
is compared with its reference (outputs at 1e-2 and 1e-4, which custom kernels ran, an informal timing).

Not the verifier: official verdicts and speedups come from `dice verify` and `record_measurements`. To fit a small
device budget all candidate sources are built as ONE extension (each in its own namespace, several translation
units compiled in parallel), and each candidate's `load_inline` call is answered from it.
torch + stdlib only. Usage: python -m dice_pipeline.seed_corpus.check_on_gpu --out results.json [--only 01_relu ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from dice_pipeline.seed_corpus import SeedPairSpec, load_manifest
from dice_pipeline.seed_corpus.layout import (
    CandidateParts,
    merged_bindings,
    merged_cuda_unit,
    namespace_for,
    split_candidate,
)

MERGED_EXTENSION_NAME = "seed_corpus_merged"
_KERNEL_NAME = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+([A-Za-z_][A-Za-z0-9_]*)")
# Exit code of a worker whose CUDA context is poisoned (sticky error); the parent restarts after that pair.
_POISONED_EXIT = 3


def _tag(spec: SeedPairSpec) -> str:
    return Path(spec.directory).name


def _exec_file(code: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(Path(filename).stem)
    module.__file__ = filename
    exec(compile(code, filename, "exec"), module.__dict__)  # noqa: S102 - our own corpus files, on a scratch GPU
    return module


def buildable_parts(specs: list[SeedPairSpec]) -> dict[str, CandidateParts]:
    """Candidates that are meant to compile (all but `no_compile`), by tag."""
    return {
        _tag(spec): split_candidate(spec.read("candidate.py"))
        for spec in specs
        if spec.intended_outcome != "no_compile"
    }


def _write_if_changed(path: Path, text: str) -> None:
    # ninja rebuilds on a newer mtime, so a worker re-creating identical sources must not touch them.
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def build_merged_extension(parts: dict[str, CandidateParts], build_dir: Path, units: int) -> types.ModuleType:
    """Build (or, when already built with the same sources, just load) the merged extension."""
    from torch.utils.cpp_extension import load

    tags = list(parts)
    sources = []
    for index in range(min(units, len(tags))):
        unit = build_dir / f"unit_{index:02d}.cu"
        _write_if_changed(unit, merged_cuda_unit({tag: parts[tag].source for tag in tags[index::units]}))
        sources.append(str(unit))
    bindings = build_dir / "bindings.cpp"
    _write_if_changed(bindings, merged_bindings(parts))
    sources.append(str(bindings))
    return load(
        name=MERGED_EXTENSION_NAME,
        sources=sources,
        extra_cuda_cflags=["-O3"],
        build_directory=str(build_dir),
        verbose=False,
    )


class _ExtensionProxy:
    """What a candidate's `load_inline(...)` returns here: its functions from the merged module, counting calls
    and the calls that raised (a try/except fallback shows up as raised calls)."""

    def __init__(self, merged: types.ModuleType, tag: str, functions: list[str]):
        self.calls = 0
        self.raised = 0
        for function in functions:
            setattr(self, function, self._wrap(getattr(merged, f"{namespace_for(tag)}__{function}")))

    def _wrap(self, fn):
        def call(*args, **kwargs):
            self.calls += 1
            try:
                return fn(*args, **kwargs)
            except Exception:
                self.raised += 1
                raise

        return call


@contextlib.contextmanager
def _answer_load_inline(merged: types.ModuleType, tag: str, parts: CandidateParts, proxies: list[_ExtensionProxy]):
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name, cpp_sources, cuda_sources=None, functions=None, **_ignored):
        if cuda_sources != parts.source or cpp_sources != parts.cpp_src:
            raise RuntimeError(f"{tag}: load_inline got sources that differ from the file's source/cpp_src")
        proxy = _ExtensionProxy(merged, tag, list(functions or []))
        proxies.append(proxy)
        return proxy

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def _median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _custom_kernels_seen(fn, kernel_names: set[str]) -> list[str] | str:
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        launched = {event.name for event in prof.events()}
    except Exception as exc:  # the profiler is a nice-to-have here, not the check itself
        return f"profiler unavailable: {exc}"
    return sorted(name for name in kernel_names if any(name in launched_name for launched_name in launched))


def check_pair(spec: SeedPairSpec, merged: types.ModuleType | None, parts: CandidateParts | None, reps: int):
    result: dict[str, Any] = {"tag": _tag(spec), "intended_outcome": spec.intended_outcome}
    reference = _exec_file(spec.read("reference.py"), f"{_tag(spec)}/reference.py")
    init_inputs = reference.get_init_inputs()
    torch.manual_seed(0)
    with torch.device("cuda"):  # draw inputs on the GPU: same distributions, no host-side generation cost
        inputs = reference.get_inputs()
    torch.manual_seed(1234)
    ref_model = reference.Model(*init_inputs).cuda()
    with torch.no_grad():
        ref_out = ref_model(*inputs)
    torch.cuda.synchronize()
    result["reference_runs"] = True
    result["reference_ms"] = _median_ms(lambda: ref_model(*inputs), reps)
    if merged is None or parts is None:
        result["candidate"] = "not built here (intended no_compile; the nvcc test covers it)"
        return result
    proxies: list[_ExtensionProxy] = []
    with _answer_load_inline(merged, _tag(spec), parts, proxies):
        candidate = _exec_file(spec.read("candidate.py"), f"{_tag(spec)}/candidate.py")
    torch.manual_seed(1234)
    cand_model = candidate.ModelNew(*init_inputs).cuda()
    with torch.no_grad():
        # Hand the candidate a NaN-filled block of the output's size: an output that is never written shows up.
        poison = torch.full_like(ref_out, float("nan"))
        del poison
        cand_out = cand_model(*inputs)
        torch.cuda.synchronize()
        result["shape_matches"] = tuple(cand_out.shape) == tuple(ref_out.shape)
        if result["shape_matches"]:
            diff = (cand_out.float() - ref_out.float()).abs()
            finite = bool(torch.isfinite(cand_out).all())
            result["all_finite"] = finite
            result["max_abs_diff"] = float(diff.max()) if finite else float("inf")
            result["allclose_1e-2"] = finite and torch.allclose(cand_out, ref_out, atol=1e-2, rtol=1e-2)
            result["allclose_1e-4"] = finite and torch.allclose(cand_out, ref_out, atol=1e-4, rtol=1e-4)
        result["candidate_ms"] = _median_ms(lambda: cand_model(*inputs), reps)
        result["informal_speedup"] = result["reference_ms"] / result["candidate_ms"]
        result["extension_calls"] = sum(p.calls for p in proxies)
        result["extension_calls_raised"] = sum(p.raised for p in proxies)
        result["custom_kernels_launched"] = _custom_kernels_seen(
            lambda: cand_model(*inputs), set(_KERNEL_NAME.findall(parts.source))
        )
    return result


def _is_sticky_cuda_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in ("illegal memory access", "unspecified launch failure", "misaligned",
                                             "device-side assert", "illegal instruction"))


def run_worker(tags: list[str], build_dir: Path, results_path: Path, reps: int, units: int) -> int:
    """Check `tags` in order, appending one JSON line per pair; exit early if the CUDA context is poisoned."""
    specs = {_tag(spec): spec for spec in load_manifest()}
    parts = buildable_parts([specs[tag] for tag in tags])
    merged = build_merged_extension(buildable_parts(list(specs.values())), build_dir, units) if parts else None
    with results_path.open("a", encoding="utf-8") as sink:
        for tag in tags:
            started = time.perf_counter()
            try:
                result = check_pair(specs[tag], merged, parts.get(tag), reps)
                exit_code = 0
            except Exception as exc:
                result = {"tag": tag, "intended_outcome": specs[tag].intended_outcome,
                          "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]}
                exit_code = _POISONED_EXIT if _is_sticky_cuda_error(exc) else 0
            result["seconds"] = round(time.perf_counter() - started, 2)
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            print(json.dumps(result), flush=True)
            if exit_code:
                return exit_code
            torch.cuda.empty_cache()
    return 0


def _environment() -> dict[str, Any]:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    with contextlib.suppress(Exception):
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip()
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON report to write")
    parser.add_argument("--only", nargs="*", default=None, help="pair directory names (e.g. 01_relu)")
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--units", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="CUDA translation units compiled in parallel")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per model (informal timing)")
    parser.add_argument("--worker", nargs="*", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-results", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="seed_corpus_build_"))
    build_dir.mkdir(parents=True, exist_ok=True)

    if args.worker is not None:
        return run_worker(args.worker, build_dir, args.worker_results, args.reps, args.units)

    if not torch.cuda.is_available():
        print("check_on_gpu: no CUDA device; nothing to check here", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability(0)))
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    specs = load_manifest()
    if args.only:
        specs = [spec for spec in specs if _tag(spec) in set(args.only)]
    report: dict[str, Any] = {"environment": _environment(), "pairs": []}
    started = time.perf_counter()
    try:
        # Build every buildable candidate of the corpus once; workers reuse the finished build.
        build_merged_extension(buildable_parts(load_manifest()), build_dir, args.units)
        report["build"] = {"ok": True, "seconds": round(time.perf_counter() - started, 1), "units": args.units}
    except Exception as exc:
        report["build"] = {"ok": False, "seconds": round(time.perf_counter() - started, 1),
                           "error": str(exc)[-6000:]}
    print(json.dumps({"build": report["build"]}), flush=True)

    results_path = build_dir / "pair_results.jsonl"
    results_path.unlink(missing_ok=True)
    remaining = [_tag(spec) for spec in specs]
    if not report["build"]["ok"]:
        # References can still be checked; candidates are reported as not built.
        remaining_specs = {_tag(spec): spec for spec in specs}
        with results_path.open("w", encoding="utf-8") as sink:
            for tag in remaining:
                try:
                    result = check_pair(remaining_specs[tag], None, None, args.reps)
                    result["candidate"] = "merged build failed"
                except Exception as exc:
                    result = {"tag": tag, "error": str(exc)[-2000:]}
                sink.write(json.dumps(result) + "\n")
        remaining = []
    while remaining:
        command = [sys.executable, "-m", "dice_pipeline.seed_corpus.check_on_gpu", "--out", str(args.out),
                   "--build-dir", str(build_dir), "--reps", str(args.reps), "--units", str(args.units),
                   "--worker-results", str(results_path),
                   "--worker", *remaining]
        subprocess.run(command, check=False)
        done = {json.loads(line)["tag"] for line in results_path.read_text().splitlines() if line.strip()}
        if not (set(remaining) & done):
            break  # the worker died before finishing any pair: do not loop forever
        remaining = [tag for tag in remaining if tag not in done]
    if results_path.is_file():
        report["pairs"] = [json.loads(line) for line in results_path.read_text().splitlines() if line.strip()]
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}: {len(report['pairs'])} pairs in {report['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
