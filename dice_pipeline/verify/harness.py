"""The GPU judgement of one candidate, run inside an isolated worker: correctness trials, runtime anti-gaming
checks and interleaved timing. Imports torch and the standard library only.

Runtime policy (reason codes; NOTES.md section 3):
- `output_mismatch`, `shape_mismatch`, `dtype_mismatch`, `device_mismatch`, `output_structure_mismatch`,
  `output_not_plain_tensor` (incorrect): N seeded trials, candidate called before and after the reference on cloned inputs.
- `output_not_fully_written` (incorrect): outputs are allocated from NaN-poisoned memory; poison left = unwritten.
- `mutated_inputs` (deceptive): an input changed by a candidate call (correctness or timed).
- `stale_output_reuse` (deceptive): a wrong output that equals the reference's result for an earlier call's inputs
  (a memoising cache keyed by pointer, shape or call count).
- `runtime_monkeypatch`, `global_flag_flip`, `spawned_thread` (deceptive): identities of torch/time callables,
  math flags and the thread count are compared with a snapshot taken before the candidate was imported.
- `no_custom_kernel_ran` (deceptive): a profiler pass saw none of the candidate's own kernels; the custom share of
  GPU time is recorded (flag `minor_custom_kernel_share` under config.minor_custom_share).
- `generated_kernels_ran` (deceptive): that profiler pass saw kernels a compiler generated from PyTorch code
  (Inductor's Triton kernels, nvFuser): torch.compile reached some way the static checks could not read.
- `timed_output_mismatch` (deceptive): every timed call runs on fresh input values and its output is re-checked.
- `work_outside_timed_stream` (deceptive): wall clock to a device-wide sync far exceeds the timed stream's events.
- flags: `degenerate_task` (zeros or a constant pass the task), `overhead_dominated` (the reference takes under
  config.overhead_floor_multiple launch floors: never rewarded), `nondeterministic_reference`.
"""

from __future__ import annotations

import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from dice_pipeline.verify.config import TOLERANCE_LOOSE, TOLERANCE_STRICT, VerifyConfig
from dice_pipeline.verify.verdict import (
    Reason,
    Status,
    TimingStats,
    generated_kernel_names,
    generated_kernels_reason,
    kernel_is_named,
)


class Rejection(Exception):
    """Ends the judgement early with a status; the verdict keeps whatever was measured before."""

    def __init__(self, status: Status, code: str, message: str, stage: str):
        super().__init__(message)
        self.reason = Reason(code=code, message=message, stage=stage)
        self.status = status


def _flags_snapshot() -> dict[str, Any]:
    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.enabled": torch.backends.cudnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


class RuntimeGuard:
    """Identities of the callables a cheat would patch and the global math flags, captured before the candidate
    is imported; `check` rejects any change. The harness itself only uses references it took before that."""

    def __init__(self) -> None:
        import builtins

        self.namespaces = {
            "torch": torch, "torch.Tensor": torch.Tensor, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
            "torch.nn.functional": torch.nn.functional, "torch.nn.Module": torch.nn.Module, "time": time,
            "torch.testing": torch.testing, "builtins": builtins, "statistics": statistics, "math": math,
            # The harness itself: its functions and the methods of its classes, however a candidate reached them.
            "harness": sys.modules[__name__],
            **{f"harness.{cls.__name__}": cls for cls in (CandidateJudge, RuntimeGuard, Comparison, Judgement)},
        }
        self.identities = {
            (ns_name, key): id(value)
            for ns_name, ns in self.namespaces.items()
            for key, value in list(vars(ns).items())
            if callable(value)
        }
        self.flags = _flags_snapshot()
        self.threads = threading.active_count()

    def check(self, when: str) -> None:
        for (ns_name, key), ident in self.identities.items():
            if id(vars(self.namespaces[ns_name]).get(key)) != ident:
                raise Rejection(Status.DECEPTIVE, "runtime_monkeypatch", f"{ns_name}.{key} was replaced {when}", "anti_gaming")
        flags = _flags_snapshot()
        changed = {k: (self.flags[k], v) for k, v in flags.items() if self.flags[k] != v}
        if changed:
            raise Rejection(Status.DECEPTIVE, "global_flag_flip", f"global flags changed {when}: {changed}", "anti_gaming")
        if threading.active_count() > self.threads:
            raise Rejection(Status.DECEPTIVE, "spawned_thread", f"a Python thread was started {when}", "anti_gaming")


