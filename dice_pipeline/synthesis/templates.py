"""Built-in kernel templates, the offline generator backend: for each catalogue family a complete KernelBench
`ModelNew` file (`source = \"\"\"CUDA\"\"\"`, `cpp_src`, `load_inline`, `class ModelNew`) assembled from the CUDA
pieces in `synthesis/cuda/`. GEMMs stay in cuBLAS (torch.matmul); the kernels fuse everything around them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from dice_pipeline.synthesis.candidates import GeneratedCandidate, UnsupportedTaskError, check_sample_count
from dice_pipeline.synthesis.catalogue import FAMILIES, family_of_code

TEMPLATE_SET_VERSION = "dice-templates-v1"

# Headers every source starts with. c10/cuda (not ATen/cuda/CUDAContext.h) gives the current stream and device
# guard without pulling in cuBLAS/cuSPARSE headers, which keeps builds faster and lets a bare CUDA toolkit compile it.
SOURCE_PREAMBLE = """#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <math.h>
#include <algorithm>
#include <optional>
#include <vector>
"""


@dataclass(frozen=True)
class CudaPiece:
    """A unit of CUDA: `<name>_kernels.cu` (device code, CUDA runtime only) and `<name>_host.cu` (torch launchers),
    with the prototypes of the host functions Python calls."""

    name: str
    prototypes: tuple[str, ...]

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(p.split("(", 1)[0].split()[-1] for p in self.prototypes)


PIECES: dict[str, CudaPiece] = {
    piece.name: piece
    for piece in (
        CudaPiece("common", ()),
        CudaPiece(
            "norms",
            (
                "torch::Tensor rmsnorm_residual_forward(torch::Tensor x, std::optional<torch::Tensor> residual, "
                "torch::Tensor weight, double eps);",
                "std::vector<torch::Tensor> layernorm_residual_forward(torch::Tensor x, "
                "std::optional<torch::Tensor> residual, std::optional<torch::Tensor> residual_bias, "
                "torch::Tensor weight, torch::Tensor bias, double eps, bool return_sum);",
            ),
        ),
        CudaPiece(
            "activations",
            (
                "torch::Tensor silu_mul(torch::Tensor gate, torch::Tensor up);",
                "torch::Tensor bias_gelu_(torch::Tensor x, torch::Tensor bias, bool tanh_approximation);",
                "torch::Tensor bias_residual_add(torch::Tensor y, torch::Tensor bias, "
                "std::optional<torch::Tensor> residual);",
            ),
        ),
        CudaPiece(
            "rope",
            (
                "torch::Tensor rope_transpose(torch::Tensor x, int64_t heads, std::optional<torch::Tensor> bias, "
                "std::optional<torch::Tensor> inv_freq);",
            ),
        ),
        CudaPiece(
            "attention",
            (
                "torch::Tensor rope_causal_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, "
                "std::optional<torch::Tensor> q_bias, std::optional<torch::Tensor> k_bias, "
                "std::optional<torch::Tensor> v_bias, std::optional<torch::Tensor> inv_freq, int64_t heads, "
                "int64_t kv_heads);",
            ),
        ),
    )
}


@cache
def cuda_file(name: str) -> str:
    """The text of one file in synthesis/cuda/ (e.g. `attention_kernels.cu`)."""
    return resources.files("dice_pipeline.synthesis").joinpath("cuda", name).read_text()


# ModelNew classes. Each mirrors Model's constructor exactly (same submodules created in the same order), so the
# verifier's seeded construction gives both the same weights, and keeps Model's parameter names.
_ATTENTION_MODEL = '''
class ModelNew(nn.Module):
    """q/k/v/o projections on cuBLAS; bias + RoPE + head transpose and flash-style causal attention (GQA-aware,
    no seq x seq score tensor) in custom kernels."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, rope_theta, qkv_bias):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        self.register_buffer("inv_freq", 1.0 / (rope_theta ** exponents), persistent=False)

    def forward(self, x):
        q = torch.matmul(x, self.q_proj.weight.t())
        k = torch.matmul(x, self.k_proj.weight.t())
        v = torch.matmul(x, self.v_proj.weight.t())
        out = fused_ops.rope_causal_attention(
            q, k, v, self.q_proj.bias, self.k_proj.bias, self.v_proj.bias, self.inv_freq,
            self.num_heads, self.num_kv_heads,
        )
        return torch.matmul(out, self.o_proj.weight.t())
'''

_ROPE_MODEL = '''
class ModelNew(nn.Module):
    """RoPE and the (batch, seq, heads, D) -> (batch, heads, seq, D) transpose in one pass."""

    def __init__(self, head_dim, rope_theta):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.register_buffer("inv_freq", 1.0 / (rope_theta ** exponents), persistent=False)

    def forward(self, x):
        return fused_ops.rope_transpose(x, x.shape[2], None, self.inv_freq)
