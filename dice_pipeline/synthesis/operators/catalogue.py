"""The operator-family catalogue: which families exist, which are held out of training, how many instances and
CUDA designs each draws, and `operator_family`, which names the family of any reference by the operators it runs
(used to keep held-out families out of CuKe whatever the source, and to split evaluation into seen and unseen
families). Standard library only.

Generation is deterministic for a seed: instance i of a family is drawn from a generator seeded by (seed, family,
i), and its CUDA design from the family's design list for that seed, so the same seed gives the same files in any
order or subset.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dice_pipeline.synthesis.operators import elementwise, gemm, losses_pooling, norms, reductions, scans
from dice_pipeline.synthesis.operators.common import (
    SPLIT_HELD_OUT,
    SPLIT_TRAIN,
    OperatorInstance,
    instance_rng,
    render_candidate,
    render_reference,
    short_hash,
)

BuildFn = Callable[[Any, tuple, int], dict]
GENERATOR_VERSION = "dice-operator-families-v1"


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    space: Callable[[], list[tuple]]
    build: BuildFn
    instances: int  # default instances for one seed
    designs: int  # distinct CUDA designs drawn from the space for one seed


def _unary(family: str) -> Callable[[], list[tuple]]:
    return lambda: elementwise.unary_design_space(family)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("activation", "unary activations (24 ops, parameterised ones included) in affine/residual/bias chains",
           _unary("activation"), elementwise.build_unary, 300, 60),
    Family("pointwise_math", "unary math (exp, log, sqrt, trig, powers: 18 ops) in chains", _unary("pointwise_math"),
           elementwise.build_unary, 240, 45),
    Family("binary_broadcast", "binary element-wise ops with same-shape, last-dim and per-channel broadcasting",
           elementwise.binary_design_space, elementwise.build_binary, 240, 45),
    Family("reduction", "sum/mean/max/min/prod/logsumexp over a dimension after an element-wise step",
           reductions.reduction_design_space, reductions.build_reduction, 240, 40),
    Family("arg_reduction", "argmax/argmin over a dimension of an affine transform", reductions.arg_design_space,
           reductions.build_arg_reduction, 140, 8),
    Family("vector_norm", "L1/L2/Linf norms over a dimension, and normalisation by them",
           reductions.norm_design_space, reductions.build_vector_norm, 160, 16),
    Family("softmax", "softmax and log-softmax with temperature/affine inputs", scans.softmax_design_space,
           scans.build_softmax, 200, 24),
    Family("row_norm", "LayerNorm and RMSNorm (manual, functional, module) with residuals and activations",
           norms.row_norm_design_space, norms.build_row_norm, 200, 30),
    Family("channel_norm", "batch norm (eval), instance norm and group norm with activations",
           norms.channel_norm_design_space, norms.build_channel_norm, 160, 16),
    Family("gemm_epilogue", "linear/matmul/bmm/transposed products in cuBLAS with a fused 2-4 op epilogue",
           gemm.gemm_design_space, gemm.build_gemm, 180, 40),
    Family("conv_epilogue", "Conv2d in cuDNN with a fused per-channel epilogue", gemm.conv_design_space,
           gemm.build_conv, 80, 20),
    Family("cumulative", "cumsum, cumprod, reversed and exclusive scans", scans.scan_design_space,
           scans.build_cumulative, 120, 12),
    Family("loss", "mean losses: MSE, L1, smooth L1, Huber, BCE with logits, soft margin, Poisson NLL",
           losses_pooling.loss_design_space, losses_pooling.build_loss, 120, 14),
    Family("pooling", "max/avg pooling 1D/2D with stride and padding after an element-wise step",
           losses_pooling.pool_design_space, losses_pooling.build_pool, 120, 12),
)}

# A fifth of the families (3 of 14) never enter training, so evaluation can report seen and unseen families apart.
# They map onto KernelBench level 1's pooling (41-46), cumulative (89-93) and loss (94-100) tasks.
HELD_OUT_FAMILIES = ("cumulative", "loss", "pooling")
TRAINING_FAMILIES = tuple(name for name in FAMILIES if name not in HELD_OUT_FAMILIES)


def family_split(family: str, held_out: Iterable[str] = HELD_OUT_FAMILIES) -> str:
    return SPLIT_HELD_OUT if family in set(held_out) else SPLIT_TRAIN


def _designs(family: Family, seed: int) -> list[tuple[tuple, int]]:
    """The family's CUDA designs for `seed`: (design tuple, naming variant), distinct tuples first."""
    space = list(dict.fromkeys(family.space()))
    rng = instance_rng(seed, family.name, "designs")
    rng.shuffle(space)
    chosen = space[:family.designs]
    return [(design, rng.randrange(6)) for design in chosen]


def build_instance(family_name: str, seed: int, index: int, held_out: Iterable[str] = HELD_OUT_FAMILIES
                   ) -> OperatorInstance:
    family = FAMILIES[family_name]
    designs = _designs(family, seed)
    design, naming = designs[index % len(designs)]
    piece = family.build(instance_rng(seed, family_name, index), design, naming)
    reference = render_reference(piece["spec"], piece["names"], piece["forward_reference"])
    candidate = render_candidate(piece["spec"], piece["names"], piece["design"], piece["forward_candidate"])
    return OperatorInstance(
        task_id=f"{family_name}/{piece['op']}/{short_hash(reference, candidate)}", family=family_name, op=piece["op"],
        style=piece["style"], design_id=piece["design"].design_id, split=family_split(family_name, held_out),
        seed=seed, index=index, params=piece["params"], reference_code=reference, candidate_code=candidate)