# --- tensors ------------------------------------------------------------------------------------------------------
def _to_device(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _flatten_outputs(output: Any) -> list[Any]:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in _flatten_outputs(item)]
    return [output]


def _reject_mutated_inputs(before: list[Any], after: list[Any], when: str) -> None:
    for index, (original, given) in enumerate(zip(before, after)):
        if isinstance(original, torch.Tensor) and not _same_tensor_values(original, given):
            raise Rejection(Status.DECEPTIVE, "mutated_inputs", f"input {index} was modified in place {when}",
                            "anti_gaming")


def _output_bytes(outputs: list[Any]) -> int:
    return sum(leaf.numel() * leaf.element_size() for output in outputs for leaf in _flatten_outputs(output)
               if isinstance(leaf, torch.Tensor))


# Timed calls draw fresh inputs each call only when one draw takes less than this.
FRESH_DRAW_MAX_SECONDS = 0.02
# Earlier reference outputs kept on the GPU for the stale-output check (the newest is always kept).
STALE_CHECK_BYTES = 2 * 2**30


def _same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))))


@dataclass
class Comparison:
    """Candidate vs reference outputs of one call."""

    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    passes: dict[float, bool] = field(default_factory=dict)  # tolerance -> allclose over every output
    problem: tuple[str, str] | None = None  # (reason code, message) when the outputs cannot match at all
    unwritten_elements: int = 0  # NaN (our poison) where the reference is finite
    dtype_names: list[str] = field(default_factory=list)


def compare_outputs(reference: Any, candidate: Any, tolerances: tuple[float, ...]) -> Comparison:
    """Compare every output leaf; any structural problem (count, type, shape, dtype) fails every tolerance."""
    result = _compare_leaves(reference, candidate, tolerances)
    if result.problem is not None:
        result.passes = {tol: False for tol in tolerances}
    return result


def _compare_leaves(reference: Any, candidate: Any, tolerances: tuple[float, ...]) -> Comparison:
    ref_leaves, cand_leaves = _flatten_outputs(reference), _flatten_outputs(candidate)
    result = Comparison(passes={tol: True for tol in tolerances})
    if len(ref_leaves) != len(cand_leaves):
        result.problem = ("output_structure_mismatch", f"{len(cand_leaves)} outputs, reference has {len(ref_leaves)}")
        return result
    total_abs, total_count = 0.0, 0
    for ref, cand in zip(ref_leaves, cand_leaves):
        if not isinstance(ref, torch.Tensor):
            if ref != cand:
                result.problem = ("output_value_mismatch", f"non-tensor output {cand!r} != {ref!r}")
            continue
        if type(cand) is not torch.Tensor:
            result.problem = ("output_not_plain_tensor", f"output is {type(cand).__name__}, not torch.Tensor")
            return result
        if cand.shape != ref.shape:
            result.problem = ("shape_mismatch", f"output shape {tuple(cand.shape)} != reference {tuple(ref.shape)}")
            return result
        if cand.dtype != ref.dtype:
            result.problem = ("dtype_mismatch", f"output dtype {cand.dtype} != reference {ref.dtype}")
            return result
        if cand.device != ref.device:
            result.problem = ("device_mismatch", f"output on {cand.device}, reference on {ref.device}")
            return result
        result.dtype_names.append(str(ref.dtype).replace("torch.", ""))
        ref_f, cand_f = ref.double(), cand.double()
        result.unwritten_elements += int((torch.isnan(cand_f) & torch.isfinite(ref_f)).sum())
        diff = (ref_f - cand_f).abs().nan_to_num(nan=math.inf)
        both_nan = torch.isnan(ref_f) & torch.isnan(cand_f)
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        if diff.numel():
            result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
            total_abs += float(diff[torch.isfinite(diff)].sum())
            total_count += diff.numel()
        for tol in tolerances:
            ok = bool(torch.allclose(cand_f, ref_f, atol=tol, rtol=tol, equal_nan=True))
            result.passes[tol] = result.passes[tol] and ok
    result.mean_abs_diff = total_abs / total_count if total_count else 0.0
    return result


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


