"""Candidate outputs against the reference's: allclose at every tolerance the verdict records, chunk by chunk in
float64 (a full-size KernelBench output does not fit beside float64 copies of itself), quick tests in the outputs'
own precision for the timed calls' re-check, the run-to-run consistency tolerance, and the null outputs (zeros, a
constant) that decide whether a task is degenerate and what a candidate on one must beat (NullOutputCheck)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dice_pipeline.verify.judge.tensors import flatten_outputs

# Elements compared at a time: float64 temporaries of one chunk stay at 128 MB, whatever the output's size (a
# full-size KernelBench output is 4 GiB of fp32; whole-tensor float64 temporaries of it do not fit beside it).
COMPARE_CHUNK_ELEMENTS = 1 << 24


def relative_error(squared_error: float, squared_reference: float) -> float:
    """sqrt(squared_error / squared_reference): 0 for an exact answer to an all-zero reference, inf for any other."""
    if squared_reference > 0:
        return math.sqrt(squared_error / squared_reference)
    return 0.0 if squared_error == 0 else math.inf


@dataclass
class Comparison:
    """Candidate vs reference outputs of one call."""

    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    passes: dict[float, bool] = field(default_factory=dict)  # tolerance -> allclose over every output
    problem: tuple[str, str] | None = None  # (reason code, message) when the outputs cannot match at all
    unwritten_elements: int = 0  # NaN (our poison) where the reference is finite
    dtype_names: list[str] = field(default_factory=list)
    # Sums of squares over the floating-point leaves (with statistics only): the norm-based relative error.
    squared_error: float = 0.0
    squared_reference: float = 0.0

    @property
    def relative_error(self) -> float:
        """||candidate - reference|| / ||reference|| over every floating-point output (2-norm, float64): what a
        null output cannot fake on a degenerate task (see NullOutputCheck)."""
        return relative_error(self.squared_error, self.squared_reference)


def compare_outputs(reference: Any, candidate: Any, tolerances: tuple[float, ...],
                    chunk: int = COMPARE_CHUNK_ELEMENTS, *, stats: bool = True, quick: bool = True) -> Comparison:
    """Compare every output leaf; any structural problem (count, type, shape, dtype) fails every tolerance.
    `stats=False` decides `passes` alone, exactly as with stats (the same float64 allclose per chunk) but with
    one device sync per leaf and none of the statistics (max/mean difference, unwritten elements stay 0): the
    check made on every timed call, where a full-size output is compared dozens of times. There quick tests in
    the outputs' own precision vouch for leaves that pass by a margin (`_within_absolute`, then `_surely_close`);
    `quick=False` leaves every decision to the float64 comparison (the same answers, slower:
    benchmarks/compare_check.py)."""
    result = _compare_leaves(reference, candidate, tolerances, chunk, stats=stats, quick=quick)
    if result.problem is not None:
        result.passes = {tol: False for tol in tolerances}
    return result


def relative_error_of(reference: Any, candidate: Any, chunk: int = COMPARE_CHUNK_ELEMENTS) -> float:
    """||candidate - reference|| / ||reference|| over the floating-point output leaves (float64, chunk by chunk): the
    timed calls' relative check on a degenerate task (compare_outputs gives it with statistics). NaN in both counts
    as equal, as in allclose(equal_nan=True); inf where the outputs cannot be compared leaf by leaf."""
    ref_leaves, cand_leaves = flatten_outputs(reference), flatten_outputs(candidate)
    if len(ref_leaves) != len(cand_leaves):
        return math.inf
    squared_error = squared_reference = 0.0
    for ref, cand in zip(ref_leaves, cand_leaves):
        if not (isinstance(ref, torch.Tensor) and ref.is_floating_point()):
            continue
        if not isinstance(cand, torch.Tensor) or cand.shape != ref.shape:
            return math.inf
        for ref_chunk, cand_chunk in _paired_chunks(ref, cand, chunk):
            r, c = ref_chunk.double(), cand_chunk.double()
            difference = torch.where(torch.isnan(r) & torch.isnan(c), torch.zeros_like(r), c - r).nan_to_num(
                nan=math.inf)
            squared_error += float(VECTOR_NORM(difference)) ** 2
            squared_reference += float(VECTOR_NORM(r.nan_to_num(nan=0.0))) ** 2
    return relative_error(squared_error, squared_reference)


def _flat_chunks(tensor: torch.Tensor, chunk: int, *, by_rows: bool = False):
    """Consecutive flat pieces of `tensor` (row-major order) of at most about `chunk` elements, without a
    whole-tensor copy: views of a contiguous tensor, else (or with `by_rows`) slices along the first dimension."""
    if tensor.dim() == 0:
        yield tensor.reshape(1)
        return
    if tensor.is_contiguous() and not by_rows:
        flat = tensor.view(-1)
        for start in range(0, flat.numel(), chunk):
            yield flat[start:start + chunk]
        return
    rows = max(1, chunk // max(1, tensor[0].numel()))
    for start in range(0, tensor.shape[0], rows):
        yield tensor[start:start + rows].reshape(-1)


def _paired_chunks(ref: torch.Tensor, cand: torch.Tensor, chunk: int):
    """The same pieces of two tensors of one shape: flat views where both are contiguous, else row slices of
    both (a transposed reference output against a contiguous candidate one must still line up)."""
    by_rows = not (ref.is_contiguous() and cand.is_contiguous())
    return zip(_flat_chunks(ref, chunk, by_rows=by_rows), _flat_chunks(cand, chunk, by_rows=by_rows))


# Relative margin of the quick pass test: far above the rounding of its float32 arithmetic (a few 2**-24), far below
# any tolerance, so an element it passes is one the float64 comparison passes too.
SURELY_CLOSE_MARGIN = 2.0**-20
_QUICK_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _surely_close(ref: torch.Tensor, cand: torch.Tensor, tol: float) -> torch.Tensor:
    """A 0-dim bool on the device: True only if every element passes torch.isclose(atol=rtol=tol) in float64.
    In the outputs' own precision (float32 for half types), in place: about a third of the float64 comparison's
    memory traffic. It errs only towards False (NaN, infinities, values within the margin of the tolerance, a
    float32 overflow), where the caller decides with the float64 comparison."""
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    r, c = ref.to(work), cand.to(work)  # neither is written to: each op below makes its own tensor first
    error = torch.sub(c, r).abs_()
    scale = tol * (1 - SURELY_CLOSE_MARGIN)
    # |r| capped at the largest finite value: an infinite reference allows no infinite error (inf <= inf holds);
    # with tol < 1 nothing else can overflow.
    allowed = r.abs().clamp_(max=torch.finfo(work).max).mul_(scale).add_(scale)
    return torch.le(error, allowed).all()


_ABSOLUTE_DTYPES = (torch.float32, torch.float64)
VECTOR_NORM = torch.linalg.vector_norm  # taken at import, before any candidate code (RuntimeGuard guards it too)


def _within_absolute(ref: torch.Tensor, cand: torch.Tensor, tol: float) -> torch.Tensor:
    """A 0-dim bool on the device: True only if every element of a float32/float64 pair differs by at most
    tol (less the margin), which passes torch.isclose(atol=rtol=tol) in float64 whatever |ref| is (the allowed error
    is tol * (1 + |ref|) >= tol). Two passes (the difference, its largest magnitude), a quarter of `_surely_close`'s
    memory traffic: the first test on every timed call. The difference in the outputs' own precision is off by at
    most 2**-24 of itself for float32, far inside the margin. NaN or an infinity anywhere gives False."""
    if ref.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=ref.device)
    largest = VECTOR_NORM(torch.sub(cand, ref), float("inf"))
    return torch.le(largest, tol * (1 - SURELY_CLOSE_MARGIN))


def _tensor_passes(ref: torch.Tensor, cand: torch.Tensor, tolerances: tuple[float, ...], result: Comparison,
                   chunk: int, quick: bool = True) -> None:
    """`result.passes` for one output leaf: torch.allclose in float64 chunk by chunk, folded on the device. Quick
    tests in the outputs' own precision come first (one sync each): every difference within tol (float32/64), else
    every element within tol of its own reference value; only where neither can vouch for every element does the
    float64 comparison decide (so the answer is always the float64 one)."""
    def every_chunk(test: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
        folded: torch.Tensor | None = None
        for ref_chunk, cand_chunk in _paired_chunks(ref, cand, chunk):
            close = test(ref_chunk, cand_chunk)
            folded = close if folded is None else folded & close
        return True if folded is None else bool(folded)

    quick_tests = [test for dtypes, test in ((_ABSOLUTE_DTYPES, _within_absolute), (_QUICK_DTYPES, _surely_close))
                   if quick and ref.dtype in dtypes]
    for tol in tolerances:
        if not result.passes[tol]:
            continue
        if 0 < tol < 1 and any(every_chunk(functools.partial(test, tol=tol)) for test in quick_tests):
            continue
        result.passes[tol] = every_chunk(
            lambda r, c: torch.isclose(c.double(), r.double(), atol=tol, rtol=tol, equal_nan=True).all())  # noqa: B023


def _compare_tensor(ref: torch.Tensor, cand: torch.Tensor, tolerances: tuple[float, ...], result: Comparison,
                    chunk: int) -> tuple[float, int]:
    """Fold one output leaf into `result` chunk by chunk (max diff, unwritten count, allclose per tolerance);
    returns (sum of finite absolute differences, element count) for the mean."""
    total_abs, total_count = 0.0, 0
    for ref_chunk, cand_chunk in _paired_chunks(ref, cand, chunk):
        ref_f, cand_f = ref_chunk.double(), cand_chunk.double()
        result.unwritten_elements += int((torch.isnan(cand_f) & torch.isfinite(ref_f)).sum())
        diff = (ref_f - cand_f).abs().nan_to_num(nan=math.inf)
        diff = torch.where(torch.isnan(ref_f) & torch.isnan(cand_f), torch.zeros_like(diff), diff)
        if diff.numel():
            result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
            finite = torch.isfinite(diff)
            total_abs += float(torch.where(finite, diff, torch.zeros_like(diff)).sum())
            total_count += diff.numel()
        if ref.is_floating_point():
            result.squared_error += float(diff.square().sum())
            result.squared_reference += float(ref_f.nan_to_num(nan=0.0).square().sum())
        for tol in tolerances:
            if result.passes[tol]:
                result.passes[tol] = bool(torch.allclose(cand_f, ref_f, atol=tol, rtol=tol, equal_nan=True))
        del ref_f, cand_f, diff
    return total_abs, total_count


def _compare_leaves(reference: Any, candidate: Any, tolerances: tuple[float, ...],
                    chunk: int = COMPARE_CHUNK_ELEMENTS, *, stats: bool = True, quick: bool = True) -> Comparison:
    ref_leaves, cand_leaves = flatten_outputs(reference), flatten_outputs(candidate)
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
        if not stats:
            _tensor_passes(ref, cand, tolerances, result, chunk, quick)
            continue
        leaf_abs, leaf_count = _compare_tensor(ref, cand, tolerances, result, chunk)
        total_abs += leaf_abs
        total_count += leaf_count
    result.mean_abs_diff = total_abs / total_count if total_count else 0.0
    return result


def consistency_tolerance(dtype_name: str, policy_tolerance: float, ratio: float) -> float:
    """atol=rtol two runs of the candidate on identical inputs must agree to: far tighter than the correctness
    tolerance, but never below a few units of the dtype's precision (atomics change the order of a sum)."""
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}.get(dtype_name, 2.0**-23)
    return max(policy_tolerance * ratio, 4 * eps)



