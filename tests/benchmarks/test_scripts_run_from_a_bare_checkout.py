"""Every benchmark script runs where the project is not installed: the GPU image runs a copy of the checkout with
torch but without `pip install -e .`. Each script is started with site processing off (no .pth files, so no editable
install) and only the site-packages folder on the path, from a directory outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_the_bare_interpreter_cannot_see_the_project(tmp_path):
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    done = subprocess.run([sys.executable, "-S", "-c", "import training"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No module named 'training'" in done.stderr  # else the test below proves nothing


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_the_script_imports_and_parses_its_arguments_without_an_install(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    done = subprocess.run([sys.executable, "-S", str(script), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
