"""Small tensor helpers every stage of the judge uses: moving and cloning inputs, flattening outputs, and the
in-place mutation check made after every candidate call."""

from __future__ import annotations

from typing import Any

import torch

from dice_pipeline.verify.judge.judgement import Rejection
from dice_pipeline.verify.verdict import Status


def to_device(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def shares_memory(values: list[Any], others: list[Any]) -> bool:
    """Whether any tensor of `values` lives in the storage of any tensor of `others`."""
    storages = {o.untyped_storage().data_ptr() for o in others if isinstance(o, torch.Tensor)}
    return any(isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in storages for v in values)


def flatten_outputs(output: Any) -> list[Any]:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in flatten_outputs(item)]
    return [output]


def output_bytes(outputs: list[Any]) -> int:
    """Bytes of every tensor leaf of `outputs`."""
    return sum(leaf.numel() * leaf.element_size() for output in outputs for leaf in flatten_outputs(output)
               if isinstance(leaf, torch.Tensor))


def same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))))


def reject_mutated_inputs(before: list[Any], after: list[Any], when: str) -> None:
    for index, (original, given) in enumerate(zip(before, after)):
        if isinstance(original, torch.Tensor) and not same_tensor_values(original, given):
            raise Rejection(Status.DECEPTIVE, "mutated_inputs", f"input {index} was modified in place {when}",
                            "anti_gaming")
