"""`dice synthesize` on a machine without a GPU: every candidate is a row, nothing is kept, the summary counts them,
and stored GPU verdicts are picked up through --verdict-store."""

from __future__ import annotations

import json

from dice_pipeline.cli import main as dice_main
from dice_pipeline.synthesis import TemplateGenerator, structure_catalogue
from dice_pipeline.verify import Status, TimingStats, Verdict, VerifyConfig, VerifyJob
from dice_pipeline.verify.store import VerdictStore


def test_synthesize_writes_every_candidate_and_reuses_stored_verdicts(tmp_path, monkeypatch):
    monkeypatch.setattr("dice_pipeline.verify.api.gpu_inventory", lambda: [])
    tasks = structure_catalogue(["rmsnorm_residual"])
    # A verdict measured elsewhere for the first task's candidate (same sources, same default config).
    first = tasks[0]
    code = TemplateGenerator().generate(first.pytorch_code, 1, seed=0)[0].code
    measured = Verdict(status=Status.CORRECT, speedup=3.1, reference_timing=TimingStats(1.0, 0.1, 1.0, 100, 0.01),
                       candidate_timing=TimingStats(0.3, 0.1, 0.3, 100, 0.01), provenance={"gpu": "NVIDIA H200"})
    store = tmp_path / "store"
    assert VerdictStore(store).put(VerifyJob("x", first.pytorch_code, code), VerifyConfig(), measured)

    out = tmp_path / "out"
    assert dice_main(["synthesize", "--out", str(out), "--family", "rmsnorm_residual",
                      "--verdict-store", str(store), "--cache-dir", str(tmp_path / "builds")]) == 0
    rows = [json.loads(line) for line in (out / "structure_instances.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [t.task_id for t in tasks]
    by_task = {r["task_id"]: r for r in rows}
    assert by_task[first.task_id]["kept"] and by_task[first.task_id]["speedup"] == 3.1
    assert all(r["reject_reason"] == "not_executed" for r in rows if r["task_id"] != first.task_id)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["candidates"] == len(tasks) and summary["kept"] == 1


def test_bad_arguments_are_a_one_line_error(tmp_path, capsys):
    assert dice_main(["synthesize", "--out", str(tmp_path), "--family", "nonsense"]) == 2
    assert "unknown structure families ['nonsense']" in capsys.readouterr().err
    assert dice_main(["synthesize", "--out", str(tmp_path), "--backend", "checkpoint"]) == 2
    assert "needs checkpoint_path" in capsys.readouterr().err
    assert not (tmp_path / "structure_instances.jsonl").exists()
