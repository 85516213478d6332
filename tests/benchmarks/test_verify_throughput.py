"""The throughput benchmark's parts that run without a GPU: its candidate set, the KernelBench-style build step of
the parallel baseline, and how two verdicts are compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dice_pipeline.verify.batched_build import read_inline_extensions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import verify_throughput  # noqa: E402


def test_the_structure_candidates_make_the_set_larger_than_64():
    from dice_pipeline.seed_corpus import load_seed_pairs

    structures = verify_throughput.structure_pairs()
    assert len(structures) == 27 and len(load_seed_pairs()) + len(structures) >= 64
    assert len({p["uuid"] for p in structures}) == 27
    assert all(read_inline_extensions(p["generated_code"]) for p in structures)  # real load_inline candidates


def test_verdicts_are_compared_on_what_kernelbenchs_harness_can_say():
    assert verify_throughput.agreement("correct", "correct") == "same"
    assert verify_throughput.agreement("runtime_error", "incorrect") == "same"
    assert verify_throughput.agreement("compile_error", "compile_error") == "same"
    assert verify_throughput.agreement("deceptive", "correct") == "ours_rejects"
    assert verify_throughput.agreement("incorrect", "correct") == "differ"
    assert verify_throughput.agreement("correct", "compile_error") == "differ"


def test_the_baseline_build_step_reports_a_candidate_that_fails_at_import(tmp_path):
    request = {"candidate_src": "raise RuntimeError('nvcc said no')", "result_path": str(tmp_path / "r.json")}
    (tmp_path / "q.json").write_text(json.dumps(request))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verify_throughput.py"), "--baseline-build",
                    str(tmp_path / "q.json")], check=True, cwd=tmp_path)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["status"] == "compile_error" and "nvcc said no" in result["error"]
