"""The whole chain with real GPU verification on a machine without a GPU: `dice run --verdict-store` over the
verdicts our H200 runs stored (benchmarks/results/h200_verdict_store, see benchmarks/RESULTS.md). Every pair and
structure candidate must get its H200 verdict, and CuKe must be built from measured results only.

The committed store holds verifier 0.2's verdicts: they are used only because the run asks for them
(`--accept-verdicts-from 0.2.0`), and each says so (flag `older_verifier_version`, `judged_by_verifier`). To refresh
it, re-run `benchmarks/verify_throughput.py` and `dice synthesize` on a GPU host into a store and replace
benchmarks/results/h200_verdict_store with it."""

import json
from pathlib import Path

import pytest

from warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "benchmarks" / "results" / "h200_verdict_store"


@pytest.mark.slow
def test_main_job_reuses_the_h200_verdicts(tmp_path, run_dice):
    # CUDA_VISIBLE_DEVICES="": judged from the store even where a GPU is present.
    result = run_dice("run", "--verdict-store", str(STORE), "--accept-verdicts-from", "0.2.0", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    wh = Warehouse(tmp_path / "w.duckdb")

    pairs = wh.query("SELECT status, executed, gpu_name, verdict_json FROM verify.verified_pairs")
    verdicts = [json.loads(v) for v in pairs["verdict_json"]]
    # Static rejections never reach a GPU and are not stored; every other verdict must be the H200's.
    judged = [v for v in verdicts if not any(r["stage"] == "static" for r in v["reasons"])]
    stale = [v["status"] for v in judged if not v["provenance"].get("from_verdict_store")]
    assert not stale, f"stale verdict store? verdicts judged here: {stale}"
    assert len(judged) >= 35 and {v["provenance"]["gpu"] for v in judged} == {"NVIDIA H200"}
    # Older verdicts are never reused silently: each names the verifier version that judged it.
    assert all(v["provenance"].get("judged_by_verifier") == "0.2.0" for v in judged)
    assert all("older_verifier_version" in v["flags"] for v in judged)
    executed = pairs.filter(pairs["executed"])
    assert executed.height >= 30 and set(executed["gpu_name"]) == {"NVIDIA H200"}

    instances = wh.query("SELECT status, speedup, kept FROM synthesis.structure_instances")
    assert instances.height >= 20 and set(instances["status"]) == {"correct"}, "stale verdict store?"
    kept = instances.filter(instances["kept"])
    assert kept.height > 0 and min(kept["speedup"]) >= 1.0

    samples = wh.query("SELECT source, verification_status, speedup_used FROM cuke.cuke_sft_samples "
                       "WHERE cuke_threshold_key = '2.0'")
    assert set(samples["source"]) == {"concur", "structure"}
    assert set(samples["verification_status"]) == {"correct"}
    concur = samples.filter(samples["source"] == "concur")
    assert min(concur["speedup_used"]) >= 2.0
