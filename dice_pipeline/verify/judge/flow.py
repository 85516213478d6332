"""The judgement of one candidate, stage by stage: the trusted set-up (input draw, reference model, probe call),
the candidate's model, the correctness trials, the profiler pass, the timing. Each stage's machinery lives in a
module of its own (inputs, compare, profile, timing, baselines, guard); this file is the flow a reader follows.
Imports torch and the standard library only; runs inside the isolated worker (worker.py)."""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from dice_pipeline.verify.config import TOLERANCE_LOOSE, TOLERANCE_STRICT, VerifyConfig
from dice_pipeline.verify.gpu_share import GpuShareClient
from dice_pipeline.verify.judge.baselines import BaselineStage
from dice_pipeline.verify.judge.compare import (
    Comparison,
    NullOutputCheck,
    compare_outputs,
    consistency_tolerance,
    honest_error_floor,
    null_outputs,
)
from dice_pipeline.verify.judge.guard import RuntimeGuard
from dice_pipeline.verify.judge.inputs import InputDraws
from dice_pipeline.verify.judge.judgement import CandidateFailed, Judgement, Rejection, is_out_of_memory
from dice_pipeline.verify.judge.profile import ProfilerStage
from dice_pipeline.verify.judge.tensors import clone, flatten_outputs, output_bytes, reject_mutated_inputs, to_device
from dice_pipeline.verify.judge.timing import TimingStage
from dice_pipeline.verify.verdict import Status

# Earlier reference outputs kept on the GPU for the stale-output check (the newest is always kept).
STALE_CHECK_BYTES = 2 * 2**30


