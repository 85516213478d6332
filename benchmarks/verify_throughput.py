"""Verifier throughput: our verifier (grouped cached builds, isolated workers, full checks) against a
KernelBench-style pipeline judging the same candidates with KernelBench's checks (default `load_inline` flags,
cold builds, 5 allclose trials at 1e-2, 100 timed trials with CUDA events). Run on a GPU host:

    python benchmarks/verify_throughput.py --out DIR [--candidates seed+structures] [--baseline parallel]
                                           [--lanes 2] [--batch-size 8] [--timing-max-samples 100]
                                           [--baseline-first] [--gpu-worker-cpus N] [--warmup-seconds S]
                                           [--warmup-min-seconds S] [--parallel-group-builds N] [--no-light-headers]
                                           [--no-cuda-before-go] [--member-build-stages]
                                           [--slow-draw-seconds S] [--gpu-draw-mb M] [--hold-gpu-after-timing]

Baselines: "parallel" (the strongest plain one) builds every candidate at once on every core, each in a fresh
process and extension folder, then judges them one at a time in fresh processes that load the built extensions;
"serial" builds and judges one candidate after another, on the first --baseline-subset pairs only (~45-90 s a
candidate); "none" runs ours alone (to compare our own settings, e.g. --lanes and --gpu-worker-cpus).
Candidates: "seed" (the 40 seed pairs) or "seed+structures" (those and one template candidate for each of the 27
structure-synthesis tasks: 67). Writes DIR/seed_verdicts.json (our verdicts of the seed pairs),
DIR/verify_throughput.json (the numbers, every candidate's two verdicts side by side) and DIR/verdict_store, and
prints a summary; the ratio compares candidates fully judged per minute, and ours.phase_seconds says where our
time went (per judgement stage and timing sub-step: count, sum, median).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.verify import VerifyConfig, VerifyJob, compile_only, gpu_inventory, verify_batch  # noqa: E402
from dice_pipeline.verify.inventory import choose_parallelism  # noqa: E402

SCRIPT = str(Path(__file__).resolve())  # what the baseline's fresh processes run, whatever their working folder
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


def baseline_build_worker(request_path: str) -> None:
    """The parallel baseline's build step in this (fresh) process: import the candidate, whose `load_inline`
    builds into this process's TORCH_EXTENSIONS_DIR with load_inline's own flags."""
    request = json.loads(Path(request_path).read_text())
    start = time.perf_counter()
    result: dict = {"status": "built"}
    try:
        exec(compile(request["candidate_src"], "candidate.py", "exec"), {})  # noqa: S102 - baseline does this
    except Exception as exc:  # noqa: BLE001
        result.update(status="compile_error", error=repr(exc)[-500:])
    result["seconds"] = time.perf_counter() - start
    Path(request["result_path"]).write_text(json.dumps(result))


def _baseline_process(flag: str, pair: dict, ext_dir: str, scratch: str, timeout: float) -> dict:
    request = {"reference_src": pair["pytorch_code"], "candidate_src": pair["generated_code"],
               "result_path": os.path.join(scratch, f"{flag.strip('-')}.json")}
    request_path = Path(scratch, f"{flag.strip('-')}_request.json")
    request_path.write_text(json.dumps(request))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir, MAX_JOBS="2")
    try:
        proc = subprocess.run([sys.executable, SCRIPT, flag, str(request_path)], env=env, capture_output=True,
                              text=True, timeout=timeout)
        error = proc.stderr[-500:]
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:g} s"
    path = Path(request["result_path"])
    return json.loads(path.read_text()) if path.exists() else {"status": "runtime_error", "error": error}


def run_parallel_baseline(pairs: list[dict], workdir: Path) -> tuple[float, list[dict], dict]:
    """KernelBench-style, the strongest plain way: every candidate built at once (one fresh process each, as many
    side by side as the host has cores), then judged one at a time in fresh processes that load what was built."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    start = time.perf_counter()
    dirs = [workdir / f"c{i:03d}" for i in range(len(pairs))]
    for folder in dirs:
        (folder / "ext").mkdir(parents=True, exist_ok=True)

    def build(i: int) -> dict:
        return _baseline_process("--baseline-build", pairs[i], str(dirs[i] / "ext"), str(dirs[i]), 1800)

    builds: list[dict] = [{} for _ in pairs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {pool.submit(build, i): i for i in range(len(pairs))}
        for done, future in enumerate(as_completed(futures), 1):
            # Each build as it ends: a run cut short still bounds the baseline's build phase.
            i = futures[future]
            builds[i] = future.result()
            print(f"baseline build {done}/{len(pairs)} ({pairs[i]['problem_name']}: {builds[i]['status']}) at "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
    build_wall = time.perf_counter() - start
    print(f"baseline: {len(pairs)} builds in {build_wall:.1f} s", flush=True)
    results = []
    for i, (pair, built) in enumerate(zip(pairs, builds)):
        if built["status"] != "built":
            result = {"status": "compile_error", "error": built.get("error"), "seconds": 0.0}
        else:
            result = _baseline_process("--baseline-worker", pair, str(dirs[i] / "ext"), str(dirs[i]), 900)
        result.update(problem_name=pair["problem_name"], build_seconds=built.get("seconds"))
        results.append(result)
        speedup = f" {result['speedup']:.3f}x" if result.get("speedup") else ""
        print(f"baseline {pair['problem_name']}: {result['status']}{speedup} in {result.get('seconds', 0):.1f} s "
              f"(judged {i + 1}/{len(pairs)} at {time.perf_counter() - start:.1f} s)", flush=True)
    wall = time.perf_counter() - start
    return wall, results, {"build_wall_seconds": build_wall, "judge_wall_seconds": wall - build_wall}


def phase_summary(verdicts: list) -> dict[str, dict[str, float]]:
    """Per stage of our judgement (provenance phase_seconds) and of its timing phase (timing_split_s): how many
    verdicts went through it, the sum and the median of their seconds: where our wall time goes. `before_go.*`:
    a prestarted worker's CUDA start-up and its wait for the GPU, done while its lane's previous candidate ran."""
    seen: dict[str, list[float]] = {}
    for verdict in verdicts:
        provenance = verdict.provenance or {}
        for name, seconds in provenance.get("phase_seconds", {}).items():
            seen.setdefault(name, []).append(seconds)
        for name, seconds in provenance.get("timing_split_s", {}).items():
            seen.setdefault(f"timing.{name}", []).append(seconds)
        for name, seconds in (provenance.get("cuda_started_before_go") or {}).items():
            seen.setdefault(f"before_go.cuda_start_{name}", []).append(seconds)
    return {name: {"n": len(values), "sum": round(sum(values), 3), "median": round(statistics.median(values), 4)}
            for name, values in sorted(seen.items())}


def timeline(arrivals, wall: float, step: float = 10.0) -> dict[str, int]:
    """Verdicts in by each `step` seconds of the run ("10": n, "20": m, ...): when the pipeline started delivering
    and where it stalled."""
    arrivals = sorted(arrivals)
    marks = [step * k for k in range(1, int(wall // step) + 2)]
    return {f"{mark:g}": sum(a <= mark for a in arrivals) for mark in marks}


def baseline_subset(pairs: list[dict], n: int) -> list[dict]:
    """The first `n` of DEFAULT_BASELINE_SUBSET present in the corpus (an honest kernel first, then a wrong one)."""
    by_name = {p["problem_name"]: p for p in pairs}
    return [by_name[name] for name in DEFAULT_BASELINE_SUBSET if name in by_name][:n]


def run_serial_baseline(pairs: list[dict]) -> tuple[float, list[dict]]:
    results = []
    start = time.perf_counter()
    for pair in pairs:
        with tempfile.TemporaryDirectory(prefix="kb_baseline_") as scratch:
            # A fresh extensions dir per candidate: KernelBench builds every candidate cold.
            result = _baseline_process("--baseline-worker", pair, os.path.join(scratch, "ext"), scratch, 900)
        result["problem_name"] = pair["problem_name"]
        results.append(result)
        print(f"baseline {pair['problem_name']}: {result['status']} in {result.get('seconds', 0):.1f} s", flush=True)
    return time.perf_counter() - start, results


def structure_pairs() -> list[dict]:
    """One template candidate for each structure-synthesis task, in the seed pairs' shape."""
    from dice_pipeline.synthesis.catalogue import structure_catalogue
    from dice_pipeline.synthesis.templates import TemplateGenerator

    generator, pairs = TemplateGenerator(), []
    for task in structure_catalogue():
        candidates = generator.generate(task.pytorch_code, 1, seed=0)
        if candidates and candidates[0].code:
            pairs.append({"uuid": f"structure:{task.task_id}", "problem_name": task.task_id,
                          "pytorch_code": task.pytorch_code, "generated_code": candidates[0].code})
    return pairs


# What KernelBench's harness can say, and ours mapped onto it: a rejection it has no notion of stays apart.
_COMMON = {"correct": "correct", "incorrect": "incorrect", "runtime_error": "incorrect",
           "compile_error": "compile_error"}


def agreement(ours: str, baseline: str) -> str:
    """'same', 'ours_rejects' (deceptive and similar: checks KernelBench's harness does not make), or 'differ'."""
    if _COMMON.get(ours, ours) == _COMMON.get(baseline, baseline):
        return "same"
    if ours in ("deceptive",) and baseline == "correct":
        return "ours_rejects"
    return "differ"


def build_summary(args: argparse.Namespace, config: VerifyConfig, pairs: list[dict], verdicts: list,
                  ours_wall: float, arrived_s: dict[str, float], subset: list[dict], baseline_wall: float,
                  baseline_results: list[dict], baseline_phases: dict, cache_hit: dict | None,
                  host_cpus: int | None) -> dict:
    """The numbers of one run: both sides' rates and their ratio, every candidate's two verdicts side by side,
    our settings and where our time went."""
    ours_by_name = {p["problem_name"]: v for p, v in zip(pairs, verdicts)}
    gpus = gpu_inventory()
    chosen = choose_parallelism(config, gpus, bool(gpus))
    build_seconds = [r.get("build_seconds", r.get("compile_seconds")) for r in baseline_results]
    cold = [v.compile_seconds for v in verdicts if v.compile_seconds and not v.build_cache_hit]
    side_by_side = [{"problem_name": r["problem_name"], "baseline": r["status"],
                     "ours": ours_by_name[r["problem_name"]].status.value,
                     "agreement": agreement(ours_by_name[r["problem_name"]].status.value, r["status"]),
                     "ours_reasons": ours_by_name[r["problem_name"]].reason_codes(),
                     "baseline_speedup": r.get("speedup"), "ours_speedup": ours_by_name[r["problem_name"]].speedup,
                     "baseline_seconds": r.get("seconds"), "ours_at_s": arrived_s.get(r["problem_name"]),
                     **({"baseline_error": r["error"]} if r.get("error") else {})}
                    for r in baseline_results]
    summary = {
        "gpu": verdicts[0].provenance.get("gpu"), "host_cpus": host_cpus,
        "time": verdicts[0].provenance.get("time"), "candidates_set": args.candidates,
        "order": "baseline first" if args.baseline_first else "ours first",
        "ours": {"candidates": len(verdicts), "wall_seconds": ours_wall, "per_minute": len(verdicts) / ours_wall * 60,
                 # as the batch ran them: chosen for this host where the flags left them unset
                 **{key: value for key, value in vars(chosen).items()
                    if key in ("gpu_lanes", "gpu_worker_cpus", "max_parallel_builds")},
                 "build_batch_size": args.batch_size or "chosen from the build slots",
                 "timing_samples": [config.timing_samples, config.timing_max_samples],
                 "timing_budget_s": config.timing_budget_s, "warmup_seconds": config.warmup_seconds,
                 "warmup_min_seconds": config.warmup_min_seconds,
                 "warmup_steady": sum(bool(v.provenance.get("warmup_steady")) for v in verdicts),
                 "parallel_group_builds": config.parallel_group_builds,
                 "light_cuda_headers": config.light_cuda_headers,
                 "slow_draw_seconds": config.slow_draw_seconds, "gpu_draw_bytes": config.gpu_draw_bytes,
                 "release_gpu_after_timing": config.release_gpu_after_timing,
                 "start_cuda_before_go": config.start_cuda_before_go,
                 "skip_grouped_member_builds": config.skip_grouped_member_builds,
                 "cold_build_seconds_median": statistics.median(cold) if cold else None,
                 "cold_build_seconds_min": min(cold) if cold else None, **(cache_hit or {}),
                 "phase_seconds": phase_summary(verdicts),
                 "verdicts_by_second": timeline(arrived_s.values(), ours_wall),
                 "statuses": {s: sum(v.status.value == s for v in verdicts) for s in {v.status.value for v in verdicts}}},
        "baseline": {"kind": args.baseline, "candidates": len(subset), "wall_seconds": baseline_wall,
                     "per_minute": len(subset) / baseline_wall * 60 if baseline_wall else None, **baseline_phases,
                     **({"build_seconds": build_seconds} if any(x is not None for x in build_seconds) else {})},
        "agreement": {kind: sum(r["agreement"] == kind for r in side_by_side)
                      for kind in ("same", "ours_rejects", "differ")},
        "side_by_side": side_by_side,
    }
    baseline_rate = summary["baseline"]["per_minute"]
    summary["throughput_ratio"] = summary["ours"]["per_minute"] / baseline_rate if baseline_rate else None
    return summary


_OURS_LINE = re.compile(r"^ours (\S+): .*\(at ([0-9.]+) s\)$")
_OURS_WALL = re.compile(r"^ours: (\d+) candidates in ([0-9.]+) s$")
_BASELINE_BUILDS = re.compile(r"^baseline: (\d+) builds in ([0-9.]+) s$")
_BASELINE_JUDGED = re.compile(r"^baseline (\S+): (\w+)(?: ([0-9.]+)x)? in ([0-9.]+) s \(judged (\d+)/(\d+) at ([0-9.]+) s\)$")


def summary_from_log(args: argparse.Namespace, config: VerifyConfig, pairs: list[dict], log_text: str,
                     partial_rows: list[dict]) -> dict:
    """The summary of a run whose process ended before it wrote one (a device lease running out), from what it
    printed and the verdicts it wrote as they landed. Both sides must have finished: a baseline cut short bounds
    its rate, it does not measure it, and this says so instead of guessing."""
    from dice_pipeline.verify.verdict import Verdict

    ours_wall: float | None = None
    baseline_builds: float | None = None
    arrived_s: dict[str, float] = {}
    judged: dict[str, dict] = {}
    for line in log_text.splitlines():
        if m := _OURS_LINE.match(line):
            arrived_s[m.group(1)] = float(m.group(2))
        elif m := _OURS_WALL.match(line):
            ours_wall = float(m.group(2))
        elif m := _BASELINE_BUILDS.match(line):
            baseline_builds = float(m.group(2))
        elif m := _BASELINE_JUDGED.match(line):
            judged[m.group(1)] = {"problem_name": m.group(1), "status": m.group(2),
                                  "speedup": float(m.group(3)) if m.group(3) else None,
                                  "seconds": float(m.group(4)), "at": float(m.group(7))}
    by_name = {row["problem_name"]: Verdict.from_dict(row["verdict"]) for row in partial_rows}
    missing_ours = [p["problem_name"] for p in pairs if p["problem_name"] not in by_name]
    missing_baseline = [p["problem_name"] for p in pairs if p["problem_name"] not in judged]
    if ours_wall is None or missing_ours:
        raise ValueError(f"our run did not finish in this log ({len(missing_ours)} verdicts missing)")
    if args.baseline != "none" and (baseline_builds is None or missing_baseline):
        raise ValueError(f"the baseline did not finish in this log ({len(missing_baseline)} of {len(pairs)} not "
                         "judged): its rate is only bounded")
    results = [judged[p["problem_name"]] for p in pairs] if args.baseline != "none" else []
    baseline_wall = max((r["at"] for r in results), default=0.0)
    phases = {"build_wall_seconds": baseline_builds, "judge_wall_seconds": baseline_wall - baseline_builds} \
        if results else {}
    summary = build_summary(args, config, pairs, [by_name[p["problem_name"]] for p in pairs], ours_wall, arrived_s,
                            pairs if results else [], baseline_wall, results, phases, None, None)
    summary["rebuilt_from_log"] = True
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=False, default="benchmarks/results")
    parser.add_argument("--candidates", choices=("seed", "seed+structures"), default="seed")
    parser.add_argument("--baseline", choices=("serial", "parallel", "none"), default="serial",
                        help="none: ours alone (e.g. to compare our own settings; no ratio)")
    parser.add_argument("--baseline-subset", type=int, default=3, help="pairs the serial baseline judges")
    parser.add_argument("--lanes", type=int, default=None,
                        help="our judging lanes a GPU (VerifyConfig.gpu_lanes; default: chosen for this host from the "
                             "GPU's memory and the cores, as the pipeline's)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="our build groups (VerifyConfig.build_batch_size; default: chosen from the build slots)")
    parser.add_argument("--gpu-worker-cpus", type=int, default=None,
                        help="cores our GPU workers get a GPU (VerifyConfig.gpu_worker_cpus; default a core a lane)")
    parser.add_argument("--warmup-seconds", type=float, default=None,
                        help="our warm-up before each candidate's timed pairs (VerifyConfig.warmup_seconds)")
    parser.add_argument("--warmup-min-seconds", type=float, default=None,
                        help="our shortest warm-up (VerifyConfig.warmup_min_seconds; = --warmup-seconds: a fixed one)")
    parser.add_argument("--parallel-group-builds", type=int, default=None,
                        help="our group builds at once (VerifyConfig.parallel_group_builds; 0: build cores / 2)")
    parser.add_argument("--no-cuda-before-go", action="store_true",
                        help="prestarted workers start CUDA at their go, not before it beside other lanes "
                             "(VerifyConfig.start_cuda_before_go=False)")
    parser.add_argument("--member-build-stages", action="store_true",
                        help="every grouped candidate also runs its own (cached) build stage "
                             "(VerifyConfig.skip_grouped_member_builds=False)")
    parser.add_argument("--no-light-headers", action="store_true",
                        help="our builds without the light CUDA and binding-file headers "
                             "(VerifyConfig.light_cuda_headers=False)")
    parser.add_argument("--hold-gpu-after-timing", action="store_true",
                        help="a worker asks for shared use again after its last timed section instead of giving the "
                             "GPU up (VerifyConfig.release_gpu_after_timing=False)")
    parser.add_argument("--slow-draw-seconds", type=float, default=None,
                        help="our inputs are drawn on the GPU when one host draw takes longer "
                             "(VerifyConfig.slow_draw_seconds; default the config's)")
    parser.add_argument("--gpu-draw-mb", type=int, default=None,
                        help="our inputs larger than this are drawn on the GPU (VerifyConfig.gpu_draw_bytes, in MiB)")
    parser.add_argument("--timing-max-samples", type=int, default=None,
                        help="our timed reference/candidate pairs at most (VerifyConfig.timing_max_samples; default "
                             "the config's). 100 = the baseline's 100 timed candidate calls")
    parser.add_argument("--baseline-first", action="store_true",
                        help="run the baseline before ours (default: ours first; the order never changes a number)")
    parser.add_argument("--verdict-store", default=None,
                        help="also put our verdicts in this verdict store (default OUT/verdict_store)")
    parser.add_argument("--from-log", default=None,
                        help="write OUT/verify_throughput.json from a run's printed log and OUT/"
                             "seed_verdicts.partial.jsonl (a run cut short before its summary), nothing judged; "
                             "pass the run's own flags")
    parser.add_argument("--baseline-worker", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-build", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        baseline_worker(args.baseline_worker)
        return 0
    if args.baseline_build:
        baseline_build_worker(args.baseline_build)
        return 0
    from dice_pipeline.seed_corpus import load_seed_pairs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = load_seed_pairs()
    pairs = seeds + (structure_pairs() if args.candidates == "seed+structures" else [])

    # The store starts empty here (no verdict is reused), so the throughput is measured, not remembered.
    store_dir = Path(args.verdict_store or out / "verdict_store")
    if not args.from_log and store_dir.exists() and any(store_dir.rglob("*.json")):
        parser.error(f"{store_dir} already holds verdicts: the benchmark needs an empty store")
    timing = {} if args.timing_max_samples is None else {"timing_max_samples": args.timing_max_samples}
    if not args.from_log:  # a fresh, empty build cache: every build is cold
        timing["build_cache_dir"] = tempfile.mkdtemp(prefix="dice_verify_bench_cache_")
    if args.gpu_worker_cpus is not None:
        timing["gpu_worker_cpus"] = args.gpu_worker_cpus
    if args.warmup_seconds is not None:
        timing["warmup_seconds"] = args.warmup_seconds
    if args.warmup_min_seconds is not None:
        timing["warmup_min_seconds"] = args.warmup_min_seconds
    if args.parallel_group_builds is not None:
        timing["parallel_group_builds"] = args.parallel_group_builds
    if args.no_light_headers:
        timing["light_cuda_headers"] = False
    if args.no_cuda_before_go:
        timing["start_cuda_before_go"] = False
    if args.member_build_stages:
        timing["skip_grouped_member_builds"] = False
    if args.hold_gpu_after_timing:
        timing["release_gpu_after_timing"] = False
    if args.slow_draw_seconds is not None:
        timing["slow_draw_seconds"] = args.slow_draw_seconds
    if args.gpu_draw_mb is not None:
        timing["gpu_draw_bytes"] = args.gpu_draw_mb * 2**20
    config = VerifyConfig(verdict_store_dir=str(store_dir), gpu_lanes=args.lanes,
                          build_batch_size=args.batch_size, **timing)
    if args.from_log:
        rows = [json.loads(line) for line in (out / "seed_verdicts.partial.jsonl").read_text().splitlines() if line]
        summary = summary_from_log(args, config, pairs, Path(args.from_log).read_text(), rows)
        (out / "verify_throughput.json").write_text(json.dumps(summary, indent=1, default=str))
        print(json.dumps({k: v for k, v in summary.items() if k != "side_by_side"}, indent=1, default=str))
        return 0
    jobs = [VerifyJob(p["uuid"], p["pytorch_code"], p["generated_code"]) for p in pairs]
    uuid_to_name = {p["uuid"]: p["problem_name"] for p in pairs}

    arrived_s: dict[str, float] = {}  # seconds from the start of our run to each verdict: the pipeline's timeline

    def run_ours() -> tuple[float, list]:
        start = time.perf_counter()
        partial = (out / "seed_verdicts.partial.jsonl").open("w")

        def record(job, verdict):
            # Written as each verdict lands, so a run cut short by its time limit still returns what it judged.
            arrived_s[uuid_to_name[job.job_id]] = round(time.perf_counter() - start, 2)
            print(f"ours {uuid_to_name[job.job_id]}: {verdict.summary()} "
                  f"(at {arrived_s[uuid_to_name[job.job_id]]:.1f} s)", flush=True)
            partial.write(json.dumps({"job_id": job.job_id, "problem_name": uuid_to_name[job.job_id],
                                      "verdict": verdict.to_dict()}, sort_keys=True) + "\n")
            partial.flush()

        verdicts = verify_batch(jobs, config, on_result=record)
        partial.close()
        wall = time.perf_counter() - start
        seed_verdicts = [{"job_id": p["uuid"], "problem_name": p["problem_name"], "verdict": v.to_dict()}
                         for p, v in zip(pairs, verdicts) if p in seeds]
        (out / "seed_verdicts.json").write_text(json.dumps(seed_verdicts, indent=1, sort_keys=True))
        print(f"ours: {len(jobs)} candidates in {wall:.1f} s", flush=True)
        return wall, verdicts

    def run_baseline() -> tuple[list[dict], float, list[dict], dict]:
        if args.baseline == "none":
            return [], 0.0, [], {}
        if args.baseline == "parallel":
            wall, results, phases = run_parallel_baseline(pairs, Path(tempfile.mkdtemp(prefix="kb_parallel_baseline_")))
            return pairs, wall, results, phases
        subset = baseline_subset(pairs, args.baseline_subset)
        wall, results = run_serial_baseline(subset)
        return subset, wall, results, {}

    # Ours first by default: its seed-corpus verdicts are the result other stages need, should the baseline overrun.
    # --baseline-first where the baseline's numbers are the ones a cut-short run must not lose.
    if args.baseline_first:
        subset, baseline_wall, baseline_results, baseline_phases = run_baseline()
        ours_wall, verdicts = run_ours()
    else:
        ours_wall, verdicts = run_ours()
        subset, baseline_wall, baseline_results, baseline_phases = run_baseline()

    hit_start = time.perf_counter()
    hit = compile_only(pairs[0]["pytorch_code"], pairs[0]["generated_code"], config)
    hit_wall = time.perf_counter() - hit_start
    summary = build_summary(args, config, pairs, verdicts, ours_wall, arrived_s, subset, baseline_wall,
                            baseline_results, baseline_phases,
                            {"cache_hit_build_seconds": hit.compile_seconds, "cache_hit_call_wall_seconds": hit_wall},
                            os.cpu_count())
    (out / "verify_throughput.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "side_by_side"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
