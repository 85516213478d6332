"""Makes the shared candidate catalogue (verify_cases.py) importable by the verifier tests; shared fixtures."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def refuse_nested_phases():
    """A function that makes a CandidateJudge's `phase` fail on a phase opened inside another: phase seconds add
    up to the judgement's time only if no span is counted twice."""
    import contextlib

    def refuse(judge):
        plain, open_phases = judge.phase, []

        @contextlib.contextmanager
        def phase(name):
            assert not open_phases, f"phase {name!r} opened inside {open_phases[-1]!r}"
            open_phases.append(name)
            try:
                with plain(name):
                    yield
            finally:
                open_phases.pop()

        judge.phase = phase
        return judge

    return refuse
