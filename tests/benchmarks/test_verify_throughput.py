"""The throughput benchmark's parts that run without a GPU: its candidate set, the KernelBench-style build step of
the parallel baseline, and how two verdicts are compared."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dice_pipeline.verify import VerifyConfig
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


def test_the_two_sides_run_in_the_order_asked_and_the_baseline_reports_as_it_goes(tmp_path, monkeypatch, capsys):
    """Both sides replaced by fakes that record when they ran (the real ones need a GPU): the order flag changes
    only which runs first, and the parallel baseline prints each build and judgement with its time as it ends."""
    from dice_pipeline.verify.verdict import Status, Verdict

    ran: list[str] = []

    def fake_verify_batch(jobs, config, on_result=None):
        ran.append("ours")
        verdicts = [Verdict(status=Status.CORRECT, speedup=1.5, provenance={"gpu": "test", "time": "t"}) for _ in jobs]
        for job, verdict in zip(jobs, verdicts):
            on_result(job, verdict)
        return verdicts

    def fake_process(flag, pair, ext_dir, scratch, timeout):
        if flag == "--baseline-build":
            ran.append("baseline_build")
            return {"status": "built", "seconds": 0.01}
        ran.append("baseline_judge")
        if pair["problem_name"] == "relu":  # a judge process that died: its error travels to the side-by-side row
            return {"status": "runtime_error", "error": "python3: can't open file"}
        return {"status": "correct", "seconds": 0.01, "speedup": 1.4}

    monkeypatch.setattr(verify_throughput, "verify_batch", fake_verify_batch)
    monkeypatch.setattr(verify_throughput, "_baseline_process", fake_process)
    monkeypatch.setattr(verify_throughput, "compile_only", lambda *a, **k: Verdict(status=Status.CORRECT))
    for first, order in ((True, "baseline first"), (False, "ours first")):
        ran.clear()
        out = tmp_path / order.replace(" ", "_")
        argv = ["verify_throughput.py", "--out", str(out), "--baseline", "parallel"] + (["--baseline-first"] * first)
        monkeypatch.setattr(sys, "argv", argv)
        assert verify_throughput.main() == 0
        summary = json.loads((out / "verify_throughput.json").read_text())
        n = summary["ours"]["candidates"]
        assert summary["order"] == order and summary["baseline"]["candidates"] == n == 40
        assert summary["agreement"] == {"same": n - 1, "ours_rejects": 0, "differ": 1}
        rows = {r["problem_name"]: r for r in summary["side_by_side"]}
        assert rows["relu"]["baseline_error"] == "python3: can't open file"
        assert "baseline_error" not in rows["mish"] and rows["mish"]["baseline_seconds"] == 0.01
        assert all(r["ours_at_s"] is not None for r in rows.values())
        marks = summary["ours"]["verdicts_by_second"]
        assert list(marks)[0] == "10" and list(marks.values())[-1] == n
        sides = [step for i, step in enumerate(ran) if i == 0 or ran[i - 1] != step]
        assert sides == (["baseline_build", "baseline_judge", "ours"] if first else
                         ["ours", "baseline_build", "baseline_judge"])
    printed = capsys.readouterr().out
    assert f"baseline build {n}/{n} (" in printed and f"(judged {n}/{n} at " in printed


def test_ours_alone_reports_its_settings_and_where_its_time_went(tmp_path, monkeypatch):
    from dice_pipeline.verify.verdict import Status, Verdict

    configs = []

    def fake_verify_batch(jobs, config, on_result=None):
        configs.append(config)
        provenance = {"gpu": "test", "time": "t", "phase_seconds": {"correctness": 1.0, "timing": 3.0},
                      "timing_split_s": {"launch_floors": 0.1, "warmup": 0.5, "pairs": 2.0},
                      "cuda_started_before_go": {"seconds": 1.5, "gpu_wait_s": 0.25}}
        verdicts = [Verdict(status=Status.CORRECT, speedup=1.5, provenance=dict(provenance)) for _ in jobs]
        verdicts[0].provenance = {"gpu": "test", "time": "t", "phase_seconds": {"correctness": 3.0}}  # no timing
        for job, verdict in zip(jobs, verdicts):
            on_result(job, verdict)
        return verdicts

    def no_baseline(*args, **kwargs):
        raise AssertionError("--baseline none runs no baseline")

    monkeypatch.setattr(verify_throughput, "verify_batch", fake_verify_batch)
    monkeypatch.setattr(verify_throughput, "_baseline_process", no_baseline)
    monkeypatch.setattr(verify_throughput, "compile_only", lambda *a, **k: Verdict(status=Status.CORRECT))
    monkeypatch.setattr(sys, "argv", ["verify_throughput.py", "--out", str(tmp_path), "--baseline", "none",
                                      "--lanes", "4", "--gpu-worker-cpus", "4", "--warmup-seconds", "0.1",
                                      "--no-cuda-before-go", "--member-build-stages",
                                      "--slow-draw-seconds", "0.5", "--gpu-draw-mb", "256",
                                      "--hold-gpu-after-timing"])
    assert verify_throughput.main() == 0
    summary = json.loads((tmp_path / "verify_throughput.json").read_text())
    assert configs[0].start_cuda_before_go is False and configs[0].skip_grouped_member_builds is False
    assert summary["ours"]["start_cuda_before_go"] is False and summary["ours"]["skip_grouped_member_builds"] is False
    assert configs[0].gpu_lanes == 4 and configs[0].gpu_worker_cpus == 4 and summary["ours"]["gpu_worker_cpus"] == 4
    assert configs[0].warmup_seconds == 0.1 == summary["ours"]["warmup_seconds"]
    # the input-draw settings before 2026-12-06's change, for an A/B against today's defaults
    assert configs[0].slow_draw_seconds == 0.5 == summary["ours"]["slow_draw_seconds"]
    assert configs[0].gpu_draw_bytes == 256 * 2**20 == summary["ours"]["gpu_draw_bytes"]
    assert VerifyConfig().gpu_draw_bytes < configs[0].gpu_draw_bytes
    assert configs[0].release_gpu_after_timing is False is summary["ours"]["release_gpu_after_timing"]
    assert summary["baseline"]["candidates"] == 0 and summary["throughput_ratio"] is None
    assert summary["side_by_side"] == []
    phases = summary["ours"]["phase_seconds"]
    assert phases["correctness"] == {"n": 40, "sum": 39 * 1.0 + 3.0, "median": 1.0}
    assert phases["timing"]["n"] == 39 and phases["timing.pairs"] == {"n": 39, "sum": 78.0, "median": 2.0}
    # the prestarted workers' CUDA start-up, kept apart from the judgement's phases
    assert phases["before_go.cuda_start_seconds"] == {"n": 39, "sum": 58.5, "median": 1.5}
    assert phases["before_go.cuda_start_gpu_wait_s"]["median"] == 0.25


def test_the_timeline_counts_verdicts_in_by_each_mark():
    assert verify_throughput.timeline([3.0, 12.5, 12.6, 31.0], 31.0) == {"10": 1, "20": 3, "30": 3, "40": 4}
    assert verify_throughput.timeline([], 4.0) == {"10": 0}


def test_the_baseline_runs_its_own_script_by_absolute_path():
    assert Path(verify_throughput.SCRIPT).is_absolute() and Path(verify_throughput.SCRIPT).exists()


def _printed_run(pairs, baseline_judged: int) -> tuple[str, list[dict]]:
    """What a run prints, and the verdicts it writes as they land: ours judged every pair, the baseline the first
    `baseline_judged` of them."""
    from dice_pipeline.verify.verdict import Status, Verdict

    lines, rows = [], []
    for i, pair in enumerate(pairs):
        status = Status.DECEPTIVE if i == 0 else Status.CORRECT
        verdict = Verdict(status=status, speedup=None if i == 0 else 1.5, provenance={"gpu": "H100", "time": "t"})
        lines.append(f"ours {pair['problem_name']}: {verdict.summary()} (at {10.0 + i:.1f} s)")
        rows.append({"job_id": pair["uuid"], "problem_name": pair["problem_name"], "verdict": verdict.to_dict()})
    lines.append(f"ours: {len(pairs)} candidates in {10.0 + len(pairs):.1f} s")
    lines += [f"baseline build {i + 1}/{len(pairs)} ({p['problem_name']}: built) at {50.0 + i:.1f} s"
              for i, p in enumerate(pairs)]
    lines.append(f"baseline: {len(pairs)} builds in {50.0 + len(pairs):.1f} s")
    for i, pair in enumerate(pairs[:baseline_judged]):
        speedup = "" if i == 1 else " 1.400x"  # a line without one, as older runs printed
        lines.append(f"baseline {pair['problem_name']}: correct{speedup} in 2.0 s (judged {i + 1}/{len(pairs)} at "
                     f"{100.0 + 2 * i:.1f} s)")
    return "\n".join(lines) + "\n", rows


def test_a_run_cut_short_before_its_summary_is_summarised_from_its_log(tmp_path, monkeypatch):
    from dice_pipeline.seed_corpus import load_seed_pairs

    pairs = load_seed_pairs()
    log, rows = _printed_run(pairs, len(pairs))
    (tmp_path / "log.txt").write_text(log)
    (tmp_path / "seed_verdicts.partial.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(verify_throughput, "verify_batch", lambda *a, **k: pytest.fail("nothing is judged again"))
    monkeypatch.setattr(sys, "argv", ["verify_throughput.py", "--out", str(tmp_path), "--baseline", "parallel",
                                      "--lanes", "4", "--from-log", str(tmp_path / "log.txt")])
    assert verify_throughput.main() == 0
    summary = json.loads((tmp_path / "verify_throughput.json").read_text())
    n = len(pairs)
    assert summary["rebuilt_from_log"] and summary["ours"]["gpu_lanes"] == 4
    assert summary["ours"]["wall_seconds"] == 10.0 + n and summary["baseline"]["wall_seconds"] == 100.0 + 2 * (n - 1)
    assert summary["baseline"]["build_wall_seconds"] == 50.0 + n and "build_seconds" not in summary["baseline"]
    assert summary["throughput_ratio"] == pytest.approx((100.0 + 2 * (n - 1)) / (10.0 + n))
    assert summary["agreement"] == {"same": n - 1, "ours_rejects": 1, "differ": 0}
    rows_out = summary["side_by_side"]
    assert rows_out[0]["baseline_speedup"] == 1.4 and rows_out[1]["baseline_speedup"] is None
    assert rows_out[2]["ours_at_s"] == 12.0 and summary["ours"]["verdicts_by_second"]["10"] == 1


def test_a_baseline_cut_short_is_not_given_a_rate():
    from dice_pipeline.seed_corpus import load_seed_pairs
    from dice_pipeline.verify import VerifyConfig

    pairs = load_seed_pairs()
    log, rows = _printed_run(pairs, len(pairs) - 3)
    args = argparse.Namespace(baseline="parallel", candidates="seed", baseline_first=False, lanes=1, batch_size=8)
    with pytest.raises(ValueError, match="3 of 40 not judged"):
        verify_throughput.summary_from_log(args, VerifyConfig(), pairs, log, rows)
    with pytest.raises(ValueError, match="our run did not finish"):
        verify_throughput.summary_from_log(args, VerifyConfig(), pairs, log, rows[:-1])
