"""The kernel profile: one profiled call of the candidate and one of the reference, and what their GPU kernels say
(ProfilerStage, mixed into CandidateJudge): none of the candidate's own kernels ran (`no_custom_kernel_ran`),
kernels a compiler generated from PyTorch code ran (`generated_kernels_ran`), or the candidate's kernels are a
minor share beside PyTorch redoing the reference's work (`baseline_kernel`)."""

from __future__ import annotations

import re
from typing import Any

import torch

from dice_pipeline.verify.judge.judgement import CandidateFailed, Rejection, is_out_of_memory
from dice_pipeline.verify.judge.tensors import clone
from dice_pipeline.verify.verdict import (
    Reason,
    Status,
    generated_kernel_names,
    generated_kernels_reason,
    kernel_is_named,
)

_LIBRARY_GEMM = re.compile(r"gemm|xmma|cutlass|cublas|nvjet|wgmma|matmul|gemv|dot_kernel", re.IGNORECASE)
_LIBRARY_CONV = re.compile(r"conv|cudnn|winograd|implicit_?gemm|fft", re.IGNORECASE)
_ELEMENTWISE_LAUNCHER = re.compile(r"(?:vectorized_|unrolled_)?elementwise_kernel(?:_with_index)?<")


def _first_functor(template_args: str) -> str:
    """The first template argument that is not a number, from `<4, Functor<float>, Loader>`'s inside."""
    depth, current, args = 0, "", []
    for char in template_args:
        if char == "<":
            depth += 1
        elif char == ">":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += char
    args.append(current.strip())
    return next((arg for arg in args if arg and not arg.isdigit()), "")


def kernel_family(name: str) -> str:
    """What a profiler kernel computes, independent of the launch details that vary between calls: "gemm" and
    "conv" for library kernels (cuBLAS/cuDNN pick per shape and layout), else the name without its argument list
    and without ATen's elementwise launcher variant (vectorized / unrolled)."""
    head = name.split("(")[0].removeprefix("void ").strip()
    if _LIBRARY_CONV.search(head):
        return "conv"
    if _LIBRARY_GEMM.search(head):
        return "gemm"
    launcher = _ELEMENTWISE_LAUNCHER.search(head)
    if launcher:  # ATen's elementwise kernels: the functor is the op; the launcher variant depends on alignment
        return f"elementwise<{_first_functor(head[launcher.end():])}>"
    return head


def baseline_kernel_finding(custom_us: float, total_us: float, custom_ran: bool, candidate_other_families: set[str],
                            reference_families: set[str], max_share: float) -> str | None:
    """Why the candidate is a baseline kernel, or None: its own kernels ran, did less than `max_share` of its GPU
    time, and the kernels it ran besides them (PyTorch / library compute; memcpy and memset are not counted)
    include every kind of kernel the reference runs: the reference's whole computation is redone by PyTorch and
    the custom kernel replaces none of it (`torch.matmul` plus a copy kernel). A cuBLAS GEMM with a custom fused
    epilogue is not one: the reference's bias/activation kernels are missing from its PyTorch work."""
    if not custom_ran or total_us <= 0 or not reference_families:
        return None
    share = custom_us / total_us
    if share >= max_share or not reference_families <= candidate_other_families:
        return None
    return (f"every kind of kernel the reference runs ({', '.join(sorted(reference_families))[:200]}) also ran "
            f"outside the candidate's own kernels, which did {share:.1%} of its GPU time ({custom_us:.0f} of "
            f"{total_us:.0f} us): the work is PyTorch's, not the candidate's CUDA")


class ProfilerStage:
    """CandidateJudge's profiler pass (uses its models, inputs, config, guard and judgement)."""


    def _profile_kernels(self, model: Any, inputs: list[Any], seed: int) -> list[Any]:
        """GPU kernel events of one call of `model` (memcpy and memset left out). Only the forward call is inside
        the profiler window: the harness's own checks (input comparison, guard) run after it."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        given = clone(inputs)
        torch.manual_seed(seed)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.no_grad():
                model(*given)
            self._synchronize()
        return [e for e in prof.events() if e.device_type == DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset"))]

    def run_profiler_check(self) -> None:
        seed = self.config.seed + 500
        inputs = self._inputs(seed)
        self._call_candidate(inputs, seed, "profiler")  # checked call first: a failure here is the candidate's
        try:
            try:
                events = self._profile_kernels(self.cand_model, inputs, seed)
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise CandidateFailed(f"{type(exc).__name__}: {exc}") from exc
                raise
            reference_events = self._profile_kernels(self.ref_model, inputs, seed)
        except CandidateFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - profiler/CUPTI unavailable is recorded, not fatal
            if isinstance(exc, Rejection):
                raise
            self.judgement.flag("profiler_unavailable")
            self.judgement.reasons.append(Reason("profiler_unavailable", repr(exc)[:500], "anti_gaming"))
            return
        # The profiled call was not checked inside the window: check what it may have done now.
        self.guard.check("during a ModelNew call (profiler)")
        del inputs
        total_us = sum(e.time_range.elapsed_us() for e in events)
        custom = [e for e in events if kernel_is_named(e.name, self.custom_kernel_names)]
        custom_us = sum(e.time_range.elapsed_us() for e in custom)
        provenance = self.judgement.fields.setdefault("provenance", {})
        self.judgement.fields["custom_kernel_time_share"] = custom_us / total_us if total_us > 0 else 0.0
        provenance["kernels_seen"] = sorted({e.name[:120] for e in events})[:20]
        generated = generated_kernel_names((e.name for e in events), self.custom_kernel_names)
        if generated:
            provenance["generated_kernels"] = generated[:20]
            reason = generated_kernels_reason(generated)
            raise Rejection(Status.DECEPTIVE, reason.code, reason.message, reason.stage)
        if not custom:
            raise Rejection(Status.DECEPTIVE, "no_custom_kernel_ran",
                            f"none of the candidate's kernels ({', '.join(self.custom_kernel_names) or 'none found'}) "
                            f"ran; GPU kernels seen: {sorted({e.name[:60] for e in events})[:5]}", "anti_gaming")
        if self.judgement.fields["custom_kernel_time_share"] < self.config.minor_custom_share:
            self.judgement.flag("minor_custom_kernel_share")
        other_families = {kernel_family(e.name) for e in events if not kernel_is_named(e.name, self.custom_kernel_names)}
        reference_families = {kernel_family(e.name) for e in reference_events}
        provenance["reference_kernel_families"] = sorted(reference_families)[:20]
        finding = baseline_kernel_finding(custom_us, total_us, bool(custom), other_families, reference_families,
                                          self.config.baseline_kernel_share)
        if finding is not None:
            if self.config.baseline_kernel_policy == "reject":
                raise Rejection(Status.DECEPTIVE, "baseline_kernel", finding, "anti_gaming")
            self.judgement.flag("baseline_kernel")
            provenance["baseline_kernel"] = finding