class CandidateJudge(InputDraws, ProfilerStage, TimingStage, BaselineStage):
    """Judges `candidate.ModelNew` against `reference.Model` on the current CUDA device.

    `control=True` judges the reference against itself (the candidate module's ModelNew is the reference's Model):
    the trusted control that measures a task's reference through the correctness and timing path, with no
    profiler pass (it has no custom kernels)."""

    def __init__(self, reference: ModuleType, candidate: ModuleType | None, config: VerifyConfig, guard: RuntimeGuard,
                 custom_kernel_names: list[str], *, control: bool = False, device: torch.device | None = None,
                 gpu_share: GpuShareClient | None = None):
        self.reference = reference
        self.candidate = candidate
        self.config = config
        self.guard = guard
        self.custom_kernel_names = tuple(custom_kernel_names)  # a tuple: the guard watches the object (watch_judge)
        self.control = control
        # A CPU device runs the correctness path only (the harness's own tests); judgements run on CUDA.
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        self.judgement = Judgement()
        self.tolerances = (TOLERANCE_LOOSE, TOLERANCE_STRICT)
        self.policy_tolerance = TOLERANCE_LOOSE
        # On a degenerate task, the relative error every output (the timed calls' too) is held to; None elsewhere.
        self.null_output_bound: float | None = None
        self.draw_on_gpu = False
        self.probe: Any = None
        self.prepared = False
        # GPU bytes one reference call needs beyond its inputs and its output (its clone of the inputs and its
        # temporaries), measured on the probe call: part of the judgement's expected peak (worker.needs_whole_gpu).
        self.reference_workspace_bytes = 0
        self._peak_floor_bytes = 0  # the allocator's peak before the probe's measurement reset it
        # Harness-owned references, taken before candidate code could patch the modules they live in.
        self._synchronize = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._event = torch.cuda.Event
        self._perf_counter = time.perf_counter
        # Other judging lanes on this GPU (VerifyConfig.gpu_lanes): timed sections ask for it alone.
        self.gpu_share = gpu_share or GpuShareClient(None)
        self.phase_seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Wall seconds of one stage of the judgement, kept in provenance["phase_seconds"] (where the time goes).
        Phases never nest, so their seconds add up to the judgement's time without counting any span twice."""
        started = self._perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[name] = round(self.phase_seconds.get(name, 0.0) + self._perf_counter() - started, 4)

    @contextlib.contextmanager
    def alone(self, name: str, *, last_gpu_use: bool = False) -> Iterator[None]:
        """The body with the GPU to this worker alone (a timed section): its wall seconds are phase `name`, the wait
        for the GPU before it is phase `gpu_wait_for_<name>` (kept apart: with several lanes that wait is the other
        lanes' timed work, not this judgement's). `last_gpu_use`: the judgement's GPU work ends with the body, so
        the GPU is given up after it (GpuShareClient.exclusive)."""
        with contextlib.ExitStack() as stack:
            with self.phase(f"gpu_wait_for_{name}"):
                stack.enter_context(self.gpu_share.exclusive(then_release=last_gpu_use))
            with self.phase(name):
                yield

    def prepare_reference(self) -> tuple[float, float]:
        """Trusted set-up before any candidate code runs: the input draw, the reference model, and one probe call.
        Returns (seconds of one input draw, seconds of one reference call), from which the run's limit is sized."""
        cfg = self.config
        try:
            self._choose_input_draw()
            init_inputs = [to_device(x, self.device) for x in self.reference.get_init_inputs()]
            self.init_inputs = init_inputs
            torch.manual_seed(cfg.seed)
            self.ref_model = self.reference.Model(*init_inputs).to(self.device)
            self.guard.watch_reference(self.reference, self.ref_model)
            self.guard.watch_judge(self, fields=("ref_model",))  # built anew after release_prepared()
        except Rejection:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken reference is reported, not raised
            if is_out_of_memory(exc):
                raise self._infrastructure("reference_out_of_memory", f"the reference's set-up ran out of memory: "
                                           f"{exc}"[:1000]) from exc
            raise Rejection(Status.RUNTIME_ERROR, "reference_failed", f"reference Model(): {exc!r}"[:2000],
                            "correctness") from exc
        self._synchronize()
        started = self._perf_counter()
        inputs = self._inputs(cfg.seed - 1)  # the probe's draw, made the chosen way, sizes the limit too
        self._synchronize()
        draw_s = self._perf_counter() - started
        measure = self.device.type == "cuda"
        if measure:
            self._peak_floor_bytes = max(self._peak_floor_bytes, torch.cuda.max_memory_allocated(self.device))
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.probe = self._call_reference(inputs, cfg.seed - 1)
        if measure:
            self.reference_workspace_bytes = max(
                0, torch.cuda.max_memory_allocated(self.device) - before - output_bytes([self.probe]))
            self.judgement.fields.setdefault("provenance", {})["reference_workspace_bytes"] = \
                self.reference_workspace_bytes
        started = self._perf_counter()
        again = self._call_reference(inputs, cfg.seed - 1)
        call_s = self._perf_counter() - started
        del inputs, again
        self.prepared = True
        return draw_s, call_s

    def release_prepared(self) -> None:
        """Give back the GPU memory the trusted set-up holds (the reference model, the probe's output, the caching
        allocator's blocks), before this judgement waits for the GPU's memory whole (worker.py).
        prepare_reference() again afterwards draws the same inputs: every draw is seeded."""
        self.ref_model = self.probe = self.init_inputs = None
        self.prepared = self.draw_on_gpu = False
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _build_candidate(self) -> None:
        if self.control:
            self.cand_model = self.ref_model
            return
        try:
            torch.manual_seed(self.config.seed)
            self.cand_model = self.candidate.ModelNew(*self.init_inputs).to(self.device)
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise self._candidate_out_of_memory(exc, "construction")
            raise Rejection(Status.RUNTIME_ERROR, "construct_failed", f"ModelNew(): {exc!r}"[:2000],
                            "correctness") from exc
        self.guard.check("while building ModelNew")

    def _infrastructure(self, code: str, message: str) -> Rejection:
        """A failure of the verifier itself: judged again once with less resident state (see api.py)."""
        rejection = Rejection(Status.INFRASTRUCTURE_ERROR, code, message, "infrastructure")
        rejection.retry_low_memory = not self.config.low_memory
        return rejection

    def _candidate_out_of_memory(self, exc: BaseException, stage: str) -> Rejection:
        """The candidate's own allocation failed. On the first attempt the verifier held full resident state, so
        it is judged once more with less of it; if it fails again there, it is the candidate's runtime error."""
        rejection = Rejection(Status.RUNTIME_ERROR, "candidate_out_of_memory",
                              f"ModelNew ran out of GPU memory ({stage}): {exc}"[:2000], stage)
        rejection.retry_low_memory = not self.config.low_memory
        return rejection

    def _call_reference(self, inputs: list[Any], seed: int) -> Any:
        torch.manual_seed(seed)  # same RNG stream for both models (dropout and friends)
        try:
            with torch.no_grad():
                out = self.ref_model(*clone(inputs))
            self._synchronize()
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise self._infrastructure("reference_out_of_memory",
                                           f"the reference ran out of GPU memory beside the verifier's state: {exc}"[:1000]) from exc
            raise Rejection(Status.RUNTIME_ERROR, "reference_failed", f"reference forward: {exc!r}"[:2000],
                            "correctness") from exc
        return out

    def _call_candidate(self, inputs: list[Any], seed: int, stage: str, given: list[Any] | None = None) -> Any:
        """One checked call of ModelNew on a copy of `inputs` (`given`, else a fresh clone): mutation check and
        guard check after it."""
        given = clone(inputs) if given is None else given
        torch.manual_seed(seed)
        try:
            with torch.no_grad():
                out = self.cand_model(*given)
            self._synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure of candidate code is its runtime error
            if is_out_of_memory(exc):
                raise self._candidate_out_of_memory(exc, stage) from exc
            raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000], stage) from exc
        reject_mutated_inputs(inputs, given, f"during a {stage} call")
        self.guard.check(f"during a ModelNew call ({stage})")
        return out

    def _poison_allocator(self, template: Any) -> None:
        """Hand the caching allocator NaN-filled blocks of every output's size, so an output that the candidate
        allocates and never writes reads back as NaN instead of a stale (possibly correct) result."""
        copies = 1 if self.config.low_memory else 2
        blocks = []
        for leaf in flatten_outputs(template):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                for _ in range(copies):
                    blocks.append(torch.full_like(leaf, float("nan")))
            elif isinstance(leaf, torch.Tensor) and not leaf.is_complex():
                fill = True if leaf.dtype == torch.bool else torch.iinfo(leaf.dtype).max
                for _ in range(copies):
                    blocks.append(torch.full_like(leaf, fill))
        self._synchronize()
        del blocks

    # -- stages ---------------------------------------------------------------------------------------------------
    def run_correctness(self) -> None:
        cfg, j = self.config, self.judgement
        comparisons: list[Comparison] = []
        passed = {tol: 0 for tol in self.tolerances}
        decided = 0
        zeros_everywhere = constant_everywhere = True
        constants: list[float] = []  # the first trial's output means: the fixed answer tried on every trial
        earlier_refs: list[Any] = []  # reference outputs of earlier trials (memory-bounded), for _reject_stale_output
        stale_bytes = 0 if cfg.low_memory else STALE_CHECK_BYTES
        worst_consistency: tuple[float, float] | None = None  # (max abs diff between two runs, tolerance)
        null_errors: list[tuple[float, float]] = []  # per trial: the relative errors of zeros and of the constant
        for trial in range(cfg.correctness_trials):
            seed = cfg.seed + trial
            inputs = self._inputs(seed)
            self._poison_allocator(earlier_refs[-1] if earlier_refs else self.probe)
            cand_before = self._call_candidate(inputs, seed, "correctness")
            ref_out = self._call_reference(inputs, seed)
            if trial == 0:
                again = self._call_reference(inputs, seed)
                if not compare_outputs(ref_out, again, (TOLERANCE_STRICT,), stats=False).passes[TOLERANCE_STRICT]:
                    j.flag("nondeterministic_reference")
                del again
            self._poison_allocator(ref_out)
            cand_after = self._call_candidate(inputs, seed, "correctness")
            del inputs
            nulls = null_outputs(ref_out, constants, TOLERANCE_LOOSE)
            zeros_everywhere &= nulls.zeros_pass
            constant_everywhere &= nulls.constant_pass
            null_errors.append((nulls.zeros_error, nulls.constant_error))
            trial_cmp = [compare_outputs(ref_out, c, self.tolerances) for c in (cand_before, cand_after)]
            comparisons.extend(trial_cmp)
            for tol in self.tolerances:
                passed[tol] += all(c.passes[tol] for c in trial_cmp)
            policy_tol = min(cfg.tolerance_for(d) for d in (trial_cmp[0].dtype_names or ["float32"]))
            for output, comparison in zip((cand_before, cand_after), trial_cmp):
                if not comparison.passes[policy_tol]:
                    self._reject_stale_output(output, ref_out, earlier_refs, trial)
            if all(c.problem is None for c in trial_cmp) and "nondeterministic_reference" not in j.flags:
                # The same inputs twice (before and after the reference ran): a race shows up as disagreement.
                tight = min(consistency_tolerance(d, policy_tol, cfg.consistency_tolerance_ratio)
                            for d in (trial_cmp[0].dtype_names or ["float32"]))
                consistency = compare_outputs(cand_before, cand_after, (tight,), stats=False)
                if not consistency.passes[tight]:  # once more with statistics, for the verdict's numbers
                    consistency = compare_outputs(cand_before, cand_after, (tight,))
                if not consistency.passes[tight] and (worst_consistency is None
                                                      or consistency.max_abs_diff > worst_consistency[0]):
                    worst_consistency = (consistency.max_abs_diff, tight)
            del cand_before, cand_after
            earlier_refs.append(ref_out)
            while len(earlier_refs) > 1 and output_bytes(earlier_refs) > stale_bytes:
                earlier_refs.pop(0)
            decided += all(c.passes[policy_tol] for c in trial_cmp)
        del earlier_refs
        self.policy_tolerance = policy_tol
        worst = next((c for c in comparisons if c.problem), None) or max(comparisons, key=lambda c: c.max_abs_diff)
        # no relative error where the outputs could not be compared at all (shape, dtype, count)
        relative = max(c.relative_error for c in comparisons) if worst.problem is None else math.inf
        j.fields.update(max_abs_diff=worst.max_abs_diff, mean_abs_diff=worst.mean_abs_diff,
                        correct_at_1e2=passed[TOLERANCE_LOOSE] == cfg.correctness_trials,
                        correct_at_1e4=passed[TOLERANCE_STRICT] == cfg.correctness_trials,
                        trials_passed=decided, trials_run=cfg.correctness_trials,
                        relative_error=relative if math.isfinite(relative) else None)
        null_check = None
        if zeros_everywhere or constant_everywhere:
            j.flag("degenerate_task")
        if (zeros_everywhere or constant_everywhere) and worst.problem is None and decided == cfg.correctness_trials:
            # A null output passes this task's tolerance: allclose cannot tell a kernel from one, the relative
            # error can (both results are in the verdict). A candidate allclose rejected needs no second test.
            kinds = [kind for kind, everywhere in (("zeros", zeros_everywhere), ("constant", constant_everywhere))
                     if everywhere]
            null_check = NullOutputCheck(
                null_outputs=kinds, relative_error=relative, share=cfg.null_output_share,
                null_relative_error=min(errors[0 if kind == "zeros" else 1] for errors in null_errors
                                        for kind in kinds),
                reference_sensitivity=(sensitivity := self._reference_sensitivity()),
                floor=honest_error_floor(worst.dtype_names, sensitivity))
            j.fields["null_output_check"] = null_check.to_dict()
            self.null_output_bound = null_check.bound if null_check.conclusive else None
            if not null_check.conclusive:
                j.flag("null_output_check_inconclusive")
        # What the timed calls are checked against from here on: set by trusted code, then watched like the rest.
        self.guard.watch_judge(self, fields=("policy_tolerance", "null_output_bound"))
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
        if null_check is not None and not null_check.passed:
            raise Rejection(Status.INCORRECT, "no_better_than_null_output",
                            f"a degenerate task ({' and '.join(null_check.null_outputs)} pass atol=rtol="
                            f"{TOLERANCE_LOOSE:g}): the output's relative error ||out - ref|| / ||ref|| is "
                            f"{null_check.relative_error:.3e}, not within {null_check.bound:.3e} ({cfg.null_output_share:g}"
                            f" of the null output's {null_check.null_relative_error:.3e})", "correctness")
        if worst_consistency is not None:
            raise Rejection(Status.INCORRECT, "nondeterministic_output",
                            f"two runs of ModelNew on the same inputs differ by up to {worst_consistency[0]:.3e} "
                            f"(allowed {worst_consistency[1]:.1e}, far inside the correctness tolerance "
                            f"{self.policy_tolerance:g}): a race between threads, not rounding", "correctness")

    def _reference_sensitivity(self) -> float:
        """The reference's relative change ||ref(x') - ref(x)|| / ||ref(x)|| when its floating-point inputs move by
        up to one unit of their precision (x' = x * (1 + eps * u), u uniform in [-1, 1)): how far rounding alone
        moves this task's answer, and so how closely an honest kernel can be held to it (honest_error_floor). A task
        whose exact answer is 0 returns rounding noise, which moves by as much as itself. Two reference calls, made
        only on degenerate tasks."""
        seed = self.config.seed
        inputs = self._inputs(seed)
        base = self._call_reference(inputs, seed)
        torch.manual_seed(seed + 7)
        nudged = [x * (1 + torch.finfo(x.dtype).eps * (2 * torch.rand_like(x) - 1))
                  if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        moved = self._call_reference(nudged, seed)
        del inputs, nudged
        sensitivity = compare_outputs(base, moved, (TOLERANCE_LOOSE,)).relative_error
        return sensitivity if math.isfinite(sensitivity) else math.inf

    @staticmethod
    def _reject_stale_output(output: Any, ref_out: Any, earlier_refs: list[Any], trial: int) -> None:
        """A wrong output that equals the reference's result for an earlier trial's inputs is a memoised result
        (a cache keyed by data pointer, shape or call count that the new inputs hit): deceptive, not a bug."""
        for index, earlier in enumerate(earlier_refs):
            if compare_outputs(earlier, ref_out, (TOLERANCE_LOOSE,), stats=False).passes[TOLERANCE_LOOSE]:
                continue  # the task's result barely depends on its inputs: no evidence either way
            if compare_outputs(earlier, output, (TOLERANCE_STRICT,), stats=False).passes[TOLERANCE_STRICT]:
                raise Rejection(Status.DECEPTIVE, "stale_output_reuse",
                                f"correctness trial {trial} returned the result for the inputs of an earlier call "
                                f"({len(earlier_refs) - index} trial(s) back): a cache not keyed by the input values",
                                "anti_gaming")

    def run(self, *, with_timing: bool = True) -> Judgement:
        try:
            try:
                stage = "correctness"
                if not self.prepared:
                    with self.phase("prepare_reference"):
                        self.prepare_reference()
                with self.phase("build_model"):
                    self._build_candidate()
                with self.phase("correctness"):
                    self.run_correctness()
                    if not with_timing:  # a correctness-only judgement (the RL reward's): the read timing makes
                        self.guard.check("during the correctness trials", thorough=True)
                if not self.control:
                    stage = "anti_gaming"
                    with self.phase("profiler"):
                        self.run_profiler_check()
                if with_timing:
                    stage = "timing"
                    # its set-up beside other lanes, then the timed pairs with the GPU alone: the judgement's last
                    # GPU work unless baselines follow (nothing after it but host-side bookkeeping)
                    self.run_timing(last_gpu_use=self.config.release_gpu_after_timing
                                    and not self.config.extra_baselines)
                    if self.config.extra_baselines:
                        self.run_extra_baselines()
            except Rejection:
                raise
            except CandidateFailed as failed:  # candidate code raised while timed: its runtime error
                cause = failed.__cause__ or failed
                if is_out_of_memory(cause):
                    raise self._candidate_out_of_memory(cause, stage) from failed
                raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", str(failed)[:2000], stage) from failed
            except Exception as exc:  # noqa: BLE001
                if is_out_of_memory(exc):  # the verifier's own allocations (inputs, clones, comparisons)
                    raise self._infrastructure("harness_out_of_memory",
                                               f"the verifier ran out of GPU memory for its own state: {exc}"[:1000]) from exc
                # Anything else after candidate code ran (e.g. a sticky CUDA fault surfacing at the next sync) is
                # the candidate's runtime error, as in verifier 0.2.
                raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000],
                                stage) from exc
        except Rejection as rejection:
            self.judgement.status = rejection.status
            self.judgement.reasons.append(rejection.reason)
            if getattr(rejection, "retry_low_memory", False):
                self.judgement.fields["retry_low_memory"] = True
        finally:
            self.judgement.fields.setdefault("provenance", {})["phase_seconds"] = dict(self.phase_seconds)
            try:
                if self.device.type == "cuda":
                    peak = max(torch.cuda.max_memory_allocated(self.device), self._peak_floor_bytes)
                    self.judgement.fields["peak_gpu_memory_mb"] = peak / 2**20
            except Exception:  # noqa: BLE001 - a poisoned context cannot report; the verdict goes on without it
                pass
        return self.judgement
