"""The Dagster instance the commands execute runs in (`dice run`, `dice eval`, `dice dev`), and what they share
about it: the quiet logging, the housekeeping before a start, and telling a Ctrl-C from a failure."""

from __future__ import annotations

import logging
import sys

# The exceptions a Ctrl-C becomes in a command's process (Dagster turns it into its own inside a step).
INTERRUPTIONS = ("KeyboardInterrupt", "DagsterExecutionInterruptedError")


class DropInterruptedCloses(logging.Filter):
    """Drops a log record whose exception is the user's Ctrl-C: Dagster raises its interrupt wherever the process
    is, and when that is inside SQLAlchemy closing an instance-storage connection, SQLAlchemy's pool logs "Exception
    closing connection" with the whole traceback before the command can say its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or type(error).__name__ not in INTERRUPTIONS


class _StderrHandler(logging.StreamHandler):
    """stderr as it is when a record is written (not when the handler was made)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def quiet_interrupted_connection_closes() -> None:
    """SQLAlchemy's pool loggers (`sqlalchemy.pool.*`) write through one handler that leaves out Ctrl-C's
    tracebacks; every other record of theirs is still written to stderr."""
    pool = logging.getLogger("sqlalchemy.pool")
    if any(isinstance(f, DropInterruptedCloses) for handler in pool.handlers for f in handler.filters):
        return
    handler = _StderrHandler()
    handler.addFilter(DropInterruptedCloses())
    pool.addHandler(handler)
    pool.propagate = False


def command_line_instance():
    """The project's Dagster instance (DAGSTER_HOME: the runs, partitions and lineage the UI shows), for runs
    executed in this process. Their stdout and stderr go to the terminal, not into captured log files: capturing
    them runs helper processes in the terminal's process group, which Ctrl-C would make print tracebacks; nor does
    SQLAlchemy print one when Ctrl-C lands while it closes a connection."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from dice_pipeline.paths import ensure_dagster_home

    quiet_interrupted_connection_closes()
    home = ensure_dagster_home()
    no_capture = {"module": "dagster._core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager",
                  "config": {}}
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home), overrides={"compute_logs": no_capture}))


def quiet_run_config() -> dict:
    """The console logger prints every Dagster event at DEBUG; the commands print what matters (--verbose keeps it)."""
    return {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def tidy_instance(instance) -> list[str]:
    """What the commands put right in the Dagster instance before they start: runs whose process was killed are
    ended (canceled), and threshold partitions added in the UI with a non-canonical or invalid key are replaced or
    deleted (the sensors of the code location do the same while the UI runs). One line per change."""
    from dice_pipeline import definitions
    from dice_pipeline.run_health import end_orphaned_runs
    from dice_pipeline.threshold_partitions import canonicalise_threshold_partitions

    return (end_orphaned_runs(instance)
            + canonicalise_threshold_partitions(instance, definitions.keys.THRESHOLD_PARTITIONS.name))


def interrupted(result, instance) -> bool:
    """Whether a run executed in this process stopped because the user pressed Ctrl-C (Dagster turns the
    KeyboardInterrupt into an interrupted step and a failed run). Such a run is marked canceled: the user stopped
    it, and the partitions it had planned keep their last materialization instead of showing as failed."""
    stopped = any(event.step_failure_data.error is not None
                  and event.step_failure_data.error.cls_name in INTERRUPTIONS
                  for event in result.get_step_failure_events())
    if stopped:
        instance.report_run_canceled(result.dagster_run, message="interrupted with Ctrl-C")
    return stopped
