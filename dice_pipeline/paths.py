"""Where the project's code and persistent state live: the source root (the folder holding the packages, put on a
child process's PYTHONPATH), and the Dagster home, warehouse file, caches and artifacts.

In a source checkout the state lives inside it (git-ignored); an installed copy falls back to ~/.dice_pipeline.
Each default can be overridden by an environment variable (dice_pipeline/settings.py). Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from dice_pipeline import settings


def source_root() -> Path:
    """The folder holding the `dice_pipeline`, `training`, `assets` and `warehouse` packages: the repository root
    in a checkout (site-packages in an installed copy). A child process that imports our code gets it on its path."""
    return Path(__file__).resolve().parents[1]


def project_root() -> Path:
    """The source checkout holding this package (recognised by its workspace.yaml), else ~/.dice_pipeline."""
    checkout = source_root()
    if (checkout / "workspace.yaml").is_file():
        return checkout
    return Path.home() / ".dice_pipeline"


def dagster_home() -> Path:
    return Path(settings.DAGSTER_HOME.get() or project_root() / ".dagster_home")


def warehouse_path() -> Path:
    return Path(settings.WAREHOUSE_PATH.get() or project_root() / "warehouse" / "dice.duckdb")


def cache_dir() -> Path:
    return Path(settings.CACHE_DIR.get() or project_root() / ".cache")


def artifacts_dir() -> Path:
    """Large outputs reported by path (plots, exported datasets, checkpoints)."""
    return Path(settings.ARTIFACTS_DIR.get() or project_root() / "artifacts")


def ensure_dagster_home() -> Path:
    """Point DAGSTER_HOME at the persistent project folder (unless the user chose one) and make sure it holds a
    dagster.yaml, so runs, partitions and lineage survive restarts instead of living in a temporary folder."""
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        template = Path(__file__).with_name("dagster.yaml")
        config.write_text(template.read_text())
    settings.DAGSTER_HOME.set(str(home))
    return home


KERNELBENCH_ENV_VAR = settings.KERNELBENCH_TASKS.name


def kernelbench_tasks_path() -> Path | None:
    """KernelBench's task set (levels 1-3 as JSONL, or a KernelBench checkout's `KernelBench/` folder), used for
    decontamination and evaluation: DICE_KERNELBENCH_TASKS, else the team's shared copy beside the checkout."""
    if settings.KERNELBENCH_TASKS.get():
        return Path(settings.KERNELBENCH_TASKS.get())
    shared = project_root().parent / "shared" / "data" / "kernelbench" / "tasks.jsonl"
    return shared if shared.is_file() else None
