"""The lint is part of the test run (so CI, which runs the README's test command, runs it): `ruff check` over the
tree with the configuration in pyproject.toml. Skipped, saying so, where ruff is not installed (the `dev` extra
brings it)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="needs ruff: pip install -e '.[dev]' (the README's test command installs it)")
def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_ruff_is_configured_and_installed_by_the_dev_extra():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["ruff"]["lint"]["select"]
    assert any(requirement.startswith("ruff") for requirement in project["project"]["optional-dependencies"]["dev"])