'''

_SWIGLU_MODEL = '''
class ModelNew(nn.Module):
    """Gate/up/down GEMMs on cuBLAS; silu(gate) * up fused into one pass."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        gate = torch.matmul(x, self.gate_proj.weight.t())
        up = torch.matmul(x, self.up_proj.weight.t())
        return torch.matmul(fused_ops.silu_mul(gate, up), self.down_proj.weight.t())
'''

_GELU_MLP_MODEL = '''
class ModelNew(nn.Module):
    """fc1/fc2 GEMMs on cuBLAS; bias + GELU fused in place on fc1's output, fc2's bias in one epilogue pass."""

    def __init__(self, hidden_size, intermediate_size, gelu_approximate):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.gelu_approximate = gelu_approximate

    def forward(self, x):
        hidden = torch.matmul(x, self.fc1.weight.t())
        fused_ops.bias_gelu_(hidden, self.fc1.bias, self.gelu_approximate == "tanh")
        return fused_ops.bias_residual_add(torch.matmul(hidden, self.fc2.weight.t()), self.fc2.bias, None)
'''

_RMSNORM_MODEL = '''
class ModelNew(nn.Module):
    """Residual add + RMSNorm in one kernel: one read of each input, one write."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x, residual):
        return fused_ops.rmsnorm_residual_forward(x, residual, self.weight, self.eps)
'''

_LAYERNORM_MODEL = '''
class ModelNew(nn.Module):
    """Residual add + LayerNorm in one kernel."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x, residual):
        return fused_ops.layernorm_residual_forward(
            x, residual, None, self.norm.weight, self.norm.bias, self.norm.eps, False
        )[0]
'''

_GPT2_BLOCK_MODEL = '''
class ModelNew(nn.Module):
    """GPT-2 block: GEMMs on cuBLAS; LayerNorm, qkv bias + head split, flash-style causal attention, the
    c_proj bias + residual + ln_2 (one kernel), bias + GELU, and the last bias + residual in custom kernels."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(hidden_size)
        self.c_attn = nn.Linear(hidden_size, 3 * hidden_size)
        self.c_proj = nn.Linear(hidden_size, hidden_size)
        self.ln_2 = nn.LayerNorm(hidden_size)
        self.c_fc = nn.Linear(hidden_size, 4 * hidden_size)
        self.mlp_proj = nn.Linear(4 * hidden_size, hidden_size)

    def forward(self, x):
        hidden = x.shape[-1]
        normed = fused_ops.layernorm_residual_forward(
            x, None, None, self.ln_1.weight, self.ln_1.bias, self.ln_1.eps, False
        )[0]
        q, k, v = torch.matmul(normed, self.c_attn.weight.t()).split(hidden, dim=2)
        q_bias, k_bias, v_bias = self.c_attn.bias.split(hidden)
        y = fused_ops.rope_causal_attention(q, k, v, q_bias, k_bias, v_bias, None, self.num_heads, self.num_heads)
        attn = torch.matmul(y, self.c_proj.weight.t())
        normed, x = fused_ops.layernorm_residual_forward(
            x, attn, self.c_proj.bias, self.ln_2.weight, self.ln_2.bias, self.ln_2.eps, True
        )
        mlp_hidden = torch.matmul(normed, self.c_fc.weight.t())
        fused_ops.bias_gelu_(mlp_hidden, self.c_fc.bias, True)
        return fused_ops.bias_residual_add(torch.matmul(mlp_hidden, self.mlp_proj.weight.t()), self.mlp_proj.bias, x)