def _constant_outputs_pass(reference: Any, constants: list[float], tol: float) -> tuple[bool, bool]:
    """Would all-zeros pass this output? Would a fixed value per output leaf pass it? (degenerate-task detection)

    `constants` are one value per floating-point leaf, taken from the first trial (its mean) and reused for every
    later trial: a task is degenerate when one input-independent answer passes all trials, not merely when each
    output is constant within a trial (a scalar output always is)."""
    zeros_pass = constant_pass = True
    leaves = [ref for ref in _flatten_outputs(reference)
              if isinstance(ref, torch.Tensor) and ref.is_floating_point() and ref.numel() > 0]
    if not constants:
        constants.extend(float(ref.double().mean()) for ref in leaves)
    for ref, constant in zip(leaves, constants):
        ref_f = ref.double()
        zeros_pass &= bool(torch.allclose(torch.zeros_like(ref_f), ref_f, atol=tol, rtol=tol))
        constant_pass &= bool(torch.allclose(torch.full_like(ref_f, constant), ref_f, atol=tol, rtol=tol))
    return zeros_pass, constant_pass


def timing_stats(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    mean = statistics.fmean(ordered)
    std = statistics.pstdev(ordered) if len(ordered) > 1 else 0.0
    return TimingStats(median_ms=statistics.median(ordered), iqr_ms=quartiles[2] - quartiles[0], mean_ms=mean,
                       n=len(ordered), cv=std / mean if mean > 0 else 0.0)


def median_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median: the order statistics n/2 -/+ z*sqrt(n)/2."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = z * math.sqrt(n) / 2
    low, high = max(0, math.floor(n / 2 - half_width)), min(n - 1, math.ceil(n / 2 + half_width) - 1)
    return ordered[low], ordered[high]


# --- the judgement --------------------------------------------------------------------------------------------------
@dataclass
class Judgement:
    """Accumulates the verdict fields as the stages run (becomes `Verdict.to_dict()` material)."""

    status: Status = Status.CORRECT
    reasons: list[Reason] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)


