"""Output comparison (judge/compare.py): allclose chunk by chunk in float64 equals the whole-tensor answer, the quick
tests of the timed calls never pass what float64 fails, structural mismatches fail every tolerance, the consistency
tolerance, and the null outputs that make a task degenerate."""

from __future__ import annotations


import pytest
import torch

from dice_pipeline.verify.judge import compare_outputs
from dice_pipeline.verify.judge.compare import consistency_tolerance, null_outputs


def test_compare_outputs_reports_mismatch_kinds():
    ref = torch.ones(4, 4)
    assert compare_outputs(ref, ref.clone(), (1e-2, 1e-4)).passes == {1e-2: True, 1e-4: True}
    off = ref + 5e-3
    assert compare_outputs(ref, off, (1e-2, 1e-4)).passes == {1e-2: True, 1e-4: False}
    assert compare_outputs(ref, torch.ones(4, 5), (1e-2,)).problem[0] == "shape_mismatch"
    assert compare_outputs(ref, ref.double(), (1e-2,)).problem[0] == "dtype_mismatch"
    assert compare_outputs((ref, ref), ref, (1e-2,)).problem[0] == "output_structure_mismatch"
    assert compare_outputs(ref, ref.to("meta"), (1e-2,)).problem[0] == "device_mismatch"
    poisoned = ref.clone()
    poisoned[0, :2] = float("nan")
    result = compare_outputs(ref, poisoned, (1e-2,))
    assert result.unwritten_elements == 2 and not result.passes[1e-2]

@pytest.mark.parametrize("candidate", [torch.ones(4, 5), torch.ones(4, 4).double(), (torch.ones(4, 4),) * 2, 3.0])
def test_structural_mismatch_fails_every_tolerance(candidate):
    # The timed re-check looks at `passes` only: a wrong shape must never pass there.
    assert compare_outputs(torch.ones(4, 4), candidate, (1e-2, 1e-4)).passes == {1e-2: False, 1e-4: False}

@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_comparison_equals_the_whole_tensor_one(chunk):
    torch.manual_seed(0)
    ref = torch.randn(33, 17)
    cand = ref + torch.randn(33, 17) * 3e-3
    cand[3, 4] = float("nan")  # one unwritten element
    ref[5, 6] = cand[5, 6] = float("nan")  # NaN in both is equal
    ref[7, 1], cand[7, 1] = float("inf"), float("inf")
    whole = compare_outputs((ref, ref[:, :5].t()), (cand, cand[:, :5].t()), (1e-2, 1e-4), chunk=10**9)
    chunked = compare_outputs((ref, ref[:, :5].t()), (cand, cand[:, :5].t()), (1e-2, 1e-4), chunk=chunk)
    assert chunked.passes == whole.passes
    assert chunked.max_abs_diff == whole.max_abs_diff and chunked.unwritten_elements == whole.unwritten_elements == 2
    assert chunked.mean_abs_diff == pytest.approx(whole.mean_abs_diff)

def test_chunked_comparison_passes_exactly_where_allclose_does():
    torch.manual_seed(1)
    ref = torch.randn(1000)
    for scale in (1e-5, 5e-3, 2e-2):
        cand = ref + torch.randn(1000) * scale
        expected = bool(torch.allclose(cand.double(), ref.double(), atol=1e-2, rtol=1e-2))
        assert compare_outputs(ref, cand, (1e-2,), chunk=13).passes[1e-2] == expected

@pytest.mark.parametrize("chunk", [1, 13, 10**6])
def test_the_timed_calls_pass_fail_check_decides_as_the_full_comparison_does(chunk):
    # stats=False (the check on every timed call) must pass and fail exactly where the full comparison does.
    torch.manual_seed(2)
    ref = torch.randn(40, 25)
    cases = []
    for scale in (0.0, 1e-5, 5e-3, 9e-3, 2e-2, 1.0):
        cases.append(ref + torch.randn(40, 25) * scale)
    nan_unwritten = ref.clone()
    nan_unwritten[3, 3] = float("nan")
    both_nan = ref.clone()
    ref_with_nan = ref.clone()
    ref_with_nan[1, 2] = both_nan[1, 2] = float("nan")
    inf_mismatch = ref.clone()
    inf_mismatch[0, 0] = float("inf")
    for reference, candidate in [*((ref, c) for c in cases), (ref, nan_unwritten), (ref_with_nan, both_nan),
                                 (ref, inf_mismatch), (ref, ref[:, :5].t()), ((ref, ref.t()), (ref, ref.t() + 1)),
                                 ((ref, ref.t()), (ref, ref.t().contiguous())), (ref, ref.double())]:
        full = compare_outputs(reference, candidate, (1e-2, 1e-4), chunk=chunk)
        fast = compare_outputs(reference, candidate, (1e-2, 1e-4), chunk=chunk, stats=False)
        assert fast.passes == full.passes and fast.problem == full.problem
    # A transposed reference output against the same values laid out contiguously lines up chunk by chunk.
    assert compare_outputs(ref.t(), ref.t().contiguous(), (1e-4,), chunk=chunk).passes[1e-4]
    assert not compare_outputs(ref, inf_mismatch, (1e-2,), stats=False).passes[1e-2]
    assert compare_outputs(ref_with_nan, both_nan, (1e-2,), stats=False).passes[1e-2]

