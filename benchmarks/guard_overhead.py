"""What the runtime guard's checks cost a judgement: the dispatcher snapshot and its reads (verifier 0.3.1), against
the same judgement with the dispatcher reads left out, in one process.

The guard compares PyTorch's dispatcher (every operator's kernels, about 3,600 operators) with a snapshot taken
before the candidate's import, once a judgement (after the timed pairs, or after the correctness trials of a
judgement without timing, as here), and its cheap checks (callable identities, torch.nn's classes, global hooks, the reference, the judge's own state)
after every candidate call. This times a correctness judgement of a small task both ways and the guard's parts.

    python benchmarks/guard_overhead.py [--device cpu|cuda] [--repeats 15] [--out FILE.json]

Prints the median seconds of each way and their ratio (with / without the dispatcher reads), and the parts:
snapshot, a cheap check, a check with the dispatcher read. torch + stdlib only.
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

from dice_pipeline.verify.config import VerifyConfig  # noqa: E402
from dice_pipeline.verify.judge import CandidateJudge, DispatcherSnapshot, RuntimeGuard  # noqa: E402

REFERENCE = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 256)
    def forward(self, x):
        return torch.relu(self.proj(x)) * 2.0
def get_inputs():
    return [torch.rand(512, 256)]
def get_init_inputs():
    return []
"""
CANDIDATE = REFERENCE.replace("class Model(", "class ModelNew(")


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)  # this file's own code
    return module


class _NoReads(DispatcherSnapshot):
    """The baseline's snapshot: taken as ever, never read again (every other check as it is)."""

    def overrides(self) -> list[str]:
        return []


def judge_once(device: torch.device, dispatcher_reads: bool) -> float:
    """Seconds of one correctness judgement, guard construction included (the worker builds one a candidate)."""
    started = time.perf_counter()
    guard = RuntimeGuard() if dispatcher_reads else RuntimeGuard(_NoReads())
    reference = _module("reference_module", REFERENCE)
    judge = CandidateJudge(reference, None, VerifyConfig(), guard, [], device=device)
    judge.run_profiler_check = lambda: None  # the profiler pass is not what is measured (set before the guard
    judge.prepare_reference()                # watches the judge, as the worker's judge has its methods from the start)
    judge.candidate = _module("candidate_module", CANDIDATE)
    judgement = judge.run(with_timing=False)
    assert judgement.status.value == "correct", judgement.reasons
    return time.perf_counter() - started


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm: lazy imports, allocator
    return statistics.median(fn() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)

    def timed(fn):
        def run():
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started
        return run

    guard = RuntimeGuard()
    parts = {
        "dispatcher_snapshot_s": median_seconds(timed(DispatcherSnapshot), args.repeats),
        "cheap_check_s": median_seconds(timed(lambda: guard.check("benchmark")), args.repeats),
        "check_with_dispatcher_read_s": median_seconds(timed(lambda: guard.check("benchmark", thorough=True)),
                                                       args.repeats),
    }
    # Alternate the two ways so drifts (clock, caches) fall on both alike.
    with_reads, without_reads = [], []
    judge_once(device, True)
    for _ in range(args.repeats):
        with_reads.append(judge_once(device, True))
        without_reads.append(judge_once(device, False))
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "operators": len(guard.dispatcher.dumps), "repeats": args.repeats,
        "judgement_with_dispatcher_reads_s": statistics.median(with_reads),
        "judgement_without_dispatcher_reads_s": statistics.median(without_reads),
        **parts,
    }
    result["ratio"] = result["judgement_with_dispatcher_reads_s"] / result["judgement_without_dispatcher_reads_s"]
    for key, value in result.items():
        print(f"{key:40s} {value:.4f}" if isinstance(value, float) else f"{key:40s} {value}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
