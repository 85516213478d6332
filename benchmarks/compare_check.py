"""The pass/fail check on every timed call: the quick test in the outputs' own precision against the float64
comparison alone, on the same outputs, in one process.

The verifier checks the candidate's output after each of its timed calls (2 a timed pair, 100+ pairs a candidate).
On the H100 (2026-12-06) that check dominated the work around a pair: 7-16 ms a pair for outputs of 128-256 MB
against 2-3 ms for small outputs. This times `compare_outputs(..., stats=False)` both ways and checks they agree.

    python benchmarks/compare_check.py [--device cuda] [--mib 16 128 256] [--repeats 10] [--out FILE.json]

Prints, per output size and dtype, the median milliseconds of each way and their ratio (float64 / quick).
torch + stdlib only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dice_pipeline.verify.judge import compare_outputs  # noqa: E402

TOLERANCE = 1e-2  # the policy tolerance the timed calls are checked at


def _median_ms(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm: allocator, kernels
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()  # each way ends in a device-to-host read of its verdict: synchronized
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def measure(device: torch.device, mib: int, dtype: torch.dtype, repeats: int) -> dict:
    elements = mib * 2**20 // torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator(device=device).manual_seed(0)
    reference = torch.randn(elements, device=device, dtype=torch.float32, generator=generator).to(dtype)
    # an honest candidate's output: the reference up to rounding-level differences
    candidate = (reference.float() * (1 + 1e-6)).to(dtype)
    quick = compare_outputs(reference, candidate, (TOLERANCE,), stats=False)
    full = compare_outputs(reference, candidate, (TOLERANCE,), stats=False, quick=False)
    assert quick.passes == full.passes == {TOLERANCE: True}, (quick.passes, full.passes)
    wrong = candidate.clone()
    wrong[elements // 2] += 1.0
    assert not compare_outputs(reference, wrong, (TOLERANCE,), stats=False).passes[TOLERANCE]
    quick_ms = _median_ms(lambda: compare_outputs(reference, candidate, (TOLERANCE,), stats=False), device, repeats)
    full_ms = _median_ms(lambda: compare_outputs(reference, candidate, (TOLERANCE,), stats=False, quick=False),
                         device, repeats)
    return {"mib": mib, "dtype": str(dtype).replace("torch.", ""), "elements": elements,
            "quick_ms": round(quick_ms, 3), "float64_ms": round(full_ms, 3), "ratio": round(full_ms / quick_ms, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mib", type=int, nargs="+", default=[16, 128, 256])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for dtype_name in args.dtypes:
        for mib in args.mib:
            row = measure(device, mib, getattr(torch, dtype_name), args.repeats)
            rows.append(row)
            print(f"{row['dtype']:9s} {mib:5d} MiB: quick {row['quick_ms']:9.3f} ms, float64 {row['float64_ms']:9.3f} ms,"
                  f" ratio {row['ratio']:.2f}x", flush=True)
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
