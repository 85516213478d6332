"""The structure catalogue: KernelBench-format reference tasks for sub-modules of mainstream LLM blocks (attention
with RoPE and a causal mask in MHA/GQA/MQA form, SwiGLU and GELU MLPs, RMSNorm/LayerNorm with residual, RoPE, a
GPT-2 block), rendered from one parameterised template per family at shapes taken from real model configurations.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Header line that names the family; TemplateGenerator reads it back to pick the kernel template for a task.
FAMILY_MARKER = "# dice-structure-family: "

# Planning estimate of eager fp32 time on one H200 (not a measurement): cuBLAS SGEMM at ~50 TFLOP/s and
# element-wise/reduction kernels at ~3.5 TB/s. Shapes are chosen so the estimate is at least
# MIN_REFERENCE_MS, long enough to time above launch overhead; the verifier measures the real time.
_GEMM_FLOPS_PER_S = 50e12
_MEMORY_BYTES_PER_S = 3.5e12
MIN_REFERENCE_MS = 0.3

# Shape keys, in task-id order, and the module-level size names they become in the reference code.
SIZE_NAMES = {
    "b": "batch_size",
    "s": "seq_len",
    "h": "hidden_size",
    "q": "num_heads",
    "kv": "num_kv_heads",
    "i": "intermediate_size",
    "d": "head_dim",
}


@dataclass(frozen=True)
class StructureTask:
    """One reference task: `pytorch_code` is a complete KernelBench task file (class Model, module-level sizes,
    get_inputs, get_init_inputs)."""

    task_id: str  # stable: family + shape, e.g. gqa_rope_causal__b2_s1024_h2048_q16_kv4
    family: str
    shape: dict[str, int]
    config: dict[str, Any]  # non-shape constructor settings (eps, rope_theta, qkv_bias, gelu approximation)
    model_family: str  # the model whose block this mirrors: llama, qwen, gpt2, falcon, ...
    pytorch_code: str
    estimated_reference_ms: float  # planning estimate on an H200, see _GEMM_FLOPS_PER_S; never a measurement

    def shape_json(self) -> str:
        return json.dumps(self.shape, sort_keys=True)


@dataclass(frozen=True)
class _Family:
    """A parameterised reference: the `Model` source, which sizes/settings become module-level names, the
    constructor arguments and inputs built from them, and a cost model for the time estimate."""

    name: str
    summary: str
    shape_keys: tuple[str, ...]
    model_source: str
    config_keys: tuple[str, ...]
    init_args: tuple[str, ...]
    input_shapes: tuple[tuple[str, ...], ...]  # each input: the size names of torch.randn's dimensions
    cost: Callable[[dict[str, int]], tuple[float, float]]  # shape -> (GEMM flops, element-wise bytes moved)
    uses_math: bool = False
    extra_imports: tuple[str, ...] = ()


_ROTATE_HALF = '''
def rotate_half(x):
    """Rotary embedding helper: (x1, x2) -> (-x2, x1) on the last dimension's halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
'''

_ATTENTION_SOURCE = _ROTATE_HALF + '''

class Model(nn.Module):
    """Causal self-attention with rotary position embeddings. num_kv_heads < num_heads shares each key/value head
    across a group of query heads (grouped-query attention; multi-query when it is 1)."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, rope_theta, qkv_bias):
        super().__init__()
        assert hidden_size % num_heads == 0 and num_heads % num_kv_heads == 0
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
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        positions = torch.arange(seq, device=x.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(out)
'''

_ROPE_SOURCE = _ROTATE_HALF + '''

class Model(nn.Module):
    """Rotary position embedding of a per-head projection: input (batch, seq, heads, head_dim) as a linear
    layer's output viewed per head, output (batch, heads, seq, head_dim) rotated by position."""

    def __init__(self, head_dim, rope_theta):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.register_buffer("inv_freq", 1.0 / (rope_theta ** exponents), persistent=False)

    def forward(self, x):
        seq = x.shape[1]
        x = x.transpose(1, 2)
        positions = torch.arange(seq, device=x.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return x * emb.cos() + rotate_half(x) * emb.sin()
'''

_SWIGLU_SOURCE = '''

class Model(nn.Module):
    """SwiGLU feed-forward block (LLaMA, Qwen, Mistral): down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''

_GELU_MLP_SOURCE = '''

class Model(nn.Module):
    """GELU feed-forward block (GPT-2, Falcon, BERT): fc2(gelu(fc1(x))), exact or tanh-approximated GELU."""

    def __init__(self, hidden_size, intermediate_size, gelu_approximate):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.gelu_approximate = gelu_approximate

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.gelu_approximate))
'''

_RMSNORM_SOURCE = '''

class Model(nn.Module):
    """Residual add followed by RMSNorm (LLaMA/Qwen pre-norm): weight * h / sqrt(mean(h^2) + eps), h = x + residual."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x, residual):
        hidden = x + residual
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.eps))
'''

_LAYERNORM_SOURCE = '''

