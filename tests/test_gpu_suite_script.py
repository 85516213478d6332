"""benchmarks/gpu_suite.sh: the one command that runs every GPU-only test and benchmark. Here (no GPU) the test
part runs and every GPU test skips, which checks the script's plumbing; the GPU results are in RESULTS.md."""

import os
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
