"""Default locations of the project's persistent state (Dagster home, warehouse file, build caches).

In a source checkout everything lives inside it (git-ignored); an installed copy falls back to ~/.dice_pipeline.
Each default can be overridden by an environment variable.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The source checkout holding this package (recognised by its workspace.yaml), else ~/.dice_pipeline."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "workspace.yaml").is_file():
        return checkout
    return Path.home() / ".dice_pipeline"


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or project_root() / ".dagster_home")


def warehouse_path() -> Path:
    default = project_root() / "warehouse" / "dice.duckdb"
    return Path(os.environ.get("DICE_WAREHOUSE_PATH") or default)


def cache_dir() -> Path:
    return Path(os.environ.get("DICE_CACHE_DIR") or project_root() / ".cache")


def artifacts_dir() -> Path:
    """Large outputs reported by path (plots, exported datasets, checkpoints)."""
    return Path(os.environ.get("DICE_ARTIFACTS_DIR") or project_root() / "artifacts")


def ensure_dagster_home() -> Path:
    """Point DAGSTER_HOME at the persistent project folder (unless the user chose one) and make sure it holds a
    dagster.yaml, so runs, partitions and lineage survive restarts instead of living in a temporary folder."""
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        template = Path(__file__).with_name("dagster.yaml")
        config.write_text(template.read_text())
    os.environ["DAGSTER_HOME"] = str(home)
    return home


KERNELBENCH_ENV_VAR = "DICE_KERNELBENCH_TASKS"


def kernelbench_tasks_path() -> Path | None:
    """KernelBench's task set (levels 1-3 as JSONL, or a KernelBench checkout's `KernelBench/` folder), used for
    decontamination and evaluation: DICE_KERNELBENCH_TASKS, else the team's shared copy beside the checkout."""
    if os.environ.get(KERNELBENCH_ENV_VAR):
        return Path(os.environ[KERNELBENCH_ENV_VAR])
    shared = project_root().parent / "shared" / "data" / "kernelbench" / "tasks.jsonl"
    return shared if shared.is_file() else None
