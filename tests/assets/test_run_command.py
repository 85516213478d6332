"""`dice run` tells the truth: a short summary with the numbers, a non-zero exit when a check failed, nothing was
accepted or an overwrite was refused, one line (and no run) for a source that cannot be read or a bad argument,
Dagster's event stream only with --verbose, and a run killed mid-ingestion leaves the previous tables as they were
and is ended (canceled) by the next `dice run`."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.assets.conftest import scratch_env
from warehouse import Warehouse

# A one-task stand-in for KernelBench (CuKe decontaminates against it), so the tests need no shared data.
KERNELBENCH_TASK = {
    "level": 1, "problem_id": 1, "name": "1_Square_matrix_multiplication_",
    "code": "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, A, B):\n"
            "        return torch.matmul(A, B)\n\ndef get_inputs():\n"
            "    return [torch.randn(64, 64), torch.randn(64, 64)]\n\ndef get_init_inputs():\n    return []\n",
}
GARBAGE = '{"uuid": "a", "pytorch_code": \n{"uuid": "b", "generated_code": "x"}\n'


@pytest.fixture
def dice(tmp_path, run_dice):
    tasks = tmp_path / "kernelbench.jsonl"
    tasks.write_text(json.dumps(KERNELBENCH_TASK) + "\n")

    def run(*args):
        return run_dice("run", *args, DICE_KERNELBENCH_TASKS=str(tasks))

    return run


def _write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(rows if isinstance(rows, str) else "\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _source_a(tmp_path, pair_factory):
    bad = pair_factory(9)
    bad["generated_code"] = "import torch\n"  # no ModelNew: rejected at ingestion
    return _write(tmp_path, "a.jsonl", [pair_factory(i, speedup=s) for i, s in enumerate([1.0, 1.6, 2.4])] + [bad])


def _tables(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    return (wh.query("SELECT uuid FROM ingest.concur_pairs ORDER BY uuid")["uuid"].to_list(),
            wh.query("SELECT threshold_key, uuid FROM filter.speedup_filtered_pairs ORDER BY ALL").rows())


def test_source_errors_are_one_line_naming_the_path(tmp_path, dice):
    missing = dice("--source", "missing.parquet")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.splitlines() == ["dice run: source error: parquet source missing.parquet does not exist"]
    unknown = dice("--source", "pairs.xlsx")
    assert unknown.returncode == 2 and unknown.stdout == ""
    (line,) = unknown.stderr.splitlines()
    assert "cannot tell what kind of source 'pairs.xlsx' is" in line
    assert not (tmp_path / "w.duckdb").exists()  # nothing ran


@pytest.mark.parametrize("name, content, named", [
    ("pairs.parquet", b"not parquet at all\n", "is not a readable Parquet file ("),
    ("pairs.parquet", b"PAR1" + bytes(range(200)) + b"PAR1", "is not a readable Parquet file ("),  # truncated
    ("pairs.arrow", b"\x00" * 64, "is not an Arrow IPC stream or file"),
])
def test_a_source_that_exists_but_cannot_be_read_fails_before_any_run(tmp_path, dice, name, content, named):
    (tmp_path / name).write_bytes(content)
    result = dice("--source", name)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("dice run: source error: ") and named in line, line
    # Like a missing file: no Dagster run was launched, so the UI shows no failed run or partition.
    assert not (tmp_path / "dagster_home").exists() and not (tmp_path / "w.duckdb").exists()


@pytest.mark.parametrize("threshold, named", [("-1", "must be a positive finite number"), ("0", "positive"),
                                              ("abc", "is not a number"), ("nan", "positive")])
def test_a_bad_threshold_is_one_line_and_exit_2(tmp_path, dice, threshold, named):
    result = dice("--threshold", threshold)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("dice run: --threshold: ") and named in line and "Traceback" not in line
    assert not (tmp_path / "dagster_home").exists()


def test_a_missing_verdict_store_is_one_line_and_exit_2(tmp_path, dice):
    result = dice("--verdict-store", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"dice run: --verdict-store {tmp_path / 'nowhere'}: no such directory"]


@pytest.mark.slow
def test_summary_numbers_and_exit_codes(tmp_path, dice, pair_factory):
    source = _source_a(tmp_path, pair_factory)
    ok = dice("--source", source, "--threshold", "2.0", "--threshold", "1.5")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert f"source: jsonl:{source}" in lines[1]
    assert "ingest: 4 rows read, 3 accepted, 1 rejected (no_model_new 1)" in lines
    assert "threshold 2.0: 1 of 3 pairs kept, 1 CuKe samples (concur 1)" in lines
    assert "threshold 1.5: 2 of 3 pairs kept, 2 CuKe samples (concur 2)" in lines
    synthetic = next(line for line in lines if line.startswith("synthetic operator pairs: "))
    assert "(the training split) have a GPU verdict" in synthetic
    assert "checks failed: none" in lines
    # Quiet by default: no Dagster event stream, no warnings from our code.
    assert len(lines) < 15 and ok.stderr == "", ok.stderr[-3000:]
    assert _tables(tmp_path) == (["pair-0", "pair-1", "pair-2"], [("1.5", "pair-1"), ("1.5", "pair-2"),
                                                                   ("2.0", "pair-2")])
    before = _tables(tmp_path)

    # A source whose every row is rejected: refused, nothing replaced, exit 1.
    garbage = _write(tmp_path, "garbage.jsonl", GARBAGE)
    refused = dice("--source", garbage)
    assert refused.returncode == 1
    assert "ingest: 2 rows read, 0 accepted, 2 rejected (missing_required_column 1, unparseable_row 1)" in \
        refused.stdout
    assert "refused: concur_ingestion: source jsonl:" in refused.stdout and "--allow-empty" in refused.stdout
    assert _tables(tmp_path) == before

    # Forced: the empty ingestion is written, its blocking check fails, nothing downstream runs or is replaced.
    forced = dice("--source", garbage, "--force")
    assert forced.returncode == 1
    assert "  concur_pairs non_empty (blocking): no pair of jsonl:" in forced.stdout
    not_run = next(line for line in forced.stdout.splitlines() if line.startswith("not run"))
    assert "verified_pairs" in not_run and "speedup_filtering" in not_run and "cuke_samples" in not_run
    assert _tables(tmp_path) == ([], before[1])

    # A threshold that keeps nothing: written (it is a result), but its non_empty check warns and the exit says so.
    high = dice("--source", source, "--threshold", "99", "--allow-source-change")
    assert high.returncode == 1
    assert "threshold 99.0: 0 of 3 pairs kept" in high.stdout
    assert "speedup_filtered_pairs[99.0] non_empty (warn)" in high.stdout


@pytest.mark.slow
def test_source_switch_is_refused_then_forced_and_verbose_shows_the_events(tmp_path, dice, pair_factory):
    assert dice("--source", _source_a(tmp_path, pair_factory)).returncode == 0
    before = _tables(tmp_path)
    other = _write(tmp_path, "b.jsonl", [pair_factory(7, speedup=3.0)])
    refused = dice("--source", other)
    assert refused.returncode == 1
    assert f"refused: concur_ingestion: the warehouse holds pairs ingested from jsonl:{tmp_path}/a.jsonl, not " \
           f"jsonl:{other}" in refused.stdout
    assert _tables(tmp_path) == before
    forced = dice("--source", other, "--allow-source-change", "--verbose")
    assert forced.returncode == 0, forced.stdout[-3000:]
    assert _tables(tmp_path) == (["pair-7"], [("2.0", "pair-7")])
    assert "STEP_SUCCESS" in forced.stderr and "ASSET_CHECK_EVALUATION" in forced.stderr  # the event stream


@pytest.mark.slow
def test_a_run_killed_mid_ingestion_leaves_the_previous_tables(tmp_path, dice, pair_factory):
    assert dice("--source", _source_a(tmp_path, pair_factory)).returncode == 0
    before = _tables(tmp_path)
    # Large enough that reading and validating it takes seconds (about 4000 rows a second here).
    big = _write(tmp_path, "big.jsonl", [pair_factory(i) for i in range(30000)])
    env = scratch_env(tmp_path)
    command = [sys.executable, "-m", "dice_pipeline.cli", "run", "--source", big, "--allow-source-change", "--verbose"]
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                           text=True)
    try:
        for line in run.stderr:
            if "ingesting ConCuR pairs from" in line:
                break
        assert run.poll() is None, "the run ended before it could be killed mid-ingestion"
        os.kill(run.pid, signal.SIGKILL)
        assert run.wait(timeout=60) == -signal.SIGKILL
    finally:
        if run.poll() is None:
            run.kill()
    assert _tables(tmp_path) == before
    assert Warehouse(tmp_path / "w.duckdb").provenance("concur_pairs").source_name == f"jsonl:{tmp_path}/a.jsonl"

    # The killed run could not report its end; the next `dice run` sees its process is gone and ends it (canceled:
    # its partitions keep their last materialization), so the UI does not show it "Started" forever.
    killed = _run_statuses(tmp_path)
    assert list(killed.values()).count("STARTED") == 1, killed
    (killed_id,) = [run_id for run_id, status in killed.items() if status == "STARTED"]
    again = dice("--source", _source_a(tmp_path, pair_factory), "--allow-source-change")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (f"dice run: run {killed_id} ended as canceled: the process running it (pid {run.pid}) is gone"
            in again.stdout)
    assert _run_statuses(tmp_path)[killed_id] == "CANCELED"
    assert "STARTED" not in _run_statuses(tmp_path).values()


def _run_statuses(tmp_path) -> dict[str, str]:
    """Run id -> status in the scratch Dagster home, read in a child process (DAGSTER_HOME is per process)."""
    code = ("import dagster as dg, json; i = dg.DagsterInstance.get(); "
            "print(json.dumps({r.run_id: r.status.value for r in i.get_runs()}))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.slow
def test_ctrl_c_mid_run_is_one_line_exit_130_and_the_next_run_finishes(tmp_path, dice, ctrl_c):
    """Ctrl-C while the run's steps work (DuckDB queries included, which used to turn it into an ordinary step
    failure, exit 1, or drop it and go on) stops the run with one line and exit 130."""
    env = scratch_env(tmp_path, DICE_KERNELBENCH_TASKS=str(tmp_path / "kernelbench.jsonl"))  # written by `dice`
    runs = tmp_path / "dagster_home" / "history" / "runs"
    first_seen = []

    def two_seconds_into_the_run() -> bool:
        if not first_seen and any(p.name != "index.db" for p in runs.glob("*.db")):
            first_seen.append(time.monotonic())
        return bool(first_seen) and time.monotonic() - first_seen[0] > 2

    returncode, out, err = ctrl_c(["run"], env, tmp_path, two_seconds_into_the_run)
    assert returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = err.splitlines()
    assert line.startswith("dice run: interrupted at threshold 2.0;") and line.endswith("run again to finish")
    again = dice()
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
