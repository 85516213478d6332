"""The README's first command (the main job on the embedded default) runs to completion and fills the warehouse."""

import re
from pathlib import Path

import pytest

from dice_pipeline.schemas import CONCUR_PAIRS
from warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.DOTALL)[:2]


def test_readme_opens_with_the_two_commands_ci_runs():
    main_command, test_command = _readme_commands()
    assert main_command.endswith(".venv/bin/dice run")
    assert test_command.endswith(".venv/bin/pytest")
    # .ci/run must run exactly the README's test command.
    assert test_command in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_main_command_runs_on_the_embedded_default(tmp_path, run_dice):
    # Same entry point as the README's `dice run`, in a scratch Dagster home and warehouse.
    result = run_dice("run")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "threshold 2.0: run" in result.stdout and "succeeded" in result.stdout
    wh = Warehouse(tmp_path / "w.duckdb")
    pairs = wh.query("SELECT * FROM ingest.concur_pairs")
    assert pairs.height >= 32 and set(CONCUR_PAIRS.names()) <= set(pairs.columns)
    # Without a GPU nothing is executed, and the verdicts say so; the deliberately bad seeds are rejected.
    statuses = dict(wh.query("SELECT status, count(*) AS n FROM verify.verified_pairs GROUP BY 1").rows())
    assert "correct" not in statuses
    assert statuses.get("deceptive", 0) >= 1
    kept = wh.query("SELECT count(*) AS n FROM filter.speedup_filtered_pairs WHERE threshold_key = '2.0'")["n"][0]
    decisions = wh.query("SELECT count(*) AS n FROM filter.speedup_filter_decisions")["n"][0]
    assert decisions == pairs.height and 0 < kept < pairs.height
