"""What a KernelBench-format reference computes, read statically from its AST: the torch operators its `forward`
methods run (module calls resolved through `__init__`, functional and tensor-method calls, arithmetic operators),
and from them an op family (for the composition table) and the features the difficulty score uses.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

# Calls that reshape, move or query tensors without computing on their values; not counted as operators.
LAYOUT_OR_QUERY = frozenset(
    {
        "size",
        "shape",
        "dim",
        "numel",
        "view",
        "reshape",
        "permute",
        "transpose",
        "contiguous",
        "unsqueeze",
        "squeeze",
        "expand",
        "expand_as",
        "flatten",
        "unflatten",
        "to",
        "float",
        "half",
        "double",
        "int",
        "long",
        "bool",
        "type",
        "cuda",
        "cpu",
        "item",
        "clone",
        "detach",
        "chunk",
        "split",
        "view_as",
        "t",
        "len",
        "range",
        "super",
        "__init__",
        "isinstance",
        "hasattr",
        "tuple",
        "list",
        "zip",
        "enumerate",
        "getattr",
        "print",
        "new_zeros",
        "new_ones",
        "new_empty",
        "zeros",
        "ones",
        "empty",
        "zeros_like",
        "ones_like",
        "empty_like",
        "arange",
        "tensor",
        "stack",
        "cat",
        "append",
        "extend",
    }
)
_BINARY_OPERATORS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.MatMult: "matmul",
    ast.Pow: "pow",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
}

CONVOLUTION = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convtranspose1d",
        "convtranspose2d",
        "convtranspose3d",
    }
)
MATMUL = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "bilinear", "tensordot"})
ATTENTION = frozenset(
    {
        "scaled_dot_product_attention",
        "multiheadattention",
        "transformer",
        "transformerencoder",
        "transformerencoderlayer",
        "transformerdecoder",
        "transformerdecoderlayer",
    }
)
RECURRENT = frozenset({"lstm", "gru", "rnn", "lstmcell", "grucell", "rnncell"})
NORMALIZATION = frozenset(
    {
        "batchnorm1d",
        "batchnorm2d",
        "batchnorm3d",
        "layernorm",
        "groupnorm",
        "instancenorm1d",
        "instancenorm2d",
        "instancenorm3d",
        "rmsnorm",
        "layer_norm",
        "batch_norm",
        "group_norm",
        "instance_norm",
        "rms_norm",
        "normalize",
        "norm",
        "localresponsenorm",
    }
)
POOLING = frozenset(
    {
        "maxpool1d",
        "maxpool2d",
        "maxpool3d",
        "avgpool1d",
        "avgpool2d",
        "avgpool3d",
        "adaptiveavgpool1d",
        "adaptiveavgpool2d",
        "adaptiveavgpool3d",
        "adaptivemaxpool2d",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool3d",
    }
)
SOFTMAX = frozenset({"softmax", "log_softmax", "logsoftmax"})
REDUCTION = frozenset(
    {
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "prod",
        "cumsum",
        "cumprod",
        "logsumexp",
        "var",
        "std",
        "all",
        "any",
    }
)
HEAVY = CONVOLUTION | MATMUL | ATTENTION | RECURRENT

# Families in priority order: the first that matches names the reference.
OP_FAMILIES = (
    "recurrent",
    "attention",
    "network",
    "convolution",
    "matmul",
    "normalization",
    "pooling",
    "softmax",
    "reduction",
    "loss",
    "elementwise",
    "other",
)


@dataclass
class ReferenceOps:
    """Operators a reference runs, by lower-cased name, counted over every `forward` in the file."""

    ops: Counter = field(default_factory=Counter)
    has_loop: bool = False  # a `for`/`while` in a forward: per-step work, recurrence or repeated blocks
    n_classes: int = 0
    parse_error: str | None = None

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    @property
    def distinct_ops(self) -> int:
        return len(self.ops)

    def count(self, names: frozenset[str]) -> int:
        return sum(n for op, n in self.ops.items() if op in names)

    @property
    def has_attention(self) -> bool:
        # Explicit attention: a softmax between two matmuls (q k^T, then times v) counts as well as SDPA/MHA.
        return self.count(ATTENTION) > 0 or (self.count(SOFTMAX) > 0 and self.count(MATMUL - {"linear"}) >= 2)

    @property
    def has_recurrence(self) -> bool:
        return self.count(RECURRENT) > 0

    @property
    def has_convolution(self) -> bool:
        return self.count(CONVOLUTION) > 0


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _module_constructors(class_node: ast.ClassDef) -> dict[str, list[str]]:
    """`self.<attr>` -> the lower-cased layer types built for it in `__init__` (several for Sequential/ModuleList).

    `nn.Sequential(*layers)` built from a list filled in a loop names no layer in its own call; it is credited with
    the layer constructors of `__init__` that are not assigned to an attribute of their own."""
    modules: dict[str, list[str]] = {}
    assigned_calls: set[int] = set()
    unresolved: list[str] = []
    for node in ast.walk(class_node):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                assigned_calls.add(id(node.value))
                modules[target.attr] = _layers_built_by(node.value)
                if not modules[target.attr] and _call_name(node.value.func) in {"Sequential", "ModuleList"}:
                    unresolved.append(target.attr)
    if unresolved:
        loose = [
            name.lower()
            for node in ast.walk(class_node)
            if isinstance(node, ast.Call) and id(node) not in assigned_calls
            for name in [_call_name(node.func)]
            if _is_layer_constructor(name)
        ]
        for attr in unresolved:
            modules[attr] = loose
    return modules


def _is_layer_constructor(name: str | None) -> bool:
    return bool(name) and name[:1].isupper() and name not in {"Sequential", "ModuleList", "ModuleDict", "Parameter"}


def _layers_built_by(call: ast.Call) -> list[str]:
    name = _call_name(call.func)
    if name in {"Sequential", "ModuleList"}:
        return [
            _call_name(node.func).lower()
            for node in ast.walk(call)
            if node is not call and isinstance(node, ast.Call) and _is_layer_constructor(_call_name(node.func))
        ]
    # Helpers such as `self._make_block(...)` are not operators; their layers are unknown statically.
    return [name.lower()] if name and not name.startswith("_") and name != "Parameter" else []


def _is_loss(op: str) -> bool:
    return op.endswith("loss") or op in {
        "cross_entropy",
        "mse_loss",
        "l1_loss",
        "nll_loss",
        "kl_div",
        "smooth_l1_loss",
        "binary_cross_entropy",
        "huber_loss",
        "cosine_similarity",
        "triplet_margin_loss",
        "hinge_embedding_loss",
        "margin_ranking_loss",
    }


def analyze_reference(code: str) -> ReferenceOps:
    """Count the operators every `forward` in `code` runs. Unparseable code gives an empty result with
    `parse_error` set (never an exception: callers label such rows rather than fail the batch)."""
    result = ReferenceOps()
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        result.parse_error = f"SyntaxError: {error.msg} (line {error.lineno})"
        return result
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    result.n_classes = len(classes)
    # The file's own sub-module classes are counted through their own forward, not as an operator of their user.
    own_classes = {node.name.lower() for node in classes}
    for class_node in classes:
        modules = _module_constructors(class_node)
        for method in class_node.body:
            if isinstance(method, ast.FunctionDef) and method.name == "forward":
                _count_forward(method, modules, own_classes, result)
    return result


def _count_forward(
    method: ast.FunctionDef, modules: dict[str, list[str]], own_classes: set[str], result: ReferenceOps
) -> None:
    # `for layer in self.layers: x = layer(x)` runs the layers of self.layers.
    loop_aliases = {
        node.target.id: node.iter.attr
        for node in ast.walk(method)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and isinstance(node.iter, ast.Attribute)
        and isinstance(node.iter.value, ast.Name)
        and node.iter.value.id == "self"
        and node.iter.attr in modules
    }
    for node in ast.walk(method):
        if isinstance(node, (ast.For, ast.While, ast.comprehension)):
            result.has_loop = True
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
            result.ops[_BINARY_OPERATORS[type(node.op)]] += 1
        elif isinstance(node, ast.Call):
            func = node.func
            module_attr = None
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                module_attr = func.attr if func.attr in modules else None
            elif isinstance(func, ast.Name):
                module_attr = loop_aliases.get(func.id)
            if module_attr is not None:
                for layer in modules[module_attr]:
                    if layer not in own_classes:
                        result.ops[layer] += 1
                continue
            name = _call_name(func)
            if name and name not in LAYOUT_OR_QUERY and not name.startswith("_") and name.lower() not in own_classes:
                result.ops[name.lower()] += 1


def op_family(ops: ReferenceOps) -> str:
    """The reference's family, first match in OP_FAMILIES order; `network` is a model with four or more heavy
    layers (convolutions, matmuls, attention, recurrences), like KernelBench's level 3."""
    if ops.parse_error:
        return "other"
    if ops.has_recurrence:
        return "recurrent"
    if ops.has_attention:
        return "attention"
    if ops.count(HEAVY) >= 4:
        return "network"
    checks = (
        ("convolution", CONVOLUTION),
        ("matmul", MATMUL),
        ("normalization", NORMALIZATION),
        ("pooling", POOLING),
        ("softmax", SOFTMAX),
        ("reduction", REDUCTION),
    )
    for family, names in checks:
        if ops.count(names):
            return family
    if any(_is_loss(op) for op in ops.ops):
        return "loss"
    return "elementwise" if ops.op_count else "other"


__all__ = ["OP_FAMILIES", "ReferenceOps", "analyze_reference", "op_family"]
