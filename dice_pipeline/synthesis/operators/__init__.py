"""Synthetic operator families: KernelBench-style reference tasks (level-1 and level-2 style) with a real custom
CUDA kernel each, generated deterministically for a seed in varied shapes, names, docstrings and kernel styles.
The `synthetic_operator_pairs` asset verifies them like every other pair; CuKe takes them with source `synthetic`.
Standard library only (no torch at import).
"""

from dice_pipeline.synthesis.operators.catalogue import (
    FAMILIES,
    GENERATOR_VERSION,
    HELD_OUT_FAMILIES,
    TRAINING_FAMILIES,
    build_instance,
    family_split,
    generate_operator_instances,
    is_held_out,
    operator_family,
)
from dice_pipeline.synthesis.operators.common import SPLIT_HELD_OUT, SPLIT_TRAIN, OperatorInstance

__all__ = [
    "FAMILIES",
    "GENERATOR_VERSION",
    "HELD_OUT_FAMILIES",
    "SPLIT_HELD_OUT",
    "SPLIT_TRAIN",
    "TRAINING_FAMILIES",
    "OperatorInstance",
    "build_instance",
    "family_split",
    "generate_operator_instances",
    "is_held_out",
    "operator_family",
]
