"""The baselines adapter over the verifier's measure_references, with hand-built rows (and the real function where
this verifier has it: on a GPU-less host every row is not_executed)."""

from __future__ import annotations

import pytest

from dice_pipeline import verify
from dice_pipeline.evaluation.baselines import measure_baselines, speedup_over
from dice_pipeline.evaluation.evaluate import evaluation_verify_config
from dice_pipeline.kernelbench import KernelBenchTask

CODE = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
TASKS = [KernelBenchTask(1, 1, "1_a", CODE), KernelBenchTask(1, 2, "2_b", CODE)]


def measured(task_id, eager=2.0, compile_ms=1.0, status="measured"):
    return {"task_id": task_id, "status": status, "message": "", "eager_ms_gpu": eager, "eager_ms_host": eager * 1.1,
            "compile_ms_gpu": compile_ms, "peak_gpu_mb": 10.0, "input_draw": {"seed": 42},
            "provenance": {"gpu": "NVIDIA H200"}}


def test_rows_come_back_in_task_order_with_every_field():
    calls = []

    def fake(jobs, config, baselines):
        calls.append((jobs, baselines))
        return [measured("L1/2_b", 4.0), measured("L1/1_a")]

    rows = measure_baselines(TASKS, evaluation_verify_config(), measure=fake)
    assert [r["task_id"] for r in rows] == ["L1/1_a", "L1/2_b"] and rows[1]["eager_ms_gpu"] == 4.0
    assert calls[0] == ([("L1/1_a", CODE), ("L1/2_b", CODE)], ("eager", "compile"))
    assert speedup_over(rows[0]["compile_ms_gpu"], 0.5) == 2.0 and speedup_over(None, 0.5) is None


def test_a_row_missing_or_with_an_unknown_status_is_an_error():
    with pytest.raises(ValueError, match="rows for 2 tasks"):
        measure_baselines(TASKS, evaluation_verify_config(),
                          measure=lambda jobs, config, baselines: [measured("L1/1_a")])
    with pytest.raises(ValueError, match="unknown status"):
        measure_baselines(TASKS, evaluation_verify_config(),
                          measure=lambda jobs, config, baselines: [measured(t, status="fine") for t, _ in jobs])


def test_without_a_gpu_every_row_is_not_executed_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    config = evaluation_verify_config(execute=False, build_cache_dir=str(tmp_path))
    rows = measure_baselines(TASKS, config)
    assert [r["status"] for r in rows] == ["not_executed"] * 2
    if not hasattr(verify, "measure_references"):  # verifier < 0.3: the adapter says nothing was timed, and why
        assert all("measure_references" in r["message"] for r in rows)
