"""What every operator family shares: the instance record, the seeded choices that vary names, docstrings and
layout, and the two file renderers (the KernelBench reference `Model` and the `ModelNew` that loads its CUDA with
`load_inline`). Standard library only.

A family builds an instance from a *design* (the CUDA source: op, kernel style, names in the CUDA code) and a
per-instance draw (shapes, constants, Python names, docstring). Instances of one design share their extension
byte for byte, so a batch builds each design once (the verifier's build cache and build groups see one source).
"""

from __future__ import annotations

import hashlib
import json
import random
import textwrap
from dataclasses import dataclass, field
from typing import Any

# How every source begins. c10/cuda (not ATen/cuda/CUDAContext.h) gives the current stream without pulling in the
# cuBLAS/cuSPARSE headers, so a bare CUDA toolkit compiles it.
CUDA_PREAMBLE = """#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
"""

# Activations shared by the epilogues of several families: (torch spelling applied to {y}, C expression of v).
ACTIVATIONS = {
    "relu": ("torch.relu({y})", "fmaxf(v, 0.0f)"),
    "gelu": ("F.gelu({y})", "0.5f * v * (1.0f + erff(v * 0.7071067811865476f))"),
    "silu": ("F.silu({y})", "v / (1.0f + expf(-v))"),
    "tanh": ("torch.tanh({y})", "tanhf(v)"),
    "sigmoid": ("torch.sigmoid({y})", "1.0f / (1.0f + expf(-v))"),
}
SPLIT_TRAIN = "train"
SPLIT_HELD_OUT = "held_out"


@dataclass(frozen=True)
class OperatorInstance:
    """One generated KernelBench-style pair: a reference `Model` file and a `ModelNew` file with a custom kernel."""

    task_id: str  # <family>/<op>/<12 hex digits of the reference and candidate>
    family: str
    op: str
    style: str  # the kernel style (grid_stride, vectorized, warp_per_row, ...)
    design_id: str  # the CUDA design: instances with the same design share their extension source
    split: str  # train | held_out
    seed: int
    index: int  # position in its family's draw for this seed
    params: dict[str, Any]  # shapes, dims, constants, pattern: what this instance computes
    reference_code: str
    candidate_code: str

    def params_json(self) -> str:
        return json.dumps(self.params, sort_keys=True)

    def as_row(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "family": self.family, "op": self.op, "style": self.style,
                "design_id": self.design_id, "split": self.split, "seed": self.seed, "instance_index": self.index,
                "params_json": self.params_json(), "pytorch_code": self.reference_code,
                "generated_code": self.candidate_code}


