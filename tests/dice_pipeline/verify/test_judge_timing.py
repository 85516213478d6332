"""The judge's timing on the CPU (judge/timing.py, judge/baselines.py): the statistics timing stops on, the warm-up,
the timed loop with wall-clock events, which parts hold the GPU alone, inputs written to while timed, and the extra
baselines. A timed call's wrong output is test_timed_mismatch.py's."""

from __future__ import annotations

import random
import time

import pytest
import torch
from cpu_judge import (HONEST_DOUBLING, RecordingShare, WallClockEvent, cpu_judge, module,
                       timing_judge)

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.judge import CandidateJudge
from dice_pipeline.verify.judge.timing import median_interval, timing_stats, warm_up
from dice_pipeline.verify.verdict import Status
from dice_pipeline.verify.gpu_share import GpuShareClient


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_median_interval_brackets_the_median_and_narrows(n):
    rng = random.Random(n)
    values = [1.0 + rng.gauss(0, 0.05) for _ in range(n)]
    low, high = median_interval(values)
    median = sorted(values)[n // 2]
    assert low <= median <= high

def test_median_interval_covers_the_true_median_about_95_percent():
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        values = [rng.expovariate(1.0) for _ in range(100)]  # skewed, true median ln 2
        low, high = median_interval(values)
        covered += low <= 0.6931 <= high
    assert 0.90 <= covered / 400 <= 0.99

def test_median_interval_width_shrinks_with_samples():
    rng = random.Random(1)
    pool = [rng.gauss(1.0, 0.05) for _ in range(4000)]
    widths = [(lambda lo_hi: lo_hi[1] - lo_hi[0])(median_interval(pool[:n])) for n in (100, 400, 1600)]
    assert widths[0] > widths[1] > widths[2]

def test_timing_stats_fields():
    stats = timing_stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats.median_ms == 3.0 and stats.n == 5 and stats.iqr_ms > 0 and stats.cv > 0

class _PairClock:
    """Pair times from a list (repeating its last one), each pair taking `step` seconds of a fake clock."""

    def __init__(self, times_ms: list[float], step: float = 0.0625):  # a binary fraction: exact sums
        self.times, self.step, self.now, self.calls = times_ms, step, 0.0, 0

    def pair(self) -> float:
        self.now += self.step
        self.calls += 1
        return self.times[min(self.calls, len(self.times)) - 1]

    def clock(self) -> float:
        return self.now

def test_warm_up_stops_once_warm_but_not_before_its_minimum():
    busy = _PairClock([1.0])  # a device already warm: steady from the first pair
    assert warm_up(busy.pair, 0.5, 1.0, busy.clock) == (8, True)  # held to the 0.5 s minimum
    quick = _PairClock([1.0])
    assert warm_up(quick.pair, 0.0, 1.0, quick.clock) == (6, True)  # two windows of three

def test_warm_up_waits_while_clocks_climb_and_gives_up_at_its_maximum():
    climbing = _PairClock([3.0, 2.8, 2.6, 2.3, 2.0, 1.7, 1.5, 1.3, 1.15, 1.05, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    pairs, steady = warm_up(climbing.pair, 0.0, 2.0, climbing.clock)
    assert steady and pairs >= 13  # not before the last window of falling times has passed
    jumpy = _PairClock([1.0, 2.0] * 100)  # never two windows alike: warms for the maximum, then goes on
    pairs, steady = warm_up(jumpy.pair, 0.0, 1.0, jumpy.clock)
    assert not steady and pairs == 16
    slow = _PairClock([500.0], step=1.0)  # a pair slower than the whole budget: still three pairs
    assert warm_up(slow.pair, 0.1, 0.5, slow.clock) == (3, False)
    fixed = _PairClock([1.0])  # minimum = maximum: the fixed warm-up of before
    assert warm_up(fixed.pair, 1.0, 1.0, fixed.clock) == (16, True)

def test_the_timing_loop_runs_on_the_cpu_and_says_where_its_time_went(refuse_nested_phases):
    judge = refuse_nested_phases(cpu_judge(HONEST_DOUBLING, timing_samples=12, timing_max_samples=12, timing_round_samples=4,
                                        l2_flush_mb=1, warmup_seconds=0.0))
    judge._event = WallClockEvent
    judgement = judge.run()
    assert judgement.status == Status.CORRECT, judgement.reasons
    provenance = judgement.fields["provenance"]
    assert provenance["timing_pairs"] == 12 and provenance["timing_rounds"] == 3
    assert provenance["warmup_pairs"] >= 3 and isinstance(provenance["warmup_steady"], bool)
    assert judgement.fields["speedup_gpu"] > 0 and judgement.fields["speedup_host"] > 0
    split = provenance["timing_split_s"]
    assert set(split) == {"launch_floors", "warmup", "pairs"} and all(s >= 0 for s in split.values())
    # the split is part of the timing phase's wall time; the set-up before it is a phase of its own
    assert sum(split.values()) <= provenance["phase_seconds"]["timing"] + 1e-3
    assert provenance["phase_seconds"]["timing_setup"] >= 0

def test_the_wait_for_the_gpu_is_kept_apart_from_the_timed_section_s_seconds():
    """With several lanes, a timed section first waits for the other lanes' timed work: phase_seconds keeps that
    wait apart (`gpu_wait_for_timing`), so `timing` is this judgement's own time."""
    import time as _time

    from dice_pipeline.gpu_pool import SharedGpu
    from dice_pipeline.verify.gpu_share import GpuShareClient

    class SlowGate(GpuShareClient):
        def _ask(self, mode: str) -> None:
            if mode == SharedGpu.EXCLUSIVE:
                _time.sleep(0.3)  # another lane's timed section
            self.mode = mode

    judge = cpu_judge(None)
    judge.gpu_share = SlowGate(None)
    judge.gpu_share.start()
    with judge.alone("timing"):
        _time.sleep(0.05)
    assert judge.phase_seconds["gpu_wait_for_timing"] >= 0.3
    assert 0.05 <= judge.phase_seconds["timing"] < 0.3
    assert judge.gpu_share.mode == SharedGpu.SHARED  # shared again after the section

def test_the_timing_set_up_runs_beside_other_lanes_and_only_the_timed_pairs_have_the_gpu_alone():
    judge = timing_judge()
    share = judge.gpu_share
    seen: list[tuple[str, bool]] = []
    setup, timed = judge._timing_setup, judge._run_timed_pairs
    judge._timing_setup = lambda: (seen.append(("setup", share.alone)), setup())[1]
    judge._run_timed_pairs = lambda *a: (seen.append(("pairs", share.alone)), timed(*a))[1]
    assert judge.run().status == Status.CORRECT
    assert seen == [("setup", False), ("pairs", True)]
    phases = judge.judgement.fields["provenance"]["phase_seconds"]
    assert {"timing_setup", "gpu_wait_for_timing", "timing"} <= set(phases)

def test_the_dispatcher_is_read_once_a_judgement_after_the_gpu_is_given_back(monkeypatch):
    # The read is 0.06 s of CPU work: inside the timed section, every other lane's timed section would wait for it.
    from dice_pipeline.verify.judge import DispatcherSnapshot

    reads: list[bool] = []
    real = DispatcherSnapshot.overrides
    holder: dict[str, CandidateJudge] = {}

    def recorded(self):
        reads.append(holder["judge"].gpu_share.alone)
        return real(self)

    monkeypatch.setattr(DispatcherSnapshot, "overrides", recorded)  # before the guard takes its snapshot
    holder["judge"] = judge = timing_judge()
    assert judge.run().status == Status.CORRECT
    assert reads == [False]
    holder["judge"] = correctness_only = cpu_judge(HONEST_DOUBLING)  # the RL reward's judgement: read after the trials
    correctness_only.gpu_share = RecordingShare()
    assert correctness_only.run(with_timing=False).status == Status.CORRECT
    assert reads == [False, False]

# Correct on every call the correctness trials make, then it starts writing into its input: only timed calls see it.
MUTATES_WHEN_TIMED = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        ModelNew.calls += 1
        out = x + x
        if ModelNew.calls > 15:  # 10 correctness calls and 3 warm-up pairs come first (4 timed pairs here)
            x.zero_()
        return out
"""

def test_a_candidate_that_writes_into_its_inputs_only_when_timed_is_caught_with_fresh_draws():
    judge = timing_judge()
    judge.candidate = module("candidate_module", MUTATES_WHEN_TIMED)
    judgement = judge.run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[0].code == "mutated_inputs", judgement.reasons
    assert "during timed call" in judgement.reasons[0].message

def test_a_task_that_hands_back_the_same_input_tensor_still_gets_a_pristine_copy():
    # get_inputs() caching its tensor: the fresh draw is the timing buffer itself, so the draw cannot be the
    # pristine copy; a clone is, and a candidate writing into its input is still caught.
    judge = timing_judge()
    cached = torch.rand(64, 32)
    judge.reference.get_inputs = lambda: [cached]
    judge.candidate = module("candidate_module", MUTATES_WHEN_TIMED)
    judgement = judge.run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[0].code == "mutated_inputs", judgement.reasons
    assert "during timed call" in judgement.reasons[0].message

def test_the_timed_section_gives_the_gpu_up_when_it_is_the_judgements_last_gpu_work():
    judge = timing_judge()  # release_gpu_after_timing on by default, no extra baselines after the timing
    assert judge.run().status == Status.CORRECT and judge.gpu_share.released_after == [True]
    held = timing_judge(release_gpu_after_timing=False)
    assert held.run().status == Status.CORRECT and held.gpu_share.released_after == [False]
    followed = timing_judge(extra_baselines=["cuda_graph"])  # baselines timed after it: the hold goes on
    followed.run_extra_baselines = lambda: None  # (they need CUDA graphs: GPU tests cover them)
    assert followed.run().status == Status.CORRECT and followed.gpu_share.released_after == [False]

def _judge_without_gpu(model, baselines, timed_ms: float) -> CandidateJudge:
    """A CandidateJudge with only what run_extra_baselines touches, on the CPU, its timer replaced by a fixed one."""
    from dice_pipeline.verify.judge import Judgement

    judge = CandidateJudge.__new__(CandidateJudge)
    judge.ref_model, judge.device = model, torch.device("cpu")
    judge.config = VerifyConfig(extra_baselines=baselines, timing_samples=5, l2_flush_mb=1)
    judge.judgement = Judgement(fields={"candidate_timing": timing_stats([2.0] * 5)})
    judge._synchronize = lambda: None
    judge._event = lambda enable_timing: None
    judge._perf_counter, judge.phase_seconds = time.perf_counter, {}
    judge._inputs = lambda seed: [torch.randn(8, 8)]
    judge.outputs = []
    judge.gpu_share = GpuShareClient(None)  # one lane: the modes are still tracked
    judge.gpu_share.start()
    judge.timed_modes = []

    def timed(fn, flush, start, end):
        judge.timed_modes.append(judge.gpu_share.mode)
        judge.outputs.append(fn())
        return None, timed_ms

    judge._timed_gpu = timed
    return judge

@pytest.mark.slow
def test_extra_baselines_record_a_speedup_or_the_error_and_nothing_else(refuse_nested_phases):
    # On this CPU machine torch.compile works (inductor's C++ backend) and a CUDA graph cannot be captured.
    judge = refuse_nested_phases(_judge_without_gpu(torch.nn.ReLU(), ("compile", "cuda_graph"), timed_ms=1.0))
    judge.run_extra_baselines()
    # set-up and the timed section apart, each counted once
    assert set(judge.phase_seconds) == {"extra_baselines_prepare", "gpu_wait_for_extra_baselines_timing",
                                        "extra_baselines_timing"}
    results = judge.judgement.fields["baseline_speedups"]
    # 1.0 ms baseline / 2.0 ms candidate, timed in the verifier's convention (gpu by default)
    assert results["compile"] == {"median_ms": 1.0, "n": 5, "convention": "gpu", "speedup": 0.5}
    assert set(results["cuda_graph"]) == {"error"} and results["cuda_graph"]["error"]
    # The compiled reference really ran and computed the reference's result.
    assert all(torch.equal(out, torch.relu(out)) for out in judge.outputs)
    assert judge.judgement.status == Status.CORRECT and not judge.judgement.reasons
    # Timed with the GPU to itself (other lanes wait), compiled and warmed while sharing it.
    assert judge.timed_modes == ["exclusive"] * 5 and judge.gpu_share.mode == "shared"
