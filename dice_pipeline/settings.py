"""Every environment variable the project reads, in one place: its name, what it sets, and the one way to read it.
Standard library only: GPU hosts and the verifier's worker processes import it.

Settings override a default (a resource's empty config field means "the setting, else the default"); they are read
when used, not at import, so a command or a test can set them first. Channels carry a value from a parent process
to the child it starts (a file descriptor, a path); the child takes them out of its environment, so the candidate
code it then runs never sees them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvironmentVariable:
    name: str
    meaning: str

    def get(self, default: str = "") -> str:
        """Its value, or `default` where it is unset or empty."""
        return os.environ.get(self.name) or default

    def take(self) -> str | None:
        """Its value, removed from this process's environment (a channel, read once)."""
        return os.environ.pop(self.name, None)

    def set(self, value: str) -> None:
        os.environ[self.name] = value


# --- settings ---------------------------------------------------------------------------------------------------
DAGSTER_HOME = EnvironmentVariable(
    "DAGSTER_HOME", "Dagster's instance folder (runs, partitions, lineage); default .dagster_home in the checkout")
WAREHOUSE_PATH = EnvironmentVariable("DICE_WAREHOUSE_PATH", "the DuckDB warehouse file; default warehouse/dice.duckdb")
CACHE_DIR = EnvironmentVariable("DICE_CACHE_DIR", "the project cache (verdicts, builds, evaluation state); default .cache")
ARTIFACTS_DIR = EnvironmentVariable(
    "DICE_ARTIFACTS_DIR", "large outputs reported by path (checkpoints, datasets, plots); default artifacts")
KERNELBENCH_TASKS = EnvironmentVariable(
    "DICE_KERNELBENCH_TASKS", "KernelBench's tasks (tasks.jsonl or a checkout's KernelBench/ folder); default the "
    "shared copy beside the checkout")
CONCUR_SOURCE = EnvironmentVariable(
    "DICE_CONCUR_SOURCE", "the ConCuR source ingestion reads when none is given; default the embedded seed corpus")
EVAL_CHECKPOINTS = EnvironmentVariable(
    "DICE_EVAL_CHECKPOINTS", "the registry of models to evaluate; default <dagster home>/eval_checkpoints.json")
RL_TASK_FILE = EnvironmentVariable(
    "DICE_RL_TASK_FILE", "an external end-to-end RL task file; default the pool built from the ingested references")
GENERATOR_BASE_URL = EnvironmentVariable("DICE_GENERATOR_BASE_URL", "the OpenAI-compatible endpoint of the generator")
GENERATOR_MODEL = EnvironmentVariable("DICE_GENERATOR_MODEL", "the model the generator endpoint serves")
GENERATOR_API_KEY = EnvironmentVariable(
    "DICE_GENERATOR_API_KEY", "the generator endpoint's key (read from the environment, never stored in config)")
GPU_LOCK_DIR = EnvironmentVariable(
    "DICE_GPU_LOCK_DIR", "the per-host GPU lock folder every run shares; default /tmp/dice_gpu_locks")
VERIFY_CACHE = EnvironmentVariable(
    "DICE_VERIFY_CACHE", "the verifier's build cache (pipeline, dice verify, benchmarks); default <cache>/kernel_builds")

SETTINGS = (DAGSTER_HOME, WAREHOUSE_PATH, CACHE_DIR, ARTIFACTS_DIR, KERNELBENCH_TASKS, CONCUR_SOURCE, EVAL_CHECKPOINTS,
            RL_TASK_FILE, GENERATOR_BASE_URL, GENERATOR_MODEL, GENERATOR_API_KEY, GPU_LOCK_DIR, VERIFY_CACHE)

# --- channels from a parent process to its child ----------------------------------------------------------------
RUN_LIMIT_FD = EnvironmentVariable(
    "DICE_RUN_LIMIT_FD", "verifier sandbox -> worker: the pipe the worker writes its measured run limit to")
GPU_SHARE_FDS = EnvironmentVariable(
    "DICE_GPU_SHARE_FDS", "verifier -> worker: the pipes of the gate that gives a timed section the GPU alone")
PIPES_METADATA_PATH = EnvironmentVariable(
    "DICE_PIPES_METADATA_PATH", "Dagster Pipes step -> external process: where it writes metadata to report back")
RAY_ATTEMPT_LOG = EnvironmentVariable(
    "DICE_RAY_ATTEMPT_LOG", "Ray backend tests -> Ray tasks: a folder each judgement attempt is logged to")

CHANNELS = (RUN_LIMIT_FD, GPU_SHARE_FDS, PIPES_METADATA_PATH, RAY_ATTEMPT_LOG)
