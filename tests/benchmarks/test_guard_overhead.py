"""The guard-overhead benchmark's judgement, both ways, on the CPU: the same verdict with and without the
dispatcher reads (the baseline leaves them out and nothing else), and the reads are what it says they are."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import guard_overhead  # noqa: E402


def test_both_ways_judge_the_same_candidate_correct_and_only_the_measured_way_reads_the_dispatcher(monkeypatch):
    reads = []
    real = guard_overhead.DispatcherSnapshot.overrides

    def counted(self):
        reads.append(1)
        return real(self)

    monkeypatch.setattr(guard_overhead.DispatcherSnapshot, "overrides", counted)
    assert guard_overhead.judge_once(torch.device("cpu"), dispatcher_reads=False) > 0
    assert reads == []  # the baseline's guard never reads the dispatcher
    assert guard_overhead.judge_once(torch.device("cpu"), dispatcher_reads=True) > 0
    assert reads == [1]  # a correctness judgement reads it once: after the trials
