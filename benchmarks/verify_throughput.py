"""Verifier throughput on the seed corpus: our verifier (parallel cached builds, isolated workers, full checks)
against a naive serial baseline that does what KernelBench's harness does (default `load_inline` flags, cold build,
one candidate at a time, 5 allclose trials at 1e-2, 100 timed trials with CUDA events). Run on a GPU host:

    python benchmarks/verify_throughput.py --out DIR [--baseline-subset N]

Writes DIR/seed_verdicts.json (every pair's verdict), DIR/verify_throughput.json (the numbers) and DIR/verdict_store
(the verdicts as a store `dice run --verdict-store` reuses), prints a summary.
The baseline costs ~45-90 s a candidate, so it runs on the first N pairs (a fixed subset) and its throughput is
per-candidate; the ratio compares candidates judged per minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.verify import VerifyConfig, VerifyJob, compile_only, verify_batch  # noqa: E402

# Pairs the baseline judges: an honest kernel and a wrong one, so both verdict kinds are compared.
DEFAULT_BASELINE_SUBSET = ("relu", "head_sum_off_by_one", "fused_bias_gelu")


def baseline_worker(request_path: str) -> None:
    """KernelBench-like judgement of one pair in this (fresh) process. GPU side: torch + stdlib only."""
    import torch

    request = json.loads(Path(request_path).read_text())
    result: dict = {"status": None}
    start = time.perf_counter()
    reference: dict = {}
    exec(compile(request["reference_src"], "reference.py", "exec"), reference)  # noqa: S102 - baseline does this
    candidate: dict = {}
    try:
        exec(compile(request["candidate_src"], "candidate.py", "exec"), candidate)  # noqa: S102
    except Exception as exc:  # noqa: BLE001
        result.update(status="compile_error", error=repr(exc)[-500:])
    result["compile_seconds"] = time.perf_counter() - start
    if result["status"] is None:
        try:
            init = reference["get_init_inputs"]()
            torch.manual_seed(42)
            ref_model = reference["Model"](*init).cuda()
            torch.manual_seed(42)
            cand_model = candidate["ModelNew"](*init).cuda()
            ok = True
            for trial in range(5):
                torch.manual_seed(42 + trial)
                inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in reference["get_inputs"]()]
                with torch.no_grad():
                    ref_out, cand_out = ref_model(*inputs), cand_model(*inputs)
                torch.cuda.synchronize()
                ok &= ref_out.shape == cand_out.shape and bool(torch.allclose(ref_out, cand_out, atol=1e-2, rtol=1e-2))
            result["status"] = "correct" if ok else "incorrect"
            if ok:
                flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
                times = {}
                for label, model in (("reference", ref_model), ("candidate", cand_model)):
                    for _ in range(3):
                        model(*inputs)
                    samples = []
                    for _ in range(100):
                        flush.zero_()
                        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start_ev.record()
                        with torch.no_grad():
                            model(*inputs)
                        end_ev.record()
                        torch.cuda.synchronize()
                        samples.append(start_ev.elapsed_time(end_ev))
                    times[label] = statistics.fmean(samples[1:])
                result["speedup"] = times["reference"] / times["candidate"]
        except Exception as exc:  # noqa: BLE001
            result.update(status="runtime_error", error=repr(exc)[-500:])
    result["seconds"] = time.perf_counter() - start
    Path(request["result_path"]).write_text(json.dumps(result))


def baseline_subset(pairs: list[dict], n: int) -> list[dict]:
    """The first `n` of DEFAULT_BASELINE_SUBSET present in the corpus (an honest kernel first, then a wrong one)."""
    by_name = {p["problem_name"]: p for p in pairs}
    return [by_name[name] for name in DEFAULT_BASELINE_SUBSET if name in by_name][:n]


def run_baseline(pairs: list[dict]) -> tuple[float, list[dict]]:
    results = []
    start = time.perf_counter()
    for pair in pairs:
        with tempfile.TemporaryDirectory(prefix="kb_baseline_") as scratch:
            request = {"reference_src": pair["pytorch_code"], "candidate_src": pair["generated_code"],
                       "result_path": os.path.join(scratch, "result.json")}
            Path(scratch, "request.json").write_text(json.dumps(request))
            # A fresh extensions dir per candidate: KernelBench builds every candidate cold.
            env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(scratch, "ext"))
            proc = subprocess.run([sys.executable, __file__, "--baseline-worker", os.path.join(scratch, "request.json")],
                                  env=env, capture_output=True, text=True, timeout=900)
            path = Path(request["result_path"])
            result = json.loads(path.read_text()) if path.exists() else {"status": "runtime_error",
                                                                          "error": proc.stderr[-500:]}
        result["problem_name"] = pair["problem_name"]
        results.append(result)
        print(f"baseline {pair['problem_name']}: {result['status']} in {result.get('seconds', 0):.1f} s", flush=True)
    return time.perf_counter() - start, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=False, default="benchmarks/results")
    parser.add_argument("--baseline-subset", type=int, default=3, help="pairs the serial baseline judges")
    parser.add_argument("--verdict-store", default=None,
                        help="also put our verdicts in this verdict store (default OUT/verdict_store)")
    parser.add_argument("--baseline-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        baseline_worker(args.baseline_worker)
        return 0
    from dice_pipeline.seed_corpus import load_seed_pairs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = load_seed_pairs()
    subset = baseline_subset(pairs, args.baseline_subset)

    # Ours first: its seed-corpus verdicts are the result other stages need, should the baseline overrun.
    cache_dir = tempfile.mkdtemp(prefix="dice_verify_bench_cache_")
    # The store starts empty here (no verdict is reused), so the throughput is measured, not remembered.
    store_dir = Path(args.verdict_store or out / "verdict_store")
    if store_dir.exists() and any(store_dir.rglob("*.json")):
        parser.error(f"{store_dir} already holds verdicts: the benchmark needs an empty store")
    config = VerifyConfig(build_cache_dir=cache_dir, verdict_store_dir=str(store_dir))
    jobs = [VerifyJob(p["uuid"], p["pytorch_code"], p["generated_code"]) for p in pairs]
    start = time.perf_counter()
    uuid_to_name = {p["uuid"]: p["problem_name"] for p in pairs}
    partial = (out / "seed_verdicts.partial.jsonl").open("w")

    def record(job, verdict):
        # Written as each verdict lands, so a run cut short by its time limit still returns what it judged.
        print(f"ours {uuid_to_name[job.job_id]}: {verdict.summary()}", flush=True)
        partial.write(json.dumps({"job_id": job.job_id, "problem_name": uuid_to_name[job.job_id],
                                  "verdict": verdict.to_dict()}, sort_keys=True) + "\n")
        partial.flush()

    verdicts = verify_batch(jobs, config, on_result=record)
    partial.close()
    ours_wall = time.perf_counter() - start
    seed_verdicts = [{"job_id": p["uuid"], "problem_name": p["problem_name"], "verdict": v.to_dict()}
                     for p, v in zip(pairs, verdicts)]
    (out / "seed_verdicts.json").write_text(json.dumps(seed_verdicts, indent=1, sort_keys=True))

    baseline_wall, baseline_results = run_baseline(subset)

    hit_start = time.perf_counter()
    hit = compile_only(pairs[0]["pytorch_code"], pairs[0]["generated_code"], config)
    hit_wall = time.perf_counter() - hit_start

    ours_by_name = {p["problem_name"]: v for p, v in zip(pairs, verdicts)}
    cold = [v.compile_seconds for v in verdicts if v.compile_seconds and not v.build_cache_hit]
    agreement = [{"problem_name": r["problem_name"], "baseline": r["status"],
                  "ours": ours_by_name[r["problem_name"]].status.value,
                  "baseline_speedup": r.get("speedup"), "ours_speedup": ours_by_name[r["problem_name"]].speedup}
                 for r in baseline_results]
    summary = {
        "gpu": verdicts[0].provenance.get("gpu"), "host_cpus": os.cpu_count(),
        "time": verdicts[0].provenance.get("time"),
        "ours": {"candidates": len(jobs), "wall_seconds": ours_wall, "per_minute": len(jobs) / ours_wall * 60,
                 "cold_build_seconds_median": statistics.median(cold) if cold else None,
                 "cold_build_seconds_min": min(cold) if cold else None,
                 "cache_hit_build_seconds": hit.compile_seconds, "cache_hit_call_wall_seconds": hit_wall,
                 "statuses": {s: sum(v.status.value == s for v in verdicts) for s in {v.status.value for v in verdicts}}},
        "baseline": {"candidates": len(subset), "wall_seconds": baseline_wall,
                     "per_minute": len(subset) / baseline_wall * 60,
                     "cold_build_seconds": [r.get("compile_seconds") for r in baseline_results]},
        "agreement_on_baseline_subset": agreement,
    }
    summary["throughput_ratio"] = summary["ours"]["per_minute"] / summary["baseline"]["per_minute"]
    (out / "verify_throughput.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