'''


@dataclass(frozen=True)
class _FamilyTemplate:
    pieces: tuple[str, ...]  # in dependency order after "common"
    model_source: str


_ATTENTION_TEMPLATE = _FamilyTemplate(("rope", "attention"), _ATTENTION_MODEL)
FAMILY_TEMPLATES: dict[str, _FamilyTemplate] = {
    "mha_rope_causal": _ATTENTION_TEMPLATE,
    "gqa_rope_causal": _ATTENTION_TEMPLATE,
    "mqa_rope_causal": _ATTENTION_TEMPLATE,
    "rope": _FamilyTemplate(("rope",), _ROPE_MODEL),
    "swiglu_mlp": _FamilyTemplate(("activations",), _SWIGLU_MODEL),
    "gelu_mlp": _FamilyTemplate(("activations",), _GELU_MLP_MODEL),
    "rmsnorm_residual": _FamilyTemplate(("norms",), _RMSNORM_MODEL),
    "layernorm_residual": _FamilyTemplate(("norms",), _LAYERNORM_MODEL),
    "gpt2_block": _FamilyTemplate(("norms", "activations", "rope", "attention"), _GPT2_BLOCK_MODEL),
}

# Launch-configuration variants: distinct candidates per task whose speed the verifier compares. Row kernels
# use DICE_NORM_THREADS threads a row; element-wise kernels DICE_ELEMENTWISE_THREADS a block.
VARIANTS: tuple[dict[str, int], ...] = (
    {"DICE_NORM_THREADS": 256, "DICE_ELEMENTWISE_THREADS": 256},
    {"DICE_NORM_THREADS": 512, "DICE_ELEMENTWISE_THREADS": 512},
    {"DICE_NORM_THREADS": 1024, "DICE_ELEMENTWISE_THREADS": 128},
)


def template_pieces(family: str) -> tuple[CudaPiece, ...]:
    return tuple(PIECES[name] for name in ("common", *_family_template(family).pieces))


def _family_template(family: str) -> _FamilyTemplate:
    try:
        return FAMILY_TEMPLATES[family]
    except KeyError:
        raise UnsupportedTaskError(f"no kernel template for structure family {family!r}") from None


def render_cuda_source(family: str, variant: dict[str, int]) -> str:
    """The CUDA translation unit for `family`: headers, variant macros, device kernels, then host launchers."""
    pieces = template_pieces(family)
    macros = "".join(f"#define {name} {value}\n" for name, value in sorted(variant.items()))
    kernels = "\n".join(cuda_file(f"{piece.name}_kernels.cu") for piece in pieces)
    hosts = "\n".join(cuda_file(f"{piece.name}_host.cu") for piece in pieces)
    return SOURCE_PREAMBLE + "\n" + macros + "\n" + kernels + "\n" + hosts


def render_candidate(family: str, variant_index: int = 0) -> str:
    """A complete KernelBench candidate file (ModelNew) for a catalogue family."""
    template = _family_template(family)
    variant = VARIANTS[variant_index]
    source = render_cuda_source(family, variant)
    # The CUDA goes into a plain (non-raw) triple-quoted Python string, which would reinterpret backslashes.
    if "\\" in source or '"""' in source:
        raise ValueError(f"{family}: CUDA source must not contain backslashes or triple quotes")
    pieces = template_pieces(family)
    prototypes = "\n".join(p for piece in pieces for p in piece.prototypes)
    functions = [f for piece in pieces for f in piece.functions]
    digest = hashlib.sha256((source + prototypes).encode()).hexdigest()[:10]
    imports = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
    return (
        f"{imports}\n"
        f'source = """\n{source}"""\n\n'
        f'cpp_src = """\n{prototypes}\n"""\n\n'
        "fused_ops = load_inline(\n"
        f'    name="dice_{family}_{digest}",\n'
        "    cpp_sources=cpp_src,\n"
        "    cuda_sources=source,\n"
        f"    functions={functions!r},\n"
        '    extra_cuda_cflags=["-O3"],\n'
        "    verbose=False,\n"
        ")\n\n" + template.model_source
    )


class TemplateGenerator:
    """The offline default backend: deterministic, no model. `generate` returns up to `n` distinct launch-config
    variants (fewer when n exceeds len(VARIANTS): repeats would only re-verify identical code)."""

    backend = "template"
    model_name = TEMPLATE_SET_VERSION

    def __init__(self, messages_fn=None) -> None:
        # The prompt each candidate answers, recorded so template outputs become SFT pairs like any other.
        if messages_fn is None:
            from dice_pipeline.prompts import kernel_generation_messages as messages_fn
        self._messages_fn = messages_fn

    def supports(self, task_pytorch_code: str) -> bool:
        family = family_of_code(task_pytorch_code)
        return family is not None and family in FAMILY_TEMPLATES

    def generate(self, task_pytorch_code: str, n: int, *, seed: int = 0) -> list[GeneratedCandidate]:
        check_sample_count(n)
        family = family_of_code(task_pytorch_code)
        if family is None:
            raise UnsupportedTaskError(
                "not a structure-catalogue task (no '# dice-structure-family:' header); templates exist for "
                f"{sorted(FAMILY_TEMPLATES)}"
            )
        messages = self._messages_fn(task_pytorch_code)
        candidates = []
        # The seed rotates which variants come first, so a caller asking for n=1 with different seeds sees them all.
        for sample_index in range(min(n, len(VARIANTS))):
            variant_index = (seed + sample_index) % len(VARIANTS)
            started = time.perf_counter()
            code = render_candidate(family, variant_index)
            candidates.append(
                GeneratedCandidate(
                    text=code,
                    code=code,
                    backend=self.backend,
                    model=self.model_name,
                    prompt_messages=messages,
                    finish_reason="template",
                    latency_s=time.perf_counter() - started,
                    sample_index=sample_index,
                    seed=seed,
                    variant={"family": family, "variant_index": variant_index, **VARIANTS[variant_index]},
                )
            )
        return candidates


def template_families() -> list[str]:
    """Families with a template; every catalogue family has one (a test checks)."""
    return sorted(set(FAMILY_TEMPLATES) & set(FAMILIES))


def template_info() -> dict[str, Any]:
    return {"version": TEMPLATE_SET_VERSION, "families": template_families(), "variants": list(VARIANTS)}