# --- null outputs: degenerate tasks ---------------------------------------------------------------------------------
@dataclass
class NullOutputs:
    """What the null outputs (all zeros; one fixed value per floating-point output leaf) do against one reference
    output: whether each passes the tolerance, and its relative error ||reference - null|| / ||reference||."""

    zeros_pass: bool
    constant_pass: bool
    zeros_error: float = math.inf
    constant_error: float = math.inf


def null_outputs(reference: Any, constants: list[float], tol: float,
                 chunk: int = COMPARE_CHUNK_ELEMENTS) -> NullOutputs:
    """Would all-zeros pass this output? Would a fixed value per output leaf pass it? (degenerate-task detection)
    And how far is each from it, relatively (what a candidate on a degenerate task must beat)?

    `constants` are one value per floating-point leaf, taken from the first trial (its mean) and reused for every
    later trial: a task is degenerate when one input-independent answer passes all trials, not merely when each
    output is constant within a trial (a scalar output always is). Chunked, like the comparison. Where neither
    passes, the task is not degenerate and the errors are left at inf (not computed)."""
    zeros_pass = constant_pass = True
    squared_reference = squared_constant = 0.0
    leaves = [ref for ref in flatten_outputs(reference)
              if isinstance(ref, torch.Tensor) and ref.is_floating_point() and ref.numel() > 0]
    if not constants:
        for ref in leaves:
            total = sum(float(piece.double().sum()) for piece in _flat_chunks(ref, chunk))
            constants.append(total / ref.numel())
    for ref, constant in zip(leaves, constants):
        for piece in _flat_chunks(ref, chunk):
            ref_f = piece.double()
            zeros_pass = zeros_pass and bool(torch.allclose(torch.zeros_like(ref_f), ref_f, atol=tol, rtol=tol))
            constant_pass = constant_pass and bool(
                torch.allclose(torch.full_like(ref_f, constant), ref_f, atol=tol, rtol=tol))
            if not (zeros_pass or constant_pass):
                return NullOutputs(False, False)
            finite = ref_f.nan_to_num(nan=0.0)
            squared_reference += float(finite.square().sum())
            squared_constant += float((finite - constant).square().sum())
    return NullOutputs(zeros_pass, constant_pass, relative_error(squared_reference, squared_reference),
                       relative_error(squared_constant, squared_reference))


