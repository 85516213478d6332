"""The generic Pipes launcher: a module run as an external process through `dg.PipesSubprocessClient` reports its
logs and metadata to the asset that launched it, a failing module fails the asset, and under torchrun every rank
runs while rank 0 alone reports."""

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
    import os
    import sys
    from pathlib import Path

    from dice_pipeline.pipes_module import write_run_metadata

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--mark", help="a folder where each process leaves a file named for its rank")
    args = parser.parse_args()
    if args.mark:
        Path(args.mark, f"rank{os.environ.get('RANK', '-')}").write_text("ran")
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


def _materialize(env, args, **launch):
    @dg.asset
    def toy_model(context: dg.AssetExecutionContext):
        return run_module_through_pipes(context, "toy_trainer", args, env=env, **launch).get_materialize_result()

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


def test_under_torchrun_every_rank_runs_and_rank_zero_alone_reports(toy_module, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    instance, result = _materialize(toy_module, ["--steps", "2", "--mark", str(marks)], nproc_per_node=2,
                                    log_dir=tmp_path / "logs")
    assert result.success
    assert sorted(p.name for p in marks.iterdir()) == ["rank0", "rank1"]
    [materialization] = result.asset_materializations_for_node("toy_model")
    assert materialization.metadata["final_loss"].value == 0.5  # rank 0's write_run_metadata
    # One Pipes session: rank 0's log lines once, rank 1 ran as a plain command.
    assert sum("toy_trainer: step 1 loss 0.500" in m for m in _log_messages(instance, result)) == 1
    assert len(list((tmp_path / "logs").glob("*/attempt_0/1/stderr.log"))) == 1  # every rank's output kept


def test_torchrun_gets_a_free_port_and_refuses_no_processes():
    from dice_pipeline.pipes import torchrun_prefix

    command = torchrun_prefix(4, python="python3")
    assert command == ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    with pytest.raises(ValueError, match="nproc_per_node"):
        torchrun_prefix(0)
