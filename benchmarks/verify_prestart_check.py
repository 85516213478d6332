"""The GPU stage with and without prestarted workers (`VerifyConfig.prestart_gpu_workers`), in one process: the same
4 seed pairs judged four times (cold builds, then cached builds with prestart on, off, on), wall time per run.

    python benchmarks/verify_prestart_check.py --out DIR      # GPU host; writes DIR/prestart_check.json
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.seed_corpus import load_seed_pairs  # noqa: E402
from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch  # noqa: E402

PAIRS = ("cubic_polynomial", "gelu_tanh_approx", "rope_apply", "causal_attention")
RUNS = (("cold_builds_prestart_off", False), ("cached_prestart_on", True), ("cached_prestart_off", False),
        ("cached_prestart_on_again", True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = {p["problem_name"]: p for p in load_seed_pairs()}
    jobs = [VerifyJob(name, pairs[name]["pytorch_code"], pairs[name]["generated_code"]) for name in PAIRS]
    cache = tempfile.mkdtemp(prefix="dice_prestart_cache_")
    results = []
    for label, prestart in RUNS:
        config = VerifyConfig(build_cache_dir=cache, prestart_gpu_workers=prestart)
        start = time.perf_counter()
        verdicts = verify_batch(jobs, config)
        results.append(dict(run=label, wall_s=round(time.perf_counter() - start, 2), verdicts={
            job.job_id: (v.status.value, v.speedup and round(v.speedup, 3), v.reason_codes(),
                         (v.provenance or {}).get("run_seconds")) for job, v in zip(jobs, verdicts)}))
        print(json.dumps(results[-1]), flush=True)
        (args.out / "prestart_check.json").write_text(json.dumps(results, indent=1))
    on = statistics.fmean(r["wall_s"] for r in results if r["run"].startswith("cached_prestart_on"))
    off = next(r["wall_s"] for r in results if r["run"] == "cached_prestart_off")
    print(f"cached builds: prestart on {on:.1f} s (mean of 2) vs off {off:.1f} s: {off / on:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
