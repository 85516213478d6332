"""The generic Pipes launcher: a module run as an external process through `dg.PipesSubprocessClient` reports its
logs and metadata to the asset that launched it, and a failing module fails the asset."""

import json
import textwrap

import dagster as dg
import pytest

from dice_pipeline.pipes import run_module_through_pipes
from dice_pipeline.pipes_module import write_run_metadata

TOY_TRAINER = textwrap.dedent('''
    """A stand-in training stage: plain command line, stdlib logging, metrics through write_run_metadata."""
    import argparse
    import logging
    import sys

    from dice_pipeline.pipes_module import write_run_metadata

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int)
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    log = logging.getLogger("toy_trainer")
    losses = [round(1.0 / (step + 1), 3) for step in range(args.steps)]
    for step, loss in enumerate(losses):
        log.info("step %d loss %.3f", step, loss)
    if args.fail:
        log.error("diverged at step %d", args.steps)
        sys.exit(3)
    write_run_metadata({"final_loss": losses[-1], "steps": args.steps, "loss_curve": losses})
''')


@pytest.fixture
def toy_module(tmp_path):
    (tmp_path / "toy_trainer.py").write_text(TOY_TRAINER)
    return {"PYTHONPATH": str(tmp_path)}


def _materialize(env, args):
    @dg.asset
    def toy_model(context: dg.AssetExecutionContext):
        return run_module_through_pipes(context, "toy_trainer", args, env=env).get_materialize_result()

    instance = dg.DagsterInstance.ephemeral()
    return instance, dg.materialize([toy_model], instance=instance, raise_on_error=False)


def _log_messages(instance, result) -> list[str]:
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def test_a_module_run_through_pipes_reports_logs_and_metadata_to_its_asset(toy_module):
    instance, result = _materialize(toy_module, ["--steps", "3"])
    assert result.success
    [materialization] = result.asset_materializations_for_node("toy_model")
    metadata = materialization.metadata
    assert metadata["final_loss"].value == pytest.approx(1 / 3, abs=1e-3)
    assert metadata["steps"].value == 3
    assert metadata["loss_curve"].value == [1.0, 0.5, 0.333]
    assert metadata["pipes/module"].value == "toy_trainer"
    assert metadata["pipes/args"].value == ["--steps", "3"]
    assert metadata["pipes/wall_seconds"].value > 0
    messages = _log_messages(instance, result)
    assert any("toy_trainer: step 2 loss 0.333" in m for m in messages)
    assert any("running python -m toy_trainer --steps 3" in m for m in messages)


def test_a_failing_module_fails_its_asset_and_still_reports_its_logs(toy_module):
    instance, result = _materialize(toy_module, ["--steps", "2", "--fail"])
    assert not result.success
    assert result.asset_materializations_for_node("toy_model") == []
    assert any("diverged at step 2" in m for m in _log_messages(instance, result))


def test_write_run_metadata_is_a_no_op_outside_pipes(monkeypatch, tmp_path):
    monkeypatch.delenv("DICE_PIPES_METADATA_PATH", raising=False)
    assert write_run_metadata({"x": 1}) is False
    target = tmp_path / "m.json"
    monkeypatch.setenv("DICE_PIPES_METADATA_PATH", str(target))
    assert write_run_metadata({"x": 1}) and write_run_metadata({"y": [2]})
    assert json.loads(target.read_text()) == {"x": 1, "y": [2]}
