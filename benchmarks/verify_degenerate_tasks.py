"""Re-judge KernelBench's degenerate tasks (levels 1-3) on this host's GPU with verifier 0.4's null-output check:
the tasks where zeros or a constant pass the tolerance (flag `degenerate_task`), each judged twice,

1. the reference against itself (the trusted control of `measure_references`): must stay `measured` (correct),
   never rejected by the check (no false rejection);
2. a null kernel: a custom CUDA kernel that writes zeros into an output of the reference's shape and dtype (baked
   in per task, read from a meta-device run of the reference): must be rejected, by `no_better_than_null_output`
   (or the check says it is inconclusive there: `null_output_check_inconclusive`, and the row says so).

    python benchmarks/verify_degenerate_tasks.py OUT_DIR --tasks ../shared/data/kernelbench/tasks.jsonl \\
        [--levels 1 2 3] [--degenerate-from SWEEP.jsonl] [--budget-s 1500]

Which tasks are degenerate: the rows of a kernelbench_sweep.py run whose flags hold `degenerate_task`
(`--degenerate-from`, no GPU time spent finding them), else a control judgement of every task of the levels first.
Writes OUT_DIR/degenerate_tasks.jsonl (a row per task and judgement) and OUT_DIR/degenerate_tasks_summary.json, and
exits non-zero if a control was rejected by the check or a null kernel was accepted where the check was conclusive.
torch and the standard library only (runs on a bare CUDA+PyTorch image).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dice_pipeline.kernelbench import load_kernelbench_tasks  # noqa: E402
from dice_pipeline.verify import VerifyConfig, VerifyJob, gpu_inventory, measure_references, verify_batch  # noqa: E402

# A kernel of the candidate's own that writes zeros byte by byte (any dtype) into a fresh output: what a candidate
# returning nothing but zeros looks like to the profiler (its own kernel ran) and to the output checks.
ZEROS_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
__global__ void zero_fill_kernel(unsigned char* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0;
}
torch::Tensor zero_fill(torch::Tensor y) {
    long n = y.numel() * y.element_size();
    zero_fill_kernel<<<(n + 255) / 256, 256>>>(reinterpret_cast<unsigned char*>(y.data_ptr()), n);
    return y;
}
"""
ext = load_inline(name="zero_fill_ext", cpp_sources="torch::Tensor zero_fill(torch::Tensor y);", cuda_sources=cuda_src,
                  functions=["zero_fill"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, *inputs):
        device = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        return ext.zero_fill(torch.empty(SHAPE, dtype=torch.DTYPE, device=device))
'''


def output_signature(code: str) -> tuple[tuple[int, ...], str] | None:
    """(shape, dtype name) of the reference's output, from a run on the meta device (no memory, no GPU); None where
    the output is not one tensor or the model cannot run on the meta device."""
    import torch

    namespace: dict = {}
    try:
        exec(compile(code, "reference", "exec"), namespace)  # trusted: KernelBench's own reference
        with torch.device("meta"):
            torch.manual_seed(0)
            model = namespace["Model"](*namespace["get_init_inputs"]())
            inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
            output = model(*inputs)
    except Exception:  # noqa: BLE001 - such a task is recorded as not tried
        return None
    if not isinstance(output, torch.Tensor):
        return None
    return tuple(output.shape), str(output.dtype).replace("torch.", "")


def zeros_candidate(shape: tuple[int, ...], dtype: str) -> str:
    return ZEROS_CANDIDATE.replace("SHAPE", repr(tuple(shape))).replace("DTYPE", dtype)


def degenerate_ids(path: Path) -> set[str]:
    ids = set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "degenerate_task" in (row.get("flags") or []):
            ids.add(row["task_id"])
    return ids


def summarize(controls: list[dict], zeros: list[dict], untried: list[str], wall_s: float) -> dict:
    false_rejections = [r["task_id"] for r in controls if r["status"] != "measured"
                        and "no_better_than_null_output" in (r["message"] or "")]
    conclusive = [r for r in zeros if (r.get("null_output_check") or {}).get("conclusive")]
    accepted = [r["task_id"] for r in conclusive if r["status"] == "correct"]
    gpus = gpu_inventory()
    return {
        "gpu": gpus[0].name if gpus else None, "wall_s": round(wall_s, 1), "degenerate_tasks": len(controls),
        "controls_by_status": {s: sum(r["status"] == s for r in controls) for s in {r["status"] for r in controls}},
        "controls_rejected_by_the_check": false_rejections,
        "zeros_by_status": {s: sum(r["status"] == s for r in zeros) for s in {r["status"] for r in zeros}},
        "zeros_rejected_by_the_check": sum("no_better_than_null_output" in r["reasons"] for r in zeros),
        "zeros_where_the_check_was_inconclusive": [r["task_id"] for r in zeros if r not in conclusive],
        "zeros_accepted_where_conclusive": accepted, "zeros_not_tried": untried,
        "ok": not false_rejections and not accepted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--tasks", required=True, help="KernelBench tasks.jsonl or KernelBench/ folder")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--degenerate-from", type=Path, default=None,
                        help="a kernelbench_sweep.py rows file: its degenerate_task rows are the tasks re-judged")
    parser.add_argument("--budget-s", type=float, default=1500.0, help="stop starting phases after this long")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tasks = {task.key: task for task in load_kernelbench_tasks(args.tasks, levels=args.levels).tasks}
    config = VerifyConfig(verdict_store_dir=None, build_cache_dir=str(out / "build_cache"))
    rows_file = (out / "degenerate_tasks.jsonl").open("a")

    def keep(kind: str, row: dict) -> None:
        rows_file.write(json.dumps({"kind": kind, **row}, default=str) + "\n")
        rows_file.flush()

    if args.degenerate_from is not None:
        chosen = sorted(degenerate_ids(args.degenerate_from) & set(tasks))
        controls = measure_references([(key, tasks[key].code) for key in chosen], config,
                                      on_result=lambda row: keep("control", row))
    else:  # every task's control tells which are degenerate
        every = measure_references([(key, task.code) for key, task in tasks.items()], config,
                                   on_result=lambda row: keep("control", row))
        controls = [row for row in every if "degenerate_task" in row["flags"]]
    print(f"{len(controls)} degenerate tasks: {[r['task_id'] for r in controls]}", flush=True)
    jobs, untried = [], []
    for row in controls:
        signature = output_signature(tasks[row["task_id"]].code)
        if signature is None:
            untried.append(row["task_id"])
            continue
        jobs.append(VerifyJob(row["task_id"], tasks[row["task_id"]].code, zeros_candidate(*signature)))
    zeros: list[dict] = []
    if jobs and time.monotonic() - started < args.budget_s:
        for job, verdict in zip(jobs, verify_batch(jobs, config)):
            row = {"task_id": job.job_id, "status": verdict.status.value, "reasons": verdict.reason_codes(),
                   "flags": verdict.flags, "relative_error": verdict.relative_error,
                   "null_output_check": verdict.null_output_check, "summary": verdict.summary()}
            keep("zeros", row)
            zeros.append(row)
            print(f"zeros {job.job_id}: {verdict.summary()}", flush=True)
    summary = summarize(controls, zeros, untried, time.monotonic() - started)
    (out / "degenerate_tasks_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