def _boundary_cases(dtype: torch.dtype, tol: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Reference/candidate pairs right at the tolerance and at the edges of the dtype's range."""
    info = torch.finfo(dtype)
    torch.manual_seed(3)
    ref = torch.randn(4096, dtype=torch.float64) * torch.logspace(-6, 6, 4096, dtype=torch.float64)
    cases = []
    for rel in (-0.5, -1e-3, -2.0**-18, -2.0**-22, -1e-9, 0.0, 1e-9, 2.0**-22, 2.0**-18, 1e-3, 0.5):
        # every element at (1 + rel) times the allowed error, alternating sign, in the dtype's rounding
        allowed = tol + tol * ref.abs()
        signs = torch.where(torch.arange(4096) % 2 == 0, 1.0, -1.0).double()
        cases.append((ref.to(dtype), (ref + signs * allowed * (1 + rel)).to(dtype)))
    special = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.max, -info.max, float("inf"), float("-inf"),
                            float("nan"), 1.0], dtype=dtype)
    for candidate in ([0.0, 0.0, 0.0, 0.0, info.max, -info.max, float("inf"), float("-inf"), float("nan"), 1.0],
                      [tol, -tol, 0.0, 0.0, -info.max, info.max, 1.0, float("inf"), float("nan"), 1.0],
                      [0.0, 0.0, 0.0, 0.0, info.max, -info.max, float("inf"), float("-inf"), 0.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0, info.max, -info.max, info.max, -info.max, float("nan"), 1.0 + 3 * tol]):
        cases.append((special, torch.tensor(candidate, dtype=dtype)))
    # an infinite reference against finite values, alone (no NaN beside it to fail the group anyway)
    for reference, candidate in (([float("inf"), 1.0], [1.0, 1.0]), ([float("-inf")], [-info.max]),
                                 ([info.max], [float("inf")]), ([1.0, float("inf")], [1.0, float("inf")])):
        cases.append((torch.tensor(reference, dtype=dtype), torch.tensor(candidate, dtype=dtype)))
    return cases

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tol", [1e-2, 1e-4])
def test_the_quick_pass_test_never_passes_what_the_float64_comparison_fails(dtype, tol):
    from dice_pipeline.verify.judge.compare import _surely_close

    decided = {True: 0, False: 0}
    for ref, cand in _boundary_cases(dtype, tol):
        exact = torch.isclose(cand.double(), ref.double(), atol=tol, rtol=tol, equal_nan=True)
        for i in range(0, ref.numel(), 64):  # element groups: a quick pass must be an exact pass, group by group
            quick = bool(_surely_close(ref[i:i + 64], cand[i:i + 64], tol))
            assert not quick or bool(exact[i:i + 64].all()), (dtype, tol, i)
            decided[quick] += 1
        # and the whole check answers exactly as the float64 one does
        assert compare_outputs(ref, cand, (tol,), chunk=100, stats=False).passes[tol] == bool(exact.all())
        assert ref.dtype == cand.dtype == dtype  # never converted in place
    assert decided[True] and decided[False]  # both outcomes occur: the quick test is not vacuous

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tol", [1e-2, 1e-4])
def test_the_absolute_bound_never_passes_what_the_float64_comparison_fails(dtype, tol):
    from dice_pipeline.verify.judge.compare import _within_absolute

    decided = {True: 0, False: 0}
    cases = _boundary_cases(dtype, tol)
    # differences right at tol itself, on references of every magnitude (the bound's own edge)
    ref = torch.randn(4096, dtype=torch.float64) * torch.logspace(-6, 6, 4096, dtype=torch.float64)
    for rel in (-1e-3, -2.0**-18, 0.0, 2.0**-18, 1e-3):
        cases.append((ref.to(dtype), (ref + tol * (1 + rel)).to(dtype)))
    for ref, cand in cases:
        exact = torch.isclose(cand.double(), ref.double(), atol=tol, rtol=tol, equal_nan=True)
        for i in range(0, ref.numel(), 64):
            quick = bool(_within_absolute(ref[i:i + 64], cand[i:i + 64], tol))
            assert not quick or bool(exact[i:i + 64].all()), (dtype, tol, i)
            decided[quick] += 1
    assert decided[True] and decided[False]
    assert bool(_within_absolute(torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype), tol))