def instance_rng(seed: int, *parts: Any) -> random.Random:
    """A generator seeded from the run seed and the instance's coordinates: one instance's draw does not depend on
    how many instances came before it or in which order families are built."""
    digest = hashlib.sha256(json.dumps([seed, *parts], default=str).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def short_hash(*parts: Any, length: int = 12) -> str:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()[:length]


def round_sig(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


# --- choices that vary the Python side -------------------------------------------------------------------------
INPUT_NAMES = (("x",), ("input",), ("inp",), ("features",), ("tensor",), ("a",), ("data",), ("activations",))
PAIR_INPUT_NAMES = (("x", "y"), ("a", "b"), ("input", "other"), ("lhs", "rhs"), ("x1", "x2"), ("pred", "target"))
EXTENSION_HANDLES = ("fused_ext", "custom_ops", "kernel_module", "cuda_module", "ext", "op_module")
SOURCE_NAMES = ("source", "cuda_source", "kernel_source", "cuda_src", "cuda_code")
CPP_NAMES = ("cpp_src", "cpp_source", "cpp_decl", "cpp_code")


@dataclass
class PythonNames:
    inputs: tuple[str, ...]
    handle: str
    source_var: str
    cpp_var: str
    super_style: int  # 0: super(Model, self).__init__(), 1: super().__init__()
    type_hints: bool
    docstring_inputs: bool


def python_names(rng: random.Random, n_inputs: int) -> PythonNames:
    if n_inputs == 1:
        inputs = rng.choice(INPUT_NAMES)
    elif n_inputs == 2:
        inputs = rng.choice(PAIR_INPUT_NAMES)
    else:
        inputs = tuple(f"x{i}" for i in range(n_inputs))
    return PythonNames(inputs=inputs, handle=rng.choice(EXTENSION_HANDLES), source_var=rng.choice(SOURCE_NAMES),
                       cpp_var=rng.choice(CPP_NAMES), super_style=rng.randrange(2), type_hints=rng.random() < 0.6,
                       docstring_inputs=rng.random() < 0.5)


# --- the reference file --------------------------------------------------------------------------------------------
@dataclass
class ModelSpec:
    """What the reference and the candidate share: constructor parameters (name, value passed by get_init_inputs),
    the constructor body (parameters and buffers are created in the same order in both, so one seed gives both the
    same weights), the module-level sizes and the input draws."""

    docstring: str
    init_args: list[tuple[str, Any]] = field(default_factory=list)
    init_lines: list[str] = field(default_factory=list)
    sizes: list[tuple[str, Any]] = field(default_factory=list)
    input_lines: list[str] = field(default_factory=list)  # `name = torch...` lines of get_inputs
    returns_doc: str = ""
    needs_functional: bool = False


def _super_call(class_name: str, style: int) -> str:
    return f"super({class_name}, self).__init__()" if style == 0 else "super().__init__()"


def _signature(names: PythonNames, args: list[str]) -> str:
    if names.type_hints:
        return ", ".join(f"{a}: torch.Tensor" for a in args)
    return ", ".join(args)


def _init_signature(spec: ModelSpec) -> str:
    return "".join(f", {name}" for name, _ in spec.init_args)


def _literal(value: Any) -> str:
    """A value as a Python literal that round-trips (0.1, 2.5, 1e-05, 64)."""
    return repr(float(value)) if isinstance(value, float) else repr(value)


def render_reference(spec: ModelSpec, names: PythonNames, forward_lines: list[str]) -> str:
    """A KernelBench-format reference: `class Model`, module-level sizes, get_inputs, get_init_inputs."""
    imports = ["import torch", "import torch.nn as nn"]
    if spec.needs_functional:
        imports.append("import torch.nn.functional as F")
    doc = textwrap.indent(textwrap.fill(spec.docstring, 100), "    ")
    init_body = spec.init_lines or []
    lines = [*imports, "", "", "class Model(nn.Module):", '    """', doc, '    """', "",
             f"    def __init__(self{_init_signature(spec)}):", f"        {_super_call('Model', names.super_style)}"]
    lines += [f"        {line}" for line in init_body]
    ret = " -> torch.Tensor" if names.type_hints else ""
    lines += ["", f"    def forward(self, {_signature(names, list(names.inputs))}){ret}:"]
    if names.docstring_inputs:
        lines += ['        """', f"        Args: {', '.join(names.inputs)} (torch.Tensor).",
                  f"        Returns: {spec.returns_doc or 'the result tensor.'}", '        """']
    lines += [f"        {line}" for line in forward_lines]
    lines += ["", ""]
    lines += [f"{name} = {_literal(value)}" for name, value in spec.sizes]
    lines += ["", "", "def get_inputs():"]
    lines += [f"    {line}" for line in spec.input_lines]
    lines += [f"    return [{', '.join(names.inputs)}]", "", "", "def get_init_inputs():",
              f"    return [{', '.join(_literal(v) if not isinstance(v, str) else v for _, v in spec.init_args)}]", ""]
    return "\n".join(lines)


# --- the candidate file --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CudaDesign:
    """The extension of a design: its CUDA source (preamble included), the C++ prototypes and the functions
    Python calls. `name` is derived from the content, so identical designs build once."""

    cuda: str
    prototypes: tuple[str, ...]
    functions: tuple[str, ...]
    stem: str  # readable part of the extension name
    cuda_flags: tuple[str, ...] = ("-O3",)

    @property
    def design_id(self) -> str:
        return short_hash(self.cuda, *self.prototypes, *self.functions, *self.cuda_flags)

    @property
    def extension_name(self) -> str:
        return f"{self.stem}_{self.design_id[:8]}"


def render_candidate(spec: ModelSpec, names: PythonNames, design: CudaDesign, forward_lines: list[str]) -> str:
    """The `ModelNew` file: the CUDA source as a module-level triple-quoted string (the infilling split's middle),
    the prototypes, `load_inline`, and `class ModelNew` with the reference's constructor."""
    functions = ", ".join(f'"{f}"' for f in design.functions)
    flags = ", ".join(f'"{f}"' for f in design.cuda_flags)
    lines = ["import torch", "import torch.nn as nn", "from torch.utils.cpp_extension import load_inline", "",
             f'{names.source_var} = """', design.cuda.rstrip("\n"), '"""', "",
             f'{names.cpp_var} = """', "\n".join(design.prototypes), '"""', "",
             f"{names.handle} = load_inline(", f'    name="{design.extension_name}",',
             f"    cpp_sources={names.cpp_var},", f"    cuda_sources={names.source_var},",
             f"    functions=[{functions}],", "    verbose=False,", f"    extra_cuda_cflags=[{flags}],", ")", "", "",
             "class ModelNew(nn.Module):",
             f"    def __init__(self{_init_signature(spec)}):", f"        {_super_call('ModelNew', names.super_style)}"]
    lines += [f"        {line}" for line in spec.init_lines]
    ret = " -> torch.Tensor" if names.type_hints else ""
    lines += ["", f"    def forward(self, {_signature(names, list(names.inputs))}){ret}:"]
    lines += [f"        {line}" for line in forward_lines]
    lines.append("")
    return "\n".join(lines)


def launch_check() -> str:
    return "C10_CUDA_KERNEL_LAUNCH_CHECK();"


def float_check(var: str) -> str:
    return (f'TORCH_CHECK({var}.is_cuda() && {var}.scalar_type() == torch::kFloat32, '
            f'"{var} must be a float32 CUDA tensor");')


def current_stream() -> str:
    return "cudaStream_t stream = c10::cuda::getCurrentCUDAStream();"


def grid_for(count: str, threads: int, cap: int | None = None) -> str:
    """The block count for `count` items at `threads` a block, capped for grid-stride loops."""
    base = f"({count} + {threads} - 1) / {threads}"
    if cap is None:
        return f"(unsigned int)std::max<int64_t>(1, {base})"
    return f"(unsigned int)std::max<int64_t>(1, std::min<int64_t>({base}, {cap}))"
