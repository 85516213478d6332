"""Fixtures for the asset tests."""

import os
import signal
import subprocess
import sys
import time

import pytest


def scratch_env(tmp_path, **overrides: str) -> dict:
    """The environment of a `dice` command in a scratch Dagster home, warehouse (tmp_path / "w.duckdb") and artifacts
    dir, on the embedded source unless `overrides` say otherwise."""
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DICE_WAREHOUSE_PATH": str(tmp_path / "w.duckdb"),
        "DICE_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        **overrides,
    }
    if "DICE_CONCUR_SOURCE" not in overrides:
        env.pop("DICE_CONCUR_SOURCE", None)
    return env


@pytest.fixture
def run_dice(tmp_path):
    """Run the `dice` CLI in a scratch environment (scratch_env); returns the completed process."""

    def run(*args: str, **env_overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dice_pipeline.cli", *args], cwd=tmp_path,
                              env=scratch_env(tmp_path, **env_overrides), capture_output=True, text=True, timeout=3000)

    return run


@pytest.fixture
def ctrl_c():
    """Run `dice ARGS` as a terminal would and press Ctrl-C (SIGINT to its whole process group) once `ready()` is
    true; returns (exit code, stdout, stderr). Fails if the command ends first or `ready` takes over `wait_s`."""

    def press(args: list[str], env: dict, cwd, ready, wait_s: float = 300) -> tuple[int, str, str]:
        process = subprocess.Popen([sys.executable, "-m", "dice_pipeline.cli", *args], cwd=cwd, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + wait_s
            while not ready():
                assert process.poll() is None and time.monotonic() < deadline, process.communicate()
                time.sleep(0.2)
            os.killpg(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        return process.returncode, out, err

    return press


@pytest.fixture
def cpu_resources():
    """Builds the project's resources over a scratch warehouse (see _cpu_resources)."""
    return _cpu_resources


def _cpu_resources(warehouse_file: str, **extra) -> dict:
    """The project's resources over a scratch warehouse, with the verifier on static checks only (no GPU in CI, and
    compiling is covered by the verifier's own tests); `extra` adds or replaces resources."""
    from dice_pipeline.resources import (GpuPool, KernelGeneratorResource, KernelVerifier, WarehouseIOManager,
                                         WarehouseResource)

    return {
        "io_manager": WarehouseIOManager(path=warehouse_file),
        "warehouse": WarehouseResource(path=warehouse_file),
        "verifier": KernelVerifier(execute="never"),
        "generator": KernelGeneratorResource(),
        "gpu_pool": GpuPool(),  # no GPU here: the training stages' leases hold none and their ranks run on the CPU
        **extra,
    }