# The relative error ||out - ref|| / ||ref|| an honest kernel may have against PyTorch's result in each output dtype:
# another summation order over millions of fp32 values moves a result by up to ~1e-5 of itself; half types round
# every element by 2**-11 (fp16) or 2**-8 (bf16) and accumulate further in long rows. Ten times that margin.
HONEST_RELATIVE_ERROR = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
# An honest kernel may also differ from the reference by what rounding its inputs moves the reference by (a task
# whose exact answer is 0 returns rounding noise: a mean after a normalisation): this many times that movement.
SENSITIVITY_MULTIPLE = 10.0


def honest_error_floor(dtype_names: list[str], reference_sensitivity: float) -> float:
    """The relative error below which an honest kernel cannot be expected to agree with the reference here: the
    dtype's (HONEST_RELATIVE_ERROR, the loosest of the outputs') or SENSITIVITY_MULTIPLE times the reference's own
    relative change under a one-ulp change of its inputs, whichever is larger."""
    loosest = max(HONEST_RELATIVE_ERROR.values())
    by_dtype = max(HONEST_RELATIVE_ERROR.get(name, loosest) for name in dtype_names or ["float32"])
    return max(by_dtype, SENSITIVITY_MULTIPLE * reference_sensitivity)


@dataclass
class NullOutputCheck:
    """The test a candidate on a degenerate task must pass besides allclose (which a null output passes there):
    its relative error must be at most `share` of the best relative error a null output that passes the task
    reaches (`bound`). Where that bound is below what an honest kernel can be held to (`floor`), the check cannot
    tell a kernel from a null output and decides nothing (`conclusive` False; the verdict is flagged)."""

    null_outputs: list[str]  # the null outputs that pass the task on every trial: "zeros", "constant"
    null_relative_error: float  # the best (smallest) ||ref - null|| / ||ref|| among them, over the trials
    relative_error: float  # the candidate's worst ||out - ref|| / ||ref|| over the trials (both runs)
    share: float
    floor: float
    reference_sensitivity: float

    @property
    def bound(self) -> float:
        return self.share * self.null_relative_error

    @property
    def conclusive(self) -> bool:
        return self.bound > 0 and self.bound >= self.floor

    @property
    def passed(self) -> bool:
        return not self.conclusive or self.relative_error <= self.bound

    def to_dict(self) -> dict[str, Any]:
        """For the verdict (JSON): an infinite number (the reference's noise, say) is None there."""
        def finite(value: float) -> float | None:
            return value if math.isfinite(value) else None

        return {"null_outputs": list(self.null_outputs), "null_relative_error": finite(self.null_relative_error),
                "relative_error": finite(self.relative_error), "bound": finite(self.bound),
                "floor": finite(self.floor), "reference_sensitivity": finite(self.reference_sensitivity),
                "conclusive": self.conclusive, "passed": self.passed}
