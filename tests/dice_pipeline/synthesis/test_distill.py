"""Distillation (ConCuR's recipe): reference tasks from a task file, a JSONL or a folder; candidates from an
OpenAI-compatible endpoint (a real HTTP server on loopback); verified; the correct ones written as ConCuR-format
rows that ingestion accepts as a source, generator and verdict kept on every row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dice_pipeline.concur import ConcurSource, ingest
from dice_pipeline.synthesis.distill import (
    TaskSourceError,
    concur_rows,
    distill,
    load_reference_tasks,
    write_jsonl,
    yield_summary,
)
from dice_pipeline.synthesis.operators import build_instance
from dice_pipeline.verify import Status, Verdict
from dice_pipeline.verify.verdict import Reason

from .test_openai_compatible import FakeEndpoint, make_generator

RL_POOL = Path(__file__).resolve().parents[4] / "shared" / "data" / "dice_rl" / "end_to_end_tasks.json"


def _answer(code: str, seed: int) -> bytes:
    content = f"The kernel fuses the chain.\n```python\n{code}```\n"
    return json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 100, "completion_tokens": 50}}).encode()


@pytest.fixture
def tasks_jsonl(tmp_path):
    instances = [build_instance("activation", 0, i) for i in range(3)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "pytorch_code": inst.reference_code}) + "\n"
                            for i, inst in enumerate(instances)))
    return path, instances


def test_reference_tasks_load_from_a_jsonl_a_folder_and_a_task_file(tmp_path, tasks_jsonl):
    path, instances = tasks_jsonl
    assert [t.task_id for t in load_reference_tasks(path)] == ["t0", "t1", "t2"]
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, inst in enumerate(instances):
        (folder / f"task_{i}.py").write_text(inst.reference_code)
    assert [t.task_id for t in load_reference_tasks(folder, limit=2)] == ["task_0", "task_1"]
    task_file = tmp_path / "pool.json"
    task_file.write_text(json.dumps([{"idx": 7, "level": 1, "pytorch_code": instances[0].reference_code}]))
    [task] = load_reference_tasks(task_file)
    assert task.task_id == "7" and task.source == str(task_file)


@pytest.mark.skipif(not RL_POOL.exists(), reason=f"DICE's RL pool is not at {RL_POOL}")
def test_the_rl_pool_s_references_load():
    tasks = load_reference_tasks(RL_POOL, limit=40)
    assert len(tasks) == 40 and all("class Model" in t.pytorch_code for t in tasks)


@pytest.mark.parametrize("content, message", [
    (None, "do not exist"),
    ("not json", "not JSON"),
    ('{"idx": 1}', "expected a JSON list"),
    ('[{"idx": 1, "pytorch_code": "x = 1"}]', "not a KernelBench-format reference"),
])
def test_bad_task_sources_fail_with_one_clear_line(tmp_path, content, message):
    path = tmp_path / "tasks.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TaskSourceError, match=message):
        load_reference_tasks(path)


def test_distillation_from_an_endpoint_writes_concur_rows_that_ingestion_takes(tmp_path, tasks_jsonl):
    path, instances = tasks_jsonl
    tasks = load_reference_tasks(path)
    with FakeEndpoint() as endpoint:
        # Task t0's two samples answer with its real kernel file, the others with a file that has no ModelNew.
        endpoint.script = [("raw", _answer(instances[0].candidate_code, 0)), ("raw", _answer(instances[0].candidate_code, 1))]
        endpoint.script += [("raw", _answer("print('no kernel here')\n", s)) for s in range(4)]
        generator = make_generator(endpoint, max_concurrency=1, temperature=0.8)
        judged: list[str] = []

        def verifier(jobs):
            judged.extend(job_id for job_id, _, _ in jobs)
            return [Verdict(status=Status.CORRECT, speedup=2.5, speedup_gpu=2.5, speedup_convention="gpu",
                            trials_run=5, trials_passed=5, provenance={"gpu": "NVIDIA H100 80GB HBM3"})
                    if "ModelNew" in candidate else
                    Verdict(status=Status.DECEPTIVE, reasons=[Reason("no_cuda_extension", "no kernel", "static")])
                    for _, _, candidate in jobs]

        rows = distill(tasks, generator, verifier, 2, seed=5)
    assert len(rows) == 6
    first = [r for r in rows if r["task_id"] == "t0"]
    assert first[0]["status"] == "correct" and first[1]["reject_reason"] == "duplicate_candidate"
    assert len(judged) == 3  # the duplicate is judged once
    settings = json.loads(first[0]["generator_settings_json"])
    assert first[0]["generator_backend"] == "openai_compatible" and first[0]["generator_model"] == "tiny-coder"
    assert settings.get("temperature") == 0.8
    written = concur_rows(rows, tasks)
    assert [r["problem_name"] for r in written] == ["t0"]
    assert written[0]["speedup_over_eager"] == 2.5 and written[0]["verification_status"] == "correct"
    summary = yield_summary(rows)
    assert summary["tasks"] == 3 and summary["correct"] == 1 and summary["yield"] == round(1 / 6, 4)
    out = write_jsonl(written, tmp_path / "distilled.jsonl")
    pairs, rejects, _ = ingest(ConcurSource.parse(str(out)))
    assert pairs.height == 1 and rejects.height == 0
    extra = json.loads(pairs["extra_json"][0])
    assert extra["generator_model"] == "tiny-coder" and extra["verification_status"] == "correct"
    assert json.loads(extra["verdict_json"])["status"] == "correct"
