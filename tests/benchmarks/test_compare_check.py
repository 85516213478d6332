"""benchmarks/compare_check.py on the CPU: both ways agree on honest and wrong outputs and are timed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("compare_check", ROOT / "benchmarks" / "compare_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_ways_are_timed_on_the_same_outputs():
    row = _load().measure(torch.device("cpu"), 1, torch.bfloat16, repeats=2)
    assert row["dtype"] == "bfloat16" and row["elements"] == 2**19
    assert row["quick_ms"] > 0 and row["float64_ms"] > 0
    assert abs(row["ratio"] - row["float64_ms"] / row["quick_ms"]) < 0.02 * row["ratio"] + 0.01
