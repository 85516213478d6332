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


def start_dagster_dev(args) -> int:
    from dice_pipeline.paths import ensure_dagster_home, project_root

    ensure_dagster_home()
    workspace = project_root() / "workspace.yaml"
    command = [sys.executable, "-m", "dagster", "dev", "-h", args.host, "-p", str(args.port)]
    if workspace.is_file():
        command += ["-w", str(workspace)]
    else:
        command += ["-m", "dice_pipeline.definitions"]
    os.execv(sys.executable, command)
    return 0  # not reached
