"""Fixtures for the asset tests."""

import os
import subprocess
import sys

import pytest


@pytest.fixture
def run_dice(tmp_path):
    """Run the `dice` CLI in a scratch Dagster home, warehouse and artifacts dir (the embedded source unless told
    otherwise); returns the completed process. The warehouse is at tmp_path / "w.duckdb"."""

    def run(*args: str, **env_overrides: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(tmp_path / "dagster_home"),
            "DICE_WAREHOUSE_PATH": str(tmp_path / "w.duckdb"),
            "DICE_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
            **env_overrides,
        }
        env.pop("DICE_CONCUR_SOURCE", None)
        return subprocess.run([sys.executable, "-m", "dice_pipeline.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=3000)

    return run
