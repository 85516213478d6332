"""`dice dev`: start the Dagster UI on this project with its persistent instance (DAGSTER_HOME)."""

from __future__ import annotations

import os
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("dev", help="start `dagster dev` on this project (persistent DAGSTER_HOME)",
                                   description=__doc__)
    parser.add_argument("--port", default="3000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.set_defaults(func=start_dagster_dev)


def ensure_paper_threshold_partition(instance) -> str:
    """Make the paper's threshold (2.0) a partition of the filter, so "Materialize all" in a fresh home has one to
    run; other thresholds are added from the UI's launch dialog ("Add a partition")."""
    from dice_pipeline import definitions
    from dice_pipeline.thresholds import PAPER_THRESHOLD, SpeedupThreshold

    key = SpeedupThreshold.parse(PAPER_THRESHOLD).key
    name = definitions.keys.THRESHOLD_PARTITIONS.name
    if key not in instance.get_dynamic_partitions(name):
        instance.add_dynamic_partitions(name, [key])
    return key


def start_dagster_dev(args) -> int:
    from dice_pipeline.paths import ensure_dagster_home, project_root

    ensure_dagster_home()
    import dagster as dg

    from dice_pipeline.commands.instance import tidy_instance

    instance = dg.DagsterInstance.get()
    for line in tidy_instance(instance):  # runs killed since the last start, partitions with a bad key
        print(f"dice dev: {line}", flush=True)
    ensure_paper_threshold_partition(instance)
    workspace = project_root() / "workspace.yaml"
    command = [sys.executable, "-m", "dagster", "dev", "-h", args.host, "-p", str(args.port)]
    if workspace.is_file():
        command += ["-w", str(workspace)]
    else:
        command += ["-m", "dice_pipeline.definitions"]
    os.execv(sys.executable, command)
    return 0  # not reached
