"""The checkpoints (and comparison models) an evaluation can be asked for, by name: a small JSON file mapping each
name (a Dagster `eval_checkpoint` partition key) to a `from_pretrained` directory or an OpenAI-compatible endpoint.
`dice eval add-checkpoint NAME PATH` writes it; the training assets' checkpoints are registered the same way.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from dice_pipeline import settings

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # valid as a Dagster partition key, no "|" or ","
KINDS = ("checkpoint", "endpoint")
REGISTRY_ENV_VAR = settings.EVAL_CHECKPOINTS.name
EVAL_CHECKPOINT_PARTITIONS_NAME = "eval_checkpoint"  # the Dagster dynamic partitions definition holding the names


@dataclass
class EvalModel:
    name: str
    kind: str = "checkpoint"  # checkpoint: a from_pretrained directory; endpoint: an OpenAI-compatible server
    path: str = ""  # checkpoint directory
    base_url: str = ""  # endpoint
    model: str = ""  # endpoint's model name
    decoding: str = "auto"  # auto | block_diffusion | autoregressive

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"checkpoint name {self.name!r} must match {NAME_PATTERN.pattern} (a partition key)")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "checkpoint" and not self.path:
            raise ValueError("a checkpoint needs a path")
        if self.kind == "endpoint" and not (self.base_url and self.model):
            raise ValueError("an endpoint needs base_url and model")


def registry_path() -> Path:
    from dice_pipeline.paths import dagster_home

    return Path(settings.EVAL_CHECKPOINTS.get() or dagster_home() / "eval_checkpoints.json")


def load_registry(path: str | os.PathLike | None = None) -> dict[str, EvalModel]:
    path = Path(path) if path is not None else registry_path()
    if not path.is_file():
        return {}
    return {name: EvalModel(**entry) for name, entry in json.loads(path.read_text()).items()}


def register(model: EvalModel, path: str | os.PathLike | None = None) -> Path:
    """Add or replace `model` in the registry file; returns the file's path."""
    path = Path(path) if path is not None else registry_path()
    entries = {name: asdict(entry) for name, entry in load_registry(path).items()}
    entries[model.name] = asdict(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
    with os.fdopen(handle, "w") as out:
        json.dump(entries, out, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def resolve(name: str, path: str | os.PathLike | None = None) -> EvalModel:
    registry = load_registry(path)
    if name not in registry:
        raise KeyError(f"no evaluation model {name!r} registered in {path or registry_path()}; "
                       f"`dice eval add-checkpoint {name} PATH` first")
    return registry[name]


def register_checkpoint(name: str, path: str, *, instance=None, registry: str | os.PathLike | None = None,
                        decoding: str = "auto") -> EvalModel:
    """Register a checkpoint directory for evaluation and, given a Dagster instance, add its `eval_checkpoint`
    partition: what a training asset calls once it has written a checkpoint (then `kernelbench_evaluation` for
    partition `name|<level>` evaluates it)."""
    model = EvalModel(name, path=str(path), decoding=decoding)
    register(model, registry)
    if instance is not None and name not in set(instance.get_dynamic_partitions(EVAL_CHECKPOINT_PARTITIONS_NAME)):
        instance.add_dynamic_partitions(EVAL_CHECKPOINT_PARTITIONS_NAME, [name])
    return model
