"""benchmarks/gpu_suite.sh: the one command that runs every GPU-only test and benchmark. Here (no GPU) the test
part runs and every GPU test skips, which checks the script's plumbing; the GPU results are in RESULTS.md."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_suite.sh"


def test_unknown_part_is_an_error(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown part nonsense" in result.stderr


@pytest.mark.slow
def test_tests_part_runs_and_records_each_step(tmp_path):
    # `python3` must be this interpreter (with torch and pytest), as it is on a GPU host.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "tests"], capture_output=True, text=True,
                            timeout=1800, env=env)
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "suite.txt").read_text()
    assert summary.count("exit 0") == 3 and summary.rstrip().endswith("ALL_DONE"), summary
    for name in ("tests_verify", "tests_synthesis", "tests_training"):
        assert (tmp_path / f"{name}.log").exists()


def test_smollm2_decode_part_names_what_it_needs(tmp_path):
    env = {**os.environ, "SMOLLM2_GGUF": str(tmp_path / "missing.gguf")}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "decode-smollm2"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 2 and "SMOLLM2_GGUF" in result.stderr


def test_train_decode_part_names_what_it_needs(tmp_path):
    env = {**os.environ, "SMOLLM2_GGUF": str(tmp_path / "missing.gguf"), "TRAINING_DATA": str(tmp_path / "none")}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "train-decode"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 2 and "SMOLLM2_GGUF, TRAINING_DATA" in result.stderr


@pytest.mark.parametrize("part, until, script", [("throughput-ab)", "train-decode)", "verify_throughput.py"),
                                                  ("train-decode)", "synthetic-pairs)", "train_pipeline_gpu.py"),
                                                  ("synthetic-pairs)", "scaling)", "synthetic_verify_gpu.py")])
def test_the_ab_and_train_decode_parts_pass_flags_their_scripts_know(part, until, script):
    text = SCRIPT.read_text()
    body = text[text.index(part):text.index(until)]
    flags = {word for word in body.split() if re.fullmatch(r"--[a-z0-9][a-z0-9-]*", word)}
    help_text = subprocess.run([sys.executable, str(SCRIPT.parent / script), "--help"],
                               capture_output=True, text=True, check=True).stdout
    known = set(re.findall(r"--[a-z0-9][a-z0-9-]*", help_text))
    assert flags and flags - known == set()