class Model(nn.Module):
    """Residual add followed by LayerNorm (GPT-2/Falcon style)."""

    def __init__(self, hidden_size, eps):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x, residual):
        return self.norm(x + residual)
'''

_GPT2_BLOCK_SOURCE = '''

def new_gelu(x):
    """GPT-2's tanh approximation of GELU."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Model(nn.Module):
    """A GPT-2 transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)); causal multi-head attention, no dropout."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        assert hidden_size % num_heads == 0
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(hidden_size)
        self.c_attn = nn.Linear(hidden_size, 3 * hidden_size)
        self.c_proj = nn.Linear(hidden_size, hidden_size)
        self.ln_2 = nn.LayerNorm(hidden_size)
        self.c_fc = nn.Linear(hidden_size, 4 * hidden_size)
        self.mlp_proj = nn.Linear(4 * hidden_size, hidden_size)

    def forward(self, x):
        batch, seq, hidden = x.shape
        head_dim = hidden // self.num_heads
        q, k, v = self.c_attn(self.ln_1(x)).split(hidden, dim=2)
        q = q.view(batch, seq, self.num_heads, head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.num_heads, head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.num_heads, head_dim).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(batch, seq, hidden)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(new_gelu(self.c_fc(self.ln_2(x))))
'''


def _tokens(shape: dict[str, int]) -> int:
    return shape["b"] * shape["s"]


def _attention_cost(shape: dict[str, int]) -> tuple[float, float]:
    t, h, q, kv = _tokens(shape), shape["h"], shape["q"], shape["kv"]
    head_dim = h // q
    projections = 2 * t * h * (q * head_dim + 2 * kv * head_dim) + 2 * t * q * head_dim * h
    core = 2 * 2 * shape["b"] * q * shape["s"] ** 2 * head_dim
    # Eager moves the (b, q, s, s) score tensor about 8 times: matmul out, scale, masked_fill, softmax, matmul in.
    score_bytes = 8 * 4 * shape["b"] * q * shape["s"] ** 2
    # RoPE (~10 passes over q and k), repeat_interleave of k and v, transposes.
    other_bytes = 4 * t * head_dim * (10 * (q + kv) + 4 * q)
    return projections + core, score_bytes + other_bytes


def _rope_cost(shape: dict[str, int]) -> tuple[float, float]:
    # x*cos, the negated half, cat, *sin, add: about ten passes over the tensor.
    return 0.0, 10 * 4 * _tokens(shape) * shape["q"] * shape["d"]


def _swiglu_cost(shape: dict[str, int]) -> tuple[float, float]:
    t, h, i = _tokens(shape), shape["h"], shape["i"]
    return 2 * t * h * i * 3, 5 * 4 * t * i  # silu (r/w) and the product (2r/w)


def _gelu_mlp_cost(shape: dict[str, int]) -> tuple[float, float]:
    t, h, i = _tokens(shape), shape["h"], shape["i"]
    return 2 * t * h * i * 2, 2 * 4 * t * i


def _rmsnorm_cost(shape: dict[str, int]) -> tuple[float, float]:
    # add (2r/w), pow (r/w), mean (r), rsqrt*h (r/w), weight* (r/w): ten passes.
    return 0.0, 10 * 4 * _tokens(shape) * shape["h"]


def _layernorm_cost(shape: dict[str, int]) -> tuple[float, float]:
    # add (2r/w) then one fused layer_norm kernel (r/w).
    return 0.0, 5 * 4 * _tokens(shape) * shape["h"]


def _gpt2_block_cost(shape: dict[str, int]) -> tuple[float, float]:
    t, h, q = _tokens(shape), shape["h"], shape["q"]
    gemms = 2 * t * h * (3 * h + h + 4 * h + 4 * h)
    core = 2 * 2 * shape["b"] * q * shape["s"] ** 2 * (h // q)
    score_bytes = 8 * 4 * shape["b"] * q * shape["s"] ** 2
    other_bytes = 4 * t * h * (2 * 5 + 2 * 3 + 4 * 8)  # two layer norms, two residual adds, new_gelu's ~8 passes
    return gemms + core, score_bytes + other_bytes


_HIDDEN_INPUT = ("batch_size", "seq_len", "hidden_size")

FAMILIES: dict[str, _Family] = {}


def _register(family: _Family) -> None:
    FAMILIES[family.name] = family


for _attention_name, _kind in (
    ("mha_rope_causal", "multi-head"),
    ("gqa_rope_causal", "grouped-query"),
    ("mqa_rope_causal", "multi-query"),
):
    _register(
        _Family(
            name=_attention_name,
            summary=f"causal {_kind} self-attention with RoPE, q/k/v/o projections",
            shape_keys=("b", "s", "h", "q", "kv"),
            model_source=_ATTENTION_SOURCE,
            config_keys=("rope_theta", "qkv_bias"),
            init_args=("hidden_size", "num_heads", "num_kv_heads", "rope_theta", "qkv_bias"),
            input_shapes=(_HIDDEN_INPUT,),
            cost=_attention_cost,
            uses_math=True,
        )
    )
_register(
    _Family(
        name="rope",
        summary="rotary position embedding of a per-head projection",
        shape_keys=("b", "s", "q", "d"),
        model_source=_ROPE_SOURCE,
        config_keys=("rope_theta",),
        init_args=("head_dim", "rope_theta"),
        input_shapes=(("batch_size", "seq_len", "num_heads", "head_dim"),),
        cost=_rope_cost,
    )
)
_register(
    _Family(
        name="swiglu_mlp",
        summary="SwiGLU MLP: down(silu(gate(x)) * up(x))",
        shape_keys=("b", "s", "h", "i"),
        model_source=_SWIGLU_SOURCE,
        config_keys=(),
        init_args=("hidden_size", "intermediate_size"),
        input_shapes=(_HIDDEN_INPUT,),
        cost=_swiglu_cost,
        extra_imports=("import torch.nn.functional as F",),
    )
)
_register(
    _Family(
        name="gelu_mlp",
        summary="GELU MLP: fc2(gelu(fc1(x)))",
        shape_keys=("b", "s", "h", "i"),
        model_source=_GELU_MLP_SOURCE,
        config_keys=("gelu_approximate",),
        init_args=("hidden_size", "intermediate_size", "gelu_approximate"),
        input_shapes=(_HIDDEN_INPUT,),
        cost=_gelu_mlp_cost,
        extra_imports=("import torch.nn.functional as F",),
    )
)
_register(
    _Family(
        name="rmsnorm_residual",
        summary="residual add + RMSNorm",
        shape_keys=("b", "s", "h"),
        model_source=_RMSNORM_SOURCE,
        config_keys=("eps",),
        init_args=("hidden_size", "eps"),
        input_shapes=(_HIDDEN_INPUT, _HIDDEN_INPUT),
        cost=_rmsnorm_cost,
    )
)
_register(
    _Family(
        name="layernorm_residual",
        summary="residual add + LayerNorm",
        shape_keys=("b", "s", "h"),
        model_source=_LAYERNORM_SOURCE,
        config_keys=("eps",),
        init_args=("hidden_size", "eps"),
        input_shapes=(_HIDDEN_INPUT, _HIDDEN_INPUT),
        cost=_layernorm_cost,
    )
)
_register(
    _Family(
        name="gpt2_block",
        summary="GPT-2 transformer block (LayerNorm, causal MHA, GELU MLP, residuals)",
        shape_keys=("b", "s", "h", "q"),
        model_source=_GPT2_BLOCK_SOURCE,
        config_keys=(),
        init_args=("hidden_size", "num_heads"),
        input_shapes=(_HIDDEN_INPUT,),
        cost=_gpt2_block_cost,
        uses_math=True,
    )
)


def attention_family(num_heads: int, num_kv_heads: int) -> str:
    """mha when every query head has its own key/value head, mqa when all share one, gqa in between."""
    if num_kv_heads == num_heads:
        return "mha_rope_causal"
    if num_kv_heads == 1:
        return "mqa_rope_causal"
    return "gqa_rope_causal"


def task_id_for(family: str, shape: dict[str, int]) -> str:
    spec = _family(family)
    return family + "__" + "_".join(f"{key}{shape[key]}" for key in spec.shape_keys)


def _family(name: str) -> _Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown structure family {name!r}; known: {sorted(FAMILIES)}") from None


def _check_shape(spec: _Family, shape: dict[str, int], config: dict[str, Any]) -> None:
    missing = [key for key in spec.shape_keys if key not in shape]
    extra = [key for key in shape if key not in spec.shape_keys]
    if missing or extra:
        raise ValueError(f"{spec.name}: shape needs keys {spec.shape_keys}, missing {missing}, unexpected {extra}")
    bad = {key: value for key, value in shape.items() if not isinstance(value, int) or value <= 0}
    if bad:
        raise ValueError(f"{spec.name}: shape values must be positive integers, got {bad}")
    missing_config = [key for key in spec.config_keys if key not in config]
    if missing_config or set(config) - set(spec.config_keys):
        raise ValueError(f"{spec.name}: config needs keys {spec.config_keys}, got {sorted(config)}")
    if "q" in shape and "h" in shape and shape["h"] % shape["q"]:
        raise ValueError(f"{spec.name}: hidden {shape['h']} is not a multiple of {shape['q']} heads")
    if "kv" in shape:
        if shape["q"] % shape["kv"]:
            raise ValueError(f"{spec.name}: {shape['q']} query heads do not split into {shape['kv']} groups")
        if attention_family(shape["q"], shape["kv"]) != spec.name:
            raise ValueError(f"{spec.name}: q={shape['q']} kv={shape['kv']} is {attention_family(shape['q'], shape['kv'])}")
    head_dim = shape.get("d") or (shape["h"] // shape["q"] if "q" in shape else None)
    if head_dim is not None and head_dim % 2:
        raise ValueError(f"{spec.name}: head_dim {head_dim} must be even for RoPE / head splitting")


def _render(spec: _Family, shape: dict[str, int], config: dict[str, Any], model_family: str) -> str:
    sizes = {SIZE_NAMES[key]: shape[key] for key in spec.shape_keys}
    sizes.update(config)
    imports = ["import math"] if spec.uses_math else []
    imports += ["import torch", "import torch.nn as nn", *spec.extra_imports]
    assignments = "\n".join(f"{name} = {value!r}" for name, value in sizes.items())
    inputs = ", ".join(f"torch.randn({', '.join(dims)})" for dims in spec.input_shapes)
    header = (
        f"{FAMILY_MARKER}{spec.name}\n"
        f"# {spec.summary}; {model_family}-style shapes. Generated by dice_pipeline.synthesis.catalogue.\n"
    )
    footer = textwrap.dedent(
        f"""
        def get_inputs():
            return [{inputs}]


        def get_init_inputs():
            return [{', '.join(spec.init_args)}]
        """
    )
    body = spec.model_source.strip("\n")
    return header + "\n".join(imports) + "\n\n\n" + body + "\n\n\n" + assignments + "\n\n" + footer


def make_structure_task(family: str, shape: dict[str, int], config: dict[str, Any], model_family: str) -> StructureTask:
    """Render one task. Tests call this with reduced shapes; `structure_catalogue` with the real ones."""
    spec = _family(family)
    shape = dict(shape)
    config = dict(config)
    _check_shape(spec, shape, config)
    flops, moved_bytes = spec.cost(shape)
    estimate_ms = 1e3 * (flops / _GEMM_FLOPS_PER_S + moved_bytes / _MEMORY_BYTES_PER_S)
    return StructureTask(
        task_id=task_id_for(family, shape),
        family=family,
        shape={key: shape[key] for key in spec.shape_keys},
        config=config,
        model_family=model_family,
        pytorch_code=_render(spec, shape, config, model_family),
        estimated_reference_ms=round(estimate_ms, 4),
    )


@dataclass(frozen=True)
class _CatalogueEntry:
    family: str
    model_family: str
    shape: dict[str, int]
    config: dict[str, Any] = field(default_factory=dict)


def _attention(model_family: str, rope_theta: float, qkv_bias: bool, **shape: int) -> _CatalogueEntry:
    family = attention_family(shape["q"], shape["kv"])
    return _CatalogueEntry(family, model_family, shape, {"rope_theta": rope_theta, "qkv_bias": qkv_bias})


# Shapes follow published configurations (hidden, heads, kv heads, intermediate sizes) at batch x sequence sizes
# that keep each reference's estimated H200 time >= MIN_REFERENCE_MS and its memory well inside one GPU.
_CATALOGUE: tuple[_CatalogueEntry, ...] = (
    # attention: LLaMA-2 (MHA), LLaMA-3 / Llama-3.2 (GQA, theta 5e5), Qwen2.5 (GQA, q/k/v bias, theta 1e6),
    # Falcon (MQA), a GPT-J-sized MHA
    _attention("llama", 10000.0, False, b=2, s=1024, h=2048, q=16, kv=16),
    _attention("llama", 10000.0, False, b=1, s=2048, h=4096, q=32, kv=32),
    _attention("llama", 500000.0, False, b=2, s=1024, h=2048, q=16, kv=4),
    _attention("llama", 500000.0, False, b=1, s=2048, h=4096, q=32, kv=8),
    _attention("qwen", 1000000.0, True, b=2, s=1024, h=2048, q=16, kv=2),
    _attention("qwen", 1000000.0, True, b=1, s=2048, h=3584, q=28, kv=4),
    _attention("falcon", 10000.0, False, b=2, s=1024, h=2048, q=32, kv=1),
    _attention("falcon", 10000.0, False, b=1, s=2048, h=4544, q=71, kv=1),
    # RoPE alone on a projection's output
    _CatalogueEntry("rope", "llama", {"b": 4, "s": 2048, "q": 32, "d": 128}, {"rope_theta": 10000.0}),
    _CatalogueEntry("rope", "qwen", {"b": 2, "s": 4096, "q": 28, "d": 128}, {"rope_theta": 1000000.0}),
    _CatalogueEntry("rope", "falcon", {"b": 16, "s": 2048, "q": 16, "d": 64}, {"rope_theta": 10000.0}),
    # MLPs: TinyLlama, LLaMA-2-7B, Qwen2.5-3B, LLaMA-3-8B (SwiGLU); GPT-2 small/XL (tanh GELU), Falcon-7B (erf)
    _CatalogueEntry("swiglu_mlp", "llama", {"b": 2, "s": 1024, "h": 2048, "i": 5632}),
    _CatalogueEntry("swiglu_mlp", "llama", {"b": 1, "s": 2048, "h": 4096, "i": 11008}),
    _CatalogueEntry("swiglu_mlp", "qwen", {"b": 2, "s": 1024, "h": 2048, "i": 11008}),
    _CatalogueEntry("swiglu_mlp", "llama", {"b": 1, "s": 1024, "h": 4096, "i": 14336}),
    _CatalogueEntry("gelu_mlp", "gpt2", {"b": 4, "s": 1024, "h": 768, "i": 3072}, {"gelu_approximate": "tanh"}),
    _CatalogueEntry("gelu_mlp", "gpt2", {"b": 2, "s": 1024, "h": 1600, "i": 6400}, {"gelu_approximate": "tanh"}),
    _CatalogueEntry("gelu_mlp", "falcon", {"b": 1, "s": 1024, "h": 4544, "i": 18176}, {"gelu_approximate": "none"}),
    # norms with residual: LLaMA-2-7B, Qwen2.5-7B, LLaMA-2-70B hidden sizes; GPT-2 medium/XL, Falcon-7B
    _CatalogueEntry("rmsnorm_residual", "llama", {"b": 4, "s": 2048, "h": 4096}, {"eps": 1e-5}),
    _CatalogueEntry("rmsnorm_residual", "qwen", {"b": 8, "s": 1024, "h": 3584}, {"eps": 1e-6}),
    _CatalogueEntry("rmsnorm_residual", "llama", {"b": 2, "s": 4096, "h": 8192}, {"eps": 1e-5}),
    _CatalogueEntry("layernorm_residual", "gpt2", {"b": 32, "s": 2048, "h": 1024}, {"eps": 1e-5}),
    _CatalogueEntry("layernorm_residual", "gpt2", {"b": 24, "s": 2048, "h": 1600}, {"eps": 1e-5}),
    _CatalogueEntry("layernorm_residual", "falcon", {"b": 8, "s": 2048, "h": 4544}, {"eps": 1e-5}),
    # GPT-2 blocks: small, medium, XL
    _CatalogueEntry("gpt2_block", "gpt2", {"b": 4, "s": 1024, "h": 768, "q": 12}),
    _CatalogueEntry("gpt2_block", "gpt2", {"b": 2, "s": 1024, "h": 1024, "q": 16}),
    _CatalogueEntry("gpt2_block", "gpt2", {"b": 1, "s": 1024, "h": 1600, "q": 25}),
)


def structure_catalogue(families: list[str] | None = None) -> list[StructureTask]:
    """Every catalogue task (or those of `families`), in a stable order. Task ids are unique."""
    if families is not None:
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown structure families {unknown}; known: {sorted(FAMILIES)}")
    tasks = [
        make_structure_task(entry.family, entry.shape, entry.config, entry.model_family)
        for entry in _CATALOGUE
        if families is None or entry.family in families
    ]
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise ValueError(f"duplicate structure task id {task.task_id}")
        seen.add(task.task_id)
    return tasks


def family_of_code(pytorch_code: str) -> str | None:
    """The family named by a catalogue task's header line, or None for code that is not a catalogue task."""
    for line in pytorch_code.splitlines()[:5]:
        if line.startswith(FAMILY_MARKER):
            name = line[len(FAMILY_MARKER) :].strip()
            return name if name in FAMILIES else None
    return None