def test_small_differences_are_vouched_for_in_two_passes_and_large_values_fall_through(monkeypatch):
    from dice_pipeline.verify.judge import compare

    relative_calls = []
    real = compare._surely_close
    monkeypatch.setattr(compare, "_surely_close", lambda r, c, tol: (relative_calls.append(1), real(r, c, tol))[1])
    torch.manual_seed(5)
    ref = torch.randn(256, 256)
    assert compare_outputs(ref, ref + 1e-5, (1e-2,), chunk=10_000, stats=False).passes[1e-2]
    assert not relative_calls  # the absolute bound vouched for every chunk
    large = 1e4 + ref  # values about 1e4: errors of 1 pass relatively (1e-2 * 1e4) but not absolutely
    assert compare_outputs(large, large + 1.0, (1e-2,), chunk=10_000, stats=False).passes[1e-2]
    assert relative_calls
    half = ref.half()  # half types skip the absolute bound (their own difference rounds too coarsely)
    relative_calls.clear()
    assert compare_outputs(half, half, (1e-2,), stats=False).passes[1e-2] and relative_calls

def test_the_float64_comparison_runs_only_where_the_quick_test_cannot_vouch(monkeypatch):
    calls = []
    real_isclose = torch.isclose

    def counting_isclose(*args, **kwargs):
        calls.append(1)
        return real_isclose(*args, **kwargs)

    monkeypatch.setattr(torch, "isclose", counting_isclose)
    torch.manual_seed(4)
    ref = torch.randn(64, 64)
    assert compare_outputs(ref, ref + 1e-4, (1e-2,), chunk=1000, stats=False).passes[1e-2] and not calls
    assert not compare_outputs(ref, ref + 1.0, (1e-2,), chunk=1000, stats=False).passes[1e-2] and calls
    calls.clear()
    with_nan = ref.clone()
    with_nan[0, 0] = float("nan")
    assert compare_outputs(with_nan, with_nan.clone(), (1e-2,), stats=False).passes[1e-2] and calls  # NaN == NaN

def test_consistency_tolerance_is_far_tighter_than_correctness_but_not_below_precision():
    assert consistency_tolerance("float32", 1e-2, 0.01) == pytest.approx(1e-4)
    assert consistency_tolerance("float32", 1e-4, 0.01) == pytest.approx(1e-6)
    assert consistency_tolerance("float32", 1e-6, 0.01) == pytest.approx(4 * 2.0**-23)
    assert consistency_tolerance("bfloat16", 1e-2, 0.01) == pytest.approx(4 * 2.0**-7)

def test_degenerate_means_one_fixed_answer_passes_every_trial():
    from dice_pipeline.verify.judge.compare import null_outputs

    def every_trial(outputs):
        constants: list[float] = []
        results = [null_outputs(out, constants, 1e-2) for out in outputs]
        return all(r.zeros_pass for r in results), all(r.constant_pass for r in results)

    # A scalar that moves with the inputs (a sum): not degenerate, although each output is "constant" on its own.
    assert every_trial([torch.tensor(12.5), torch.tensor(-3.0), torch.tensor(40.0)]) == (False, False)
    # A scalar that barely moves (the MSE of large random tensors): a fixed answer passes.
    assert every_trial([torch.tensor(2.0001), torch.tensor(1.9998), torch.tensor(2.0003)]) == (False, True)
    # Tiny outputs: zeros pass.
    assert every_trial([torch.full((4,), 1e-4), torch.full((4,), -2e-4)])[0]
    # Outputs that vary within a trial are not degenerate.
    assert every_trial([torch.randn(64), torch.randn(64)]) == (False, False)

def test_degenerate_detection_is_the_same_chunked():
    outputs = [torch.full((50,), 1e-4), torch.full((50,), -2e-4)]
    for chunk in (3, 10**6):
        constants: list[float] = []
        results = [null_outputs(out, constants, 1e-2, chunk=chunk) for out in outputs]
        assert all(r.zeros_pass for r in results)
