"""Run any module's command line as a Dagster Pipes external process, unchanged:

    python -m dice_pipeline.pipes_module MODULE [ARGS...]

Started by a Pipes client (see dice_pipeline/pipes.py): the module runs as `python -m MODULE ARGS...` would run it;
its Python `logging` records (INFO and up) go to the asset's log, and whatever it passes to `write_run_metadata`
(a JSON object: metrics, output paths) is reported as the asset's materialization metadata, with the module, its
arguments, host and wall time. Outside a Pipes run `write_run_metadata` does nothing, so the module stays a plain
command-line program. Under `torchrun` only rank 0 opens the Pipes session (one log, one materialization); the other
ranks run the module as a plain command. Standard library + the standalone `dagster-pipes` package (no Dagster):
runs on a GPU image.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from dice_pipeline import settings

# Where `write_run_metadata` puts its JSON object during a Pipes run (set by `main` for the module it runs).
METADATA_PATH_ENV = settings.PIPES_METADATA_PATH.name


def write_run_metadata(metadata: dict[str, Any]) -> bool:
    """Merge `metadata` (JSON-serialisable values) into what this run reports to Dagster. False outside Pipes."""
    path = settings.PIPES_METADATA_PATH.get()
    if not path:
        return False
    target = Path(path)
    current = json.loads(target.read_text()) if target.exists() else {}
    current.update(metadata)
    target.write_text(json.dumps(current, default=str))
    return True


def metadata_entry(value: Any) -> Any:
    """A Pipes metadata entry: plain numbers and strings as they are, anything else as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"raw_value": value, "type": "json"}


class _ForwardToPipes(logging.Handler):
    def __init__(self, pipes_log: logging.Logger):
        super().__init__(level=logging.INFO)
        self._pipes_log = pipes_log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pipes_log.log(record.levelno, self.format(record))
        except Exception:  # noqa: BLE001 - a log line must never fail the run
            self.handleError(record)


def run_module_under_pipes(module: str, args: list[str]) -> None:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        scratch = Path(pipes.extras.get("metadata_path") or Path(os.environ.get("TMPDIR", "/tmp")) /
                       f"dice_pipes_{os.getpid()}_metadata.json")
        scratch.unlink(missing_ok=True)
        settings.PIPES_METADATA_PATH.set(str(scratch))
        handler = _ForwardToPipes(pipes.log)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        pipes.log.info(f"running python -m {module} {' '.join(args)} on {platform.node()}")
        start = time.perf_counter()
        sys.argv = [module, *args]
        exit_code: Any = 0
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            exit_code = exc.code or 0
            if exit_code != 0:
                raise
        finally:
            root.removeHandler(handler)
        reported = json.loads(scratch.read_text()) if scratch.exists() else {}
        scratch.unlink(missing_ok=True)
        metadata = {"pipes/module": module, "pipes/args": {"raw_value": args, "type": "json"},
                    "pipes/host": platform.node(), "pipes/wall_seconds": round(time.perf_counter() - start, 3)}
        metadata.update({key: metadata_entry(value) for key, value in reported.items()})
        pipes.report_asset_materialization(metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun's rank: not rank 0, so not the one talking to Dagster
        sys.argv = list(argv)
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return 0
    run_module_under_pipes(argv[0], list(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
