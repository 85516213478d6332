"""The commands' Dagster instance: a Ctrl-C that lands while SQLAlchemy closes a storage connection prints no
traceback (the command's own one line says what was kept); SQLAlchemy's other pool errors still reach stderr."""

import logging
import sys

import pytest
from dagster._core.errors import DagsterExecutionInterruptedError

from dice_pipeline.commands.instance import quiet_interrupted_connection_closes


@pytest.fixture
def pool_logging():
    pool = logging.getLogger("sqlalchemy.pool")
    handlers, propagate = list(pool.handlers), pool.propagate
    yield logging.getLogger("sqlalchemy.pool.impl.NullPool")  # the logger SQLAlchemy's NullPool writes to
    pool.handlers[:], pool.propagate = handlers, propagate


def _log_error_during(logger, error: BaseException) -> None:
    try:
        raise error
    except BaseException:
        logger.error("Exception closing connection %r", "<sqlite3.Connection>", exc_info=True)


@pytest.mark.parametrize("interruption", [DagsterExecutionInterruptedError(), KeyboardInterrupt()])
def test_a_ctrl_c_inside_a_connection_close_prints_nothing(pool_logging, capsys, interruption):
    quiet_interrupted_connection_closes()
    quiet_interrupted_connection_closes()  # idempotent: one handler, not two
    assert len(logging.getLogger("sqlalchemy.pool").handlers) == 1
    _log_error_during(pool_logging, interruption)
    assert capsys.readouterr().err == ""


def test_other_pool_errors_still_reach_stderr(pool_logging, capsys):
    quiet_interrupted_connection_closes()
    _log_error_during(pool_logging, OSError("disk I/O error"))
    err = capsys.readouterr().err
    assert "Exception closing connection" in err and "disk I/O error" in err and "Traceback" in err


def test_without_it_the_traceback_is_printed(pool_logging, capsys):
    """The control: what a user saw before (Python's last-resort handler writes the record and its traceback)."""
    logging.getLogger("sqlalchemy.pool").handlers[:] = []
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("sqlalchemy.pool").addHandler(handler)
    _log_error_during(pool_logging, DagsterExecutionInterruptedError())
    assert "DagsterExecutionInterruptedError" in capsys.readouterr().err