def generate_operator_instances(seed: int = 0, families: Iterable[str] | None = None,
                                counts: dict[str, int] | None = None, scale: float = 1.0,
                                held_out: Iterable[str] = HELD_OUT_FAMILIES) -> list[OperatorInstance]:
    """Every instance of the chosen families (default: all) for `seed`: `counts` overrides a family's default
    count; `scale` multiplies the defaults (0.01 for a quick smoke run; at least one instance a family)."""
    names = list(families) if families is not None else list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown operator families {unknown}; known: {sorted(FAMILIES)}")
    held = tuple(held_out)
    bad = [n for n in held if n not in FAMILIES]
    if bad:
        raise ValueError(f"held-out families {bad} are not in the catalogue")
    out = []
    for name in names:
        count = (counts or {}).get(name, max(1, round(FAMILIES[name].instances * scale)))
        out += [build_instance(name, seed, i, held) for i in range(count)]
    return out


# --- the family of any reference ------------------------------------------------------------------------------------
_ATTENTION = {"scaled_dot_product_attention", "multiheadattention", "multi_head_attention_forward"}
_RECURRENT = {"lstm", "gru", "rnn", "lstmcell", "grucell", "rnncell"}
_MATMUL = {"matmul", "mm", "bmm", "linear", "addmm", "einsum", "baddbmm", "addbmm", "matrix_power", "tensordot",
           "bilinear"}
_CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"}
_CHANNEL_NORMS = {"batch_norm", "batchnorm1d", "batchnorm2d", "batchnorm3d", "instance_norm", "instancenorm1d",
                  "instancenorm2d", "instancenorm3d", "group_norm", "groupnorm"}
_ROW_NORMS = {"layer_norm", "layernorm", "rms_norm", "rmsnorm"}
_SOFTMAX = {"softmax", "log_softmax", "softmin", "logsoftmax"}
_ARG = {"argmax", "argmin"}
_VECTOR_NORMS = {"norm", "vector_norm", "normalize", "matrix_norm"}
_REDUCTIONS = {"sum", "mean", "max", "min", "prod", "amax", "amin", "logsumexp", "var", "std", "nansum", "nanmean",
               "median", "mode", "all", "any"}
_LOSS_NAMES = {"binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "nll_loss", "kl_div",
               "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss", "triplet_margin_loss"}
_BINARY = {"maximum", "minimum", "where", "lerp", "hypot", "logaddexp", "atan2", "fmax", "fmin", "addcmul",
           "addcdiv", "copysign"}
_ACTIVATIONS = {"relu", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "softsign",
                "hardtanh", "hardsigmoid", "hardswish", "sigmoid", "tanh", "relu6", "logsigmoid", "tanhshrink",
                "softshrink", "hardshrink", "threshold", "clamp", "clip", "clamp_min", "clamp_max", "prelu", "rrelu",
                "glu", "swish"}
_ACTIVATION_LAYERS = {"relu", "leakyrelu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "softsign",
                      "hardtanh", "hardsigmoid", "hardswish", "sigmoid", "tanh", "relu6", "logsigmoid", "tanhshrink",
                      "softshrink", "hardshrink", "threshold", "prelu"}
_ARITHMETIC = {"add", "sub", "mul", "div", "pow", "floordiv", "mod", "neg", "matmul_op"}


def _forward_tensor_inputs(code: str) -> int:
    """Parameters of Model.forward besides self (0 when there is none or the file does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return max(0, len(item.args.args) - 1)
    return 0


def operator_family(code: str) -> str | None:
    """The catalogue family whose computation `code` (a KernelBench-format reference) runs, or None where no
    family covers it (attention, recurrences, unparseable code, no operator at all). First match wins, from the
    most specific operators to the most generic."""
    from dice_pipeline.cuke.ops import analyze_reference

    found = analyze_reference(code)
    if found.parse_error or not found.ops:
        return None
    ops = set(found.ops)
    if ops & _ATTENTION or ops & _RECURRENT:
        return None
    if any("conv" in op for op in ops):
        return "conv_epilogue"
    if ops & _MATMUL:
        return "gemm_epilogue"
    if any("pool" in op for op in ops):
        return "pooling"
    if ops & _LOSS_NAMES or any(op.endswith("loss") for op in ops):
        return "loss"
    if ops & _CUMULATIVE:
        return "cumulative"
    if ops & _CHANNEL_NORMS:
        return "channel_norm"
    if ops & _ROW_NORMS or ((ops & {"mean", "var"}) and (ops & {"sqrt", "rsqrt"})):
        return "row_norm"
    if ops & _SOFTMAX:
        return "softmax"
    if ops & _ARG:
        return "arg_reduction"
    if ops & _VECTOR_NORMS:
        return "vector_norm"
    if ops & _REDUCTIONS:
        return "reduction"
    if _forward_tensor_inputs(code) >= 2 or ops & _BINARY:
        return "binary_broadcast"
    if ops & _ACTIVATIONS or ops & _ACTIVATION_LAYERS:
        return "activation"
    return "pointwise_math"


def is_held_out(code: str, held_out: Iterable[str] = HELD_OUT_FAMILIES) -> bool:
    return operator_family(code) in set(held_out)


__all__ = ["FAMILIES", "GENERATOR_VERSION", "HELD_OUT_FAMILIES", "TRAINING_FAMILIES", "Family", "build_instance",
           "family_split", "generate_operator_instances", "is_held_out", "operator_family"]
