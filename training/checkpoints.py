"""The one checkpoint format of every training stage (conversion, SFT, both RL stages): `out_dir/step-N/` holds the
model (`save_pretrained`, whole weights even when training shards them), its tokenizer, the optimizer, the random
states (`rng.pt`), what the stage needs to resume (`trainer_state.json`) and its metrics up to that step
(`metrics.jsonl`); `out_dir/latest` names the newest. A step directory is a `from_pretrained` directory, so every
stage and evaluator loads it as a base.

The optimizer is `optimizer.pt` when one process holds it whole (one process, DDP), and `distributed/` when it is
sharded (FSDP): model and optimizer shards written by every rank with torch.distributed.checkpoint, which reshards
on load, so a sharded run resumes exactly at any world size. Either kind resumes under the other strategy too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

LATEST = "latest"
SHARDED_STATE = "distributed"  # torch.distributed.checkpoint folder of a sharded run


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The step directory `out_dir/latest` names, or None when there is none (yet)."""
    out_dir = Path(out_dir)
    pointer = out_dir / LATEST
    if pointer.is_dir():  # a symlink to the step
        return pointer.resolve()
    if not pointer.is_file():
        return None
    path = out_dir / pointer.read_text().strip()
    return path if path.is_dir() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A stage directory resolves to its latest step; anything else is itself."""
    return latest_checkpoint(path) or Path(path)


def _rng_states() -> dict:
    states = dict(python=random.getstate(), torch=torch.get_rng_state())
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(out_dir: str | Path, step: int, model, tokenizer, optimizer, state: dict, history: list[dict],
                    keep: int | None = None, processes=None) -> Path:
    """Write `out_dir/step-N` and point `latest` at it; with `keep`, delete all but the newest `keep` step
    directories. Written under a temporary name, renamed, and the pointer replaced atomically, so a kill at any
    moment leaves the previous checkpoint usable. Under torchrun every rank calls it (a sharded model's weights and
    optimizer are gathered and written by all of them); rank 0 writes the rest."""
    from training.parallel import full_state_dict, is_sharded, save_pretrained_weights, save_sharded_state

    rank = 0 if processes is None else processes.rank
    out_dir = Path(out_dir)
    final, scratch = out_dir / f"step-{step}", out_dir / f".step-{step}.partial"
    sharded = is_sharded(model)
    if rank == 0:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    _barrier(processes)
    if sharded:
        save_sharded_state(scratch / SHARDED_STATE, model, optimizer)
        weights = full_state_dict(model)  # collective; rank 0 gets the whole model
    if rank == 0:
        if sharded:
            save_pretrained_weights(model, scratch, weights)
        else:
            model.save_pretrained(scratch)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), scratch / "optimizer.pt")
        if tokenizer is not None:
            tokenizer.save_pretrained(scratch)
        torch.save(_rng_states(), scratch / "rng.pt")
        (scratch / "trainer_state.json").write_text(json.dumps(dict(state, step=step), indent=1, default=str))
        (scratch / "metrics.jsonl").write_text("".join(json.dumps(record, default=str) + "\n" for record in history))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(scratch, final)
        pointer = out_dir / f".{LATEST}.partial"
        pointer.write_text(final.name)
        os.replace(pointer, out_dir / LATEST)
        prune_checkpoints(out_dir, keep)
    _barrier(processes)
    return final


def _barrier(processes) -> None:
    if processes is not None:
        processes.barrier()


def prune_checkpoints(out_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` step directories (never the one `latest` names); returns those deleted."""
    if not keep:
        return []
    latest = latest_checkpoint(out_dir)
    steps = sorted((int(p.name.split("-", 1)[1]), p) for p in Path(out_dir).glob("step-*")
                   if p.is_dir() and p.name.split("-", 1)[1].isdigit())
    doomed = [p for _, p in steps[:-keep] if latest is None or p.resolve() != latest.resolve()]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def read_trainer_state(path: str | Path) -> tuple[dict, list[dict]]:
    """(trainer state, metrics history) of a step directory."""
    path = Path(path)
    state = json.loads((path / "trainer_state.json").read_text())
    history = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return state, history


def load_checkpoint(path: str | Path, model, optimizer) -> tuple[dict, list[dict]]:
    """Load a step directory's weights into `model` and state into `optimizer` (sharded or not: under torchrun every
    rank calls it), and restore the random states. Returns (trainer state, metrics history)."""
    from training.parallel import is_sharded, load_full_state, load_sharded_state, unsharded_class

    path = Path(path)
    if (path / SHARDED_STATE).is_dir():
        load_sharded_state(path / SHARDED_STATE, model, optimizer)
    else:
        dtype = next(model.parameters()).dtype
        loaded = unsharded_class(model).from_pretrained(path, dtype=dtype)
        device = next(model.parameters()).device
        optimizer_state = torch.load(path / "optimizer.pt", map_location=device)
        if is_sharded(model):
            load_full_state(model, optimizer, loaded.state_dict(), optimizer_state)
        else:
            model.load_state_dict(loaded.state_dict())
            optimizer.load_state_dict(optimizer_state)
        del loaded
    _set_rng_states(torch.load(path / "rng.pt", weights_only=False))
    return read_trainer_state(path)
