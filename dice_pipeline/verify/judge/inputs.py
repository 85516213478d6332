"""Where a judgement's inputs come from: the task's own seeded `get_inputs()`, drawn on the host like KernelBench or
on the GPU where a host draw is slow or large (InputDraws, mixed into CandidateJudge), and the fresh device draws the
timed calls use (fresh_inputs_on_device). Every draw is seeded: both models always see the same values."""

from __future__ import annotations

from typing import Any, Callable

import torch

from dice_pipeline.verify.judge.tensors import to_device


def fresh_inputs_on_device(get_inputs: Callable[[], list[Any]], like: list[Any], device: torch.device,
                           seed: int) -> list[Any] | None:
    """A new draw of the task's inputs made directly on `device` (tensor factories default to it inside
    `get_inputs`), so every timed call can see never-seen values at GPU speed. None when the task's `get_inputs`
    cannot run that way or gives tensors of other shapes, dtypes or devices than `like`."""
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            values = list(get_inputs())
    except Exception:  # noqa: BLE001 - e.g. numpy inside get_inputs: the caller falls back to stored input sets
        return None
    if len(values) != len(like):
        return None
    for value, reference in zip(values, like):
        if isinstance(reference, torch.Tensor) != isinstance(value, torch.Tensor):
            return None
        if isinstance(reference, torch.Tensor) and (value.shape != reference.shape or value.dtype != reference.dtype
                                                    or value.device != reference.device):
            return None
    return values


class InputDraws:
    """CandidateJudge's input draws (uses its reference, config, device, judgement and host timer)."""

    def _inputs(self, seed: int) -> list[Any]:
        torch.manual_seed(seed)
        if self.draw_on_gpu:
            with torch.device(self.device):
                return [to_device(x, self.device) for x in self.reference.get_inputs()]
        return [to_device(x, self.device) for x in self.reference.get_inputs()]

    def _choose_input_draw(self) -> None:
        """Draw inputs on the host (the task's own get_inputs(), like KernelBench), or on the GPU when a host draw
        is slow or large. Both models always see the same values; the verdict states which way they were drawn."""
        cfg, provenance = self.config, self.judgement.fields.setdefault("provenance", {})
        get_inputs = self.reference.get_inputs
        planned_bytes = None
        try:  # shapes without allocating: a meta-device dry run (fails for get_inputs that read values)
            torch.manual_seed(cfg.seed)
            with torch.device("meta"):
                planned = list(get_inputs())
            planned_bytes = sum(x.numel() * x.element_size() for x in planned if isinstance(x, torch.Tensor))
        except Exception:  # noqa: BLE001 - the host draw below tells instead
            planned = None
        why = None
        if planned_bytes is not None and planned_bytes > cfg.gpu_draw_bytes:
            why = f"inputs of {planned_bytes / 2**20:.0f} MB"
        else:
            started = self._perf_counter()
            torch.manual_seed(cfg.seed)
            planned = list(get_inputs())
            host_draw_s = self._perf_counter() - started
            if host_draw_s > cfg.slow_draw_seconds:
                why = f"one host draw took {host_draw_s:.2f} s"
        provenance["input_bytes"] = planned_bytes
        if why is not None and planned is not None:
            self._synchronize()
            started = self._perf_counter()
            torch.manual_seed(cfg.seed)
            try:
                with torch.device(self.device):
                    drawn = list(get_inputs())
                self._synchronize()
                usable = len(drawn) == len(planned) and all(
                    isinstance(a, torch.Tensor) == isinstance(b, torch.Tensor)
                    and (not isinstance(a, torch.Tensor) or (a.shape == b.shape and a.dtype == b.dtype))
                    for a, b in zip(drawn, planned))
            except Exception:  # noqa: BLE001 - e.g. numpy inside get_inputs: stay on the host
                usable = False
            gpu_draw_s = self._perf_counter() - started
            del planned
            if usable:
                self.draw_on_gpu = True
                provenance["input_draw"] = (f"get_inputs() under a CUDA device context, seeded ({why}; one GPU draw "
                                            f"{gpu_draw_s:.3f} s)")
                return
            provenance["input_draw"] = f"get_inputs() on the host ({why}; it cannot draw on the GPU)"
        else:
            provenance["input_draw"] = "get_inputs() on the host"