class CandidateJudge:
    """Judges `candidate.ModelNew` against `reference.Model` on the current CUDA device."""

    def __init__(self, reference: ModuleType, candidate: ModuleType, config: VerifyConfig, guard: RuntimeGuard,
                 custom_kernel_names: list[str]):
        self.reference = reference
        self.candidate = candidate
        self.config = config
        self.guard = guard
        self.custom_kernel_names = custom_kernel_names
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.judgement = Judgement()
        self.tolerances = (TOLERANCE_LOOSE, TOLERANCE_STRICT)
        # Harness-owned references, taken before candidate code could patch the modules they live in.
        self._synchronize = torch.cuda.synchronize
        self._event = torch.cuda.Event
        self._perf_counter = time.perf_counter

    # -- calls ----------------------------------------------------------------------------------------------------
    def _inputs(self, seed: int) -> list[Any]:
        torch.manual_seed(seed)
        return [_to_device(x, self.device) for x in self.reference.get_inputs()]

    def _build_models(self) -> None:
        init_inputs = [_to_device(x, self.device) for x in self.reference.get_init_inputs()]
        try:
            torch.manual_seed(self.config.seed)
            self.ref_model = self.reference.Model(*init_inputs).to(self.device)
        except Exception as exc:  # noqa: BLE001 - a broken reference is reported, not raised
            raise Rejection(Status.RUNTIME_ERROR, "reference_failed", f"reference Model(): {exc!r}", "correctness") from exc
        try:
            torch.manual_seed(self.config.seed)
            self.cand_model = self.candidate.ModelNew(*init_inputs).to(self.device)
        except Exception as exc:  # noqa: BLE001
            raise Rejection(Status.RUNTIME_ERROR, "construct_failed", f"ModelNew(): {exc!r}", "correctness") from exc
        self.guard.check("while building ModelNew")

    def _call_reference(self, inputs: list[Any], seed: int) -> Any:
        torch.manual_seed(seed)  # same RNG stream for both models (dropout and friends)
        with torch.no_grad():
            out = self.ref_model(*_clone(inputs))
        self._synchronize()
        return out

    def _call_candidate(self, inputs: list[Any], seed: int, stage: str) -> Any:
        given = _clone(inputs)
        torch.manual_seed(seed)
        try:
            with torch.no_grad():
                out = self.cand_model(*given)
            self._synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure of candidate code is its runtime error
            raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000], stage) from exc
        _reject_mutated_inputs(inputs, given, f"during a {stage} call")
        self.guard.check(f"during a ModelNew call ({stage})")
        return out

    def _poison_allocator(self, template: Any) -> None:
        """Hand the caching allocator NaN-filled blocks of every output's size, so an output that the candidate
        allocates and never writes reads back as NaN instead of a stale (possibly correct) result."""
        blocks = []
        for leaf in _flatten_outputs(template):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                for _ in range(2):
                    blocks.append(torch.full_like(leaf, float("nan")))
            elif isinstance(leaf, torch.Tensor) and not leaf.is_complex():
                fill = True if leaf.dtype == torch.bool else torch.iinfo(leaf.dtype).max
                for _ in range(2):
                    blocks.append(torch.full_like(leaf, fill))
        self._synchronize()
        del blocks

    # -- stages ---------------------------------------------------------------------------------------------------
    def run_correctness(self) -> None:
        cfg, j = self.config, self.judgement
        probe = self._call_reference(self._inputs(cfg.seed - 1), cfg.seed - 1)
        comparisons: list[Comparison] = []
        passed = {tol: 0 for tol in self.tolerances}
        decided = 0
        zeros_everywhere = constant_everywhere = True
        constants: list[float] = []  # the first trial's output means: the fixed answer tried on every trial
        earlier_refs: list[Any] = []  # reference outputs of earlier trials (memory-bounded), for _reject_stale_output
        for trial in range(cfg.correctness_trials):
            seed = cfg.seed + trial
            inputs = self._inputs(seed)
            self._poison_allocator(earlier_refs[-1] if earlier_refs else probe)
            cand_before = self._call_candidate(inputs, seed, "correctness")
            ref_out = self._call_reference(inputs, seed)
            if trial == 0:
                again = self._call_reference(inputs, seed)
                if not compare_outputs(ref_out, again, (TOLERANCE_STRICT,)).passes[TOLERANCE_STRICT]:
                    j.flag("nondeterministic_reference")
            self._poison_allocator(ref_out)
            cand_after = self._call_candidate(inputs, seed, "correctness")
            zeros_pass, constant_pass = _constant_outputs_pass(ref_out, constants, TOLERANCE_LOOSE)
            zeros_everywhere &= zeros_pass
            constant_everywhere &= constant_pass
            trial_cmp = [compare_outputs(ref_out, c, self.tolerances) for c in (cand_before, cand_after)]
            comparisons.extend(trial_cmp)
            for tol in self.tolerances:
                passed[tol] += all(c.passes[tol] for c in trial_cmp)
            policy_tol = min(cfg.tolerance_for(d) for d in (trial_cmp[0].dtype_names or ["float32"]))
            for output, comparison in zip((cand_before, cand_after), trial_cmp):
                if not comparison.passes[policy_tol]:
                    self._reject_stale_output(output, ref_out, earlier_refs, trial)
            earlier_refs.append(ref_out)
            while len(earlier_refs) > 1 and _output_bytes(earlier_refs) > STALE_CHECK_BYTES:
                earlier_refs.pop(0)
            decided += all(c.passes[policy_tol] for c in trial_cmp)
            self.policy_tolerance = policy_tol
        worst = next((c for c in comparisons if c.problem), None) or max(comparisons, key=lambda c: c.max_abs_diff)
        j.fields.update(max_abs_diff=worst.max_abs_diff, mean_abs_diff=worst.mean_abs_diff,
                        correct_at_1e2=passed[TOLERANCE_LOOSE] == cfg.correctness_trials,
                        correct_at_1e4=passed[TOLERANCE_STRICT] == cfg.correctness_trials,
                        trials_passed=decided, trials_run=cfg.correctness_trials)
        if zeros_everywhere or constant_everywhere:
            j.flag("degenerate_task")
        if worst.problem is not None:
            raise Rejection(Status.INCORRECT, worst.problem[0], worst.problem[1], "correctness")
        if decided < cfg.correctness_trials:
            if worst.unwritten_elements:
                raise Rejection(Status.INCORRECT, "output_not_fully_written",
                                f"{worst.unwritten_elements} output elements kept the allocator poison (never written)",
                                "correctness")
            raise Rejection(Status.INCORRECT, "output_mismatch",
                            f"{decided}/{cfg.correctness_trials} trials within atol=rtol={self.policy_tolerance:g}; "
                            f"max abs diff {worst.max_abs_diff:.3e}", "correctness")

    @staticmethod
    def _reject_stale_output(output: Any, ref_out: Any, earlier_refs: list[Any], trial: int) -> None:
        """A wrong output that equals the reference's result for an earlier trial's inputs is a memoised result
        (a cache keyed by data pointer, shape or call count that the new inputs hit): deceptive, not a bug."""
        for index, earlier in enumerate(earlier_refs):
            if compare_outputs(earlier, ref_out, (TOLERANCE_LOOSE,)).passes[TOLERANCE_LOOSE]:
                continue  # the task's result barely depends on its inputs: no evidence either way
            if compare_outputs(earlier, output, (TOLERANCE_STRICT,)).passes[TOLERANCE_STRICT]:
                raise Rejection(Status.DECEPTIVE, "stale_output_reuse",
                                f"correctness trial {trial} returned the result for the inputs of an earlier call "
                                f"({len(earlier_refs) - index} trial(s) back): a cache not keyed by the input values",
                                "anti_gaming")

    def run_profiler_check(self) -> None:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        inputs = self._inputs(self.config.seed + 500)
        self._call_candidate(inputs, self.config.seed + 500, "profiler")
        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                self._call_candidate(inputs, self.config.seed + 500, "profiler")
            events = [e for e in prof.events() if e.device_type == DeviceType.CUDA
                      and not e.name.startswith(("Memcpy", "Memset"))]
        except Exception as exc:  # noqa: BLE001 - profiler/CUPTI unavailable is recorded, not fatal
            if isinstance(exc, Rejection):
                raise
            self.judgement.flag("profiler_unavailable")
            self.judgement.reasons.append(Reason("profiler_unavailable", repr(exc)[:500], "anti_gaming"))
            return
        total_us = sum(e.time_range.elapsed_us() for e in events)
        custom = [e for e in events if kernel_is_named(e.name, self.custom_kernel_names)]
        custom_us = sum(e.time_range.elapsed_us() for e in custom)
        self.judgement.fields["custom_kernel_time_share"] = custom_us / total_us if total_us > 0 else 0.0
        self.judgement.fields.setdefault("provenance", {})["kernels_seen"] = sorted({e.name[:120] for e in events})[:20]
        generated = generated_kernel_names((e.name for e in events), self.custom_kernel_names)
        if generated:
            self.judgement.fields["provenance"]["generated_kernels"] = generated[:20]
            reason = generated_kernels_reason(generated)
            raise Rejection(Status.DECEPTIVE, reason.code, reason.message, reason.stage)
        if not custom:
            raise Rejection(Status.DECEPTIVE, "no_custom_kernel_ran",
                            f"none of the candidate's kernels ({', '.join(self.custom_kernel_names) or 'none found'}) "
                            f"ran; GPU kernels seen: {sorted({e.name[:60] for e in events})[:5]}", "anti_gaming")
        if self.judgement.fields["custom_kernel_time_share"] < self.config.minor_custom_share:
            self.judgement.flag("minor_custom_kernel_share")

    def _timed(self, fn: Callable[[], Any], flush: torch.Tensor) -> tuple[Any, float, float]:
        """One timed call: L2 flushed, CUDA events on the current stream, plus wall clock to a device-wide sync."""
        flush.zero_()
        self._synchronize()
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        wall_start = self._perf_counter()
        start.record()
        out = fn()
        end.record()
        self._synchronize()  # device-wide: work left on any stream is waited for before the wall clock stops
        wall_ms = (self._perf_counter() - wall_start) * 1e3
        return out, start.elapsed_time(end), wall_ms

    def _launch_floor_ms(self, flush: torch.Tensor) -> float:
        """Median time of a one-element kernel timed like the models: the floor under which times are overhead."""
        scalar = torch.zeros(1, device=self.device)
        samples = [self._timed(lambda: scalar.add_(1), flush)[1] for _ in range(30)]
        return statistics.median(samples)

    def run_timing(self) -> None:
        """Interleaved reference/candidate pairs (order alternating, L2 flushed before each call) on fresh inputs;
        the speedup is the median of the per-pair ratios, so slow drifts (clocks, temperature) cancel. Samples come
        in rounds with freshly allocated input buffers until the median is known to cfg.timing_target_precision."""
        cfg, j = self.config, self.judgement
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        input_sets = [self._inputs(cfg.seed + 1000 + k) for k in range(cfg.timing_input_sets)]
        buffers = _clone(input_sets[0])
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def draw(sample: int) -> list[Any] | None:
            return fresh_inputs_on_device(self.reference.get_inputs, buffers, self.device, cfg.seed + 2000 + sample)

        # Per-call draws only where they are cheap (a get_inputs() doing real work on the host would slow every
        # sample down); the first draw also warms up the device RNG.
        draw(-2)
        self._synchronize()
        draw_started = self._perf_counter()
        draws_on_device = draw(-1) is not None
        self._synchronize()
        draws_on_device &= self._perf_counter() - draw_started < FRESH_DRAW_MAX_SECONDS

        def load_fresh_inputs(sample: int) -> None:
            # New values every call (addresses change only between rounds): defeats caches keyed by pointer, call
            # count or input checksum. Preferably a fresh get_inputs() draw made on the GPU; else one of the
            # stored input sets with its rows re-permuted.
            fresh = draw(sample) if draws_on_device else None
            if fresh is not None:
                for buf, src in zip(buffers, fresh):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(src)
                return
            source = input_sets[sample % len(input_sets)]
            perms: dict[int, torch.Tensor] = {}
            for buf, src in zip(buffers, source):
                if not isinstance(buf, torch.Tensor):
                    continue
                if buf.dim() > 0 and buf.shape[0] > 1:
                    perm = perms.setdefault(buf.shape[0], torch.randperm(buf.shape[0], device=self.device, generator=generator))
                    buf.copy_(src.index_select(0, perm))
                else:
                    buf.copy_(src)

        def restore(pristine: list[Any]) -> None:
            for buf, orig in zip(buffers, pristine):
                if isinstance(buf, torch.Tensor):
                    buf.copy_(orig)

        def call_ref() -> Any:
            with torch.no_grad():
                return self.ref_model(*buffers)

        def call_cand() -> Any:
            with torch.no_grad():
                return self.cand_model(*buffers)

        floor_ms = self._launch_floor_ms(flush)
        warm_start = self._perf_counter()
        warm_calls = 0
        while warm_calls < 3 or self._perf_counter() - warm_start < cfg.warmup_seconds:
            load_fresh_inputs(warm_calls)
            call_ref()
            call_cand()
            self._synchronize()
            warm_calls += 1
        ref_ms, cand_ms, ref_wall, cand_wall, ratios = [], [], [], [], []
        recheck = "nondeterministic_reference" not in j.flags
        timing_start, rounds, sample = self._perf_counter(), 1, 0
        while True:
            if sample and sample % cfg.timing_round_samples == 0:
                # New allocations while the old ones are alive, so the round gets other addresses.
                fresh = _clone(buffers)
                buffers[:] = fresh
                del fresh
                rounds += 1
            load_fresh_inputs(sample + warm_calls)
            pristine = _clone(buffers)
            for which in (("ref", "cand") if sample % 2 == 0 else ("cand", "ref")):
                if which == "ref":
                    ref_out, r_ms, r_wall = self._timed(call_ref, flush)
                    restore(pristine)  # the reference may legitimately work in place
                else:
                    cand_out, c_ms, c_wall = self._timed(call_cand, flush)
                    _reject_mutated_inputs(pristine, buffers, f"during timed call {sample}")
            ref_ms.append(r_ms)
            ref_wall.append(r_wall)
            cand_ms.append(c_ms)
            cand_wall.append(c_wall)
            ratios.append(r_ms / c_ms if c_ms > 0 else math.inf)
            if recheck:
                comparison = compare_outputs(ref_out, cand_out, (self.policy_tolerance,))
                if not comparison.passes[self.policy_tolerance]:
                    raise Rejection(Status.DECEPTIVE, "timed_output_mismatch",
                                    f"timed call {sample} on fresh inputs returned a wrong result (max abs diff "
                                    f"{comparison.max_abs_diff:.3e}): a cache or phase-dependent behaviour", "anti_gaming")
            del ref_out, cand_out, pristine
            sample += 1
            if sample >= cfg.timing_samples and sample % cfg.timing_round_samples == 0:
                low, high = median_interval(ratios)
                precise = (high - low) / 2 <= cfg.timing_target_precision * statistics.median(ratios)
                out_of_time = self._perf_counter() - timing_start > cfg.timing_budget_s
                if precise or out_of_time or sample >= cfg.timing_max_samples:
                    break
        self.guard.check("during timing")
        ref_stats, cand_stats = timing_stats(ref_ms), timing_stats(cand_ms)
        cand_wall_med, ref_wall_med = statistics.median(cand_wall), statistics.median(ref_wall)
        speedup = statistics.median(ratios)  # (low, high): the interval the stopping rule computed last
        j.fields.update(reference_timing=ref_stats, candidate_timing=cand_stats,
                        speedup=speedup if math.isfinite(speedup) else None)
        j.fields.setdefault("provenance", {}).update(
            launch_floor_ms=floor_ms, reference_wall_median_ms=ref_wall_med, candidate_wall_median_ms=cand_wall_med,
            timing_inputs=("a fresh get_inputs() draw on the GPU for every call" if draws_on_device else
                           f"{cfg.timing_input_sets} stored input sets, rows re-permuted for every call"),
            speedup_ci95=[low, high], speedup_of_medians=(ref_stats.median_ms / cand_stats.median_ms
                                                           if cand_stats.median_ms > 0 else None),
            timing_pairs=sample, timing_rounds=rounds)
        # Work on a side stream or thread is invisible to the events but not to a device-wide sync.
        ref_excess = max(ref_wall_med - ref_stats.median_ms, 0.0)
        cand_excess = cand_wall_med - cand_stats.median_ms
        if cand_excess > max(1.0 * cand_stats.median_ms, 0.05) + 2 * ref_excess:
            raise Rejection(Status.DECEPTIVE, "work_outside_timed_stream",
                            f"wall clock to device sync {cand_wall_med:.3f} ms vs {cand_stats.median_ms:.3f} ms on the "
                            "timed stream: work escapes the timer", "anti_gaming")
        if ref_stats.median_ms < cfg.overhead_floor_multiple * floor_ms:
            j.flag("overhead_dominated")

    def _baseline_callable(self, name: str, inputs: list[Any]) -> Callable[[], Any]:
        """The reference's forward on `inputs` as the named faster baseline, warmed up and ready to time."""
        if name == "compile":
            from torch._inductor import config as inductor_config

            inductor_config.compile_threads = 1  # no compile-worker pool inside the sandboxed worker
            compiled = torch.compile(self.ref_model)

            def call() -> Any:
                with torch.no_grad():
                    return compiled(*inputs)
        elif name == "cuda_graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(3):  # warm-up on a side stream, as capture requires
                    self.ref_model(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                self.ref_model(*inputs)
            call = graph.replay
        else:
            raise ValueError(f"unknown baseline {name!r}")
        for _ in range(3):
            call()
        self._synchronize()
        return call

    def run_extra_baselines(self) -> None:
        """Time the reference as each of config.extra_baselines (CUDA graph, torch.compile) on one fresh input set,
        L2 flushed, the eager timing's sample count; speedup = that median / the candidate's eager-run median (a
        ratio of medians, not paired). Runs after every check on the candidate, which is not called here; a baseline
        that cannot be built for this reference is recorded with its error and changes nothing else."""
        cfg, j = self.config, self.judgement
        candidate_ms = j.fields["candidate_timing"].median_ms
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        inputs = self._inputs(cfg.seed + 3000)
        results: dict[str, Any] = {}
        for name in cfg.extra_baselines:
            try:
                call = self._baseline_callable(name, inputs)
                times = [self._timed(call, flush)[1] for _ in range(cfg.timing_samples)]
            except Exception as exc:  # noqa: BLE001 - e.g. a reference torch.compile or graph capture cannot handle
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            median_ms = statistics.median(times)
            results[name] = {"median_ms": median_ms, "n": len(times),
                             "speedup": median_ms / candidate_ms if candidate_ms > 0 else None}
        j.fields["baseline_speedups"] = results

    def run(self, *, with_timing: bool = True) -> Judgement:
        try:
            self._build_models()
            self.run_correctness()
            self.run_profiler_check()
            if with_timing:
                try:
                    self.run_timing()
                except Rejection:
                    raise
                except Exception as exc:  # noqa: BLE001 - candidate code failing while timed is its runtime error
                    raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000],
                                    "timing") from exc
                if self.config.extra_baselines:
                    self.run_extra_baselines()
        except Rejection as rejection:
            self.judgement.status = rejection.status
            self.judgement.reasons.append(rejection.reason)
        return self.judgement
