"""Element-wise families: unary activations and pointwise math (42 ops, parameterised ones included) inside short
chains (an affine before or after, a residual, a broadcast bias), and binary ops with broadcasting. The reference
runs each step as its own PyTorch kernel; the candidate fuses the chain into one pass, in one of four kernel
styles (grid-stride loop, one element a thread, float4 vector loads, 4-way unrolled). Standard library only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dice_pipeline.synthesis.operators.common import (
    CUDA_PREAMBLE,
    CudaDesign,
    ModelSpec,
    current_stream,
    float_check,
    grid_for,
    launch_check,
    python_names,
    round_sig,
)


@dataclass(frozen=True)
class UnaryOp:
    name: str
    family: str  # activation | pointwise_math
    torch: tuple[str, ...]  # spellings; {v} is the operand, {p} a parameter held as self.<p>
    c: str  # C expression of {v} and the parameters
    params: tuple[tuple[str, float, float], ...] = ()  # (name, low, high), drawn uniformly
    functional: bool = False


def _u(name, family, torch, c, params=(), functional=None):
    spellings = (torch,) if isinstance(torch, str) else tuple(torch)
    uses_f = any("F." in s for s in spellings) if functional is None else functional
    return UnaryOp(name, family, spellings, c, tuple(params), uses_f)


A, M = "activation", "pointwise_math"
UNARY_OPS: dict[str, UnaryOp] = {op.name: op for op in (
    _u("relu", A, ("torch.relu({v})", "F.relu({v})"), "fmaxf({v}, 0.0f)"),
    _u("leaky_relu", A, ("F.leaky_relu({v}, negative_slope={slope})", "F.leaky_relu({v}, {slope})"),
       "({v} > 0.0f ? {v} : {v} * slope)", [("slope", 0.01, 0.3)]),
    _u("elu", A, "F.elu({v}, alpha={alpha})", "({v} > 0.0f ? {v} : alpha * expm1f({v}))", [("alpha", 0.5, 2.0)]),
    _u("selu", A, ("torch.selu({v})", "F.selu({v})"),
       "(1.0507009873554805f * ({v} > 0.0f ? {v} : 1.6732632423543772f * expm1f({v})))"),
    _u("celu", A, "F.celu({v}, alpha={alpha})", "(fmaxf({v}, 0.0f) + fminf(0.0f, alpha * expm1f({v} / alpha)))",
       [("alpha", 0.5, 2.0)]),
    _u("gelu", A, "F.gelu({v})", "(0.5f * {v} * (1.0f + erff({v} * 0.7071067811865476f)))"),
    _u("gelu_tanh", A, 'F.gelu({v}, approximate="tanh")',
       "(0.5f * {v} * (1.0f + tanhf(0.7978845608028654f * ({v} + 0.044715f * {v} * {v} * {v}))))"),
    _u("silu", A, ("F.silu({v})", "{v} * torch.sigmoid({v})"), "({v} / (1.0f + expf(-{v})))"),
    _u("mish", A, ("F.mish({v})", "{v} * torch.tanh(F.softplus({v}))"),
       "({v} * tanhf({v} > 20.0f ? {v} : log1pf(expf({v}))))"),
    _u("softplus", A, "F.softplus({v}, beta={beta}, threshold={threshold})",
       "({v} * beta > threshold ? {v} : log1pf(expf({v} * beta)) / beta)", [("beta", 0.5, 2.0), ("threshold", 10.0, 20.0)]),
    _u("softsign", A, ("F.softsign({v})", "{v} / (1 + torch.abs({v}))"), "({v} / (1.0f + fabsf({v})))"),
    _u("hardtanh", A, "F.hardtanh({v}, min_val={lo}, max_val={hi})", "fminf(fmaxf({v}, lo), hi)",
       [("lo", -2.0, -0.5), ("hi", 0.5, 2.0)]),
    _u("clamp", A, ("torch.clamp({v}, min={lo}, max={hi})", "{v}.clamp({lo}, {hi})"), "fminf(fmaxf({v}, lo), hi)",
       [("lo", -1.5, -0.1), ("hi", 0.1, 1.5)]),
    _u("hardsigmoid", A, "F.hardsigmoid({v})", "fminf(fmaxf({v} / 6.0f + 0.5f, 0.0f), 1.0f)"),
    _u("hardswish", A, "F.hardswish({v})", "({v} * fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f)"),
    _u("sigmoid", A, ("torch.sigmoid({v})", "{v}.sigmoid()"), "(1.0f / (1.0f + expf(-{v})))"),
    _u("tanh", A, ("torch.tanh({v})", "{v}.tanh()"), "tanhf({v})"),
    _u("relu6", A, "F.relu6({v})", "fminf(fmaxf({v}, 0.0f), 6.0f)"),
    _u("logsigmoid", A, "F.logsigmoid({v})", "(fminf({v}, 0.0f) - log1pf(expf(-fabsf({v}))))"),
    _u("tanhshrink", A, "F.tanhshrink({v})", "({v} - tanhf({v}))"),
    _u("softshrink", A, "F.softshrink({v}, lambd={lambd})",
       "({v} > lambd ? {v} - lambd : ({v} < -lambd ? {v} + lambd : 0.0f))", [("lambd", 0.1, 1.0)]),
    _u("hardshrink", A, "F.hardshrink({v}, lambd={lambd})", "(({v} > lambd || {v} < -lambd) ? {v} : 0.0f)",
       [("lambd", 0.1, 1.0)]),
    _u("threshold", A, "F.threshold({v}, {threshold}, {value})", "({v} > threshold ? {v} : value)",
       [("threshold", -0.5, 0.5), ("value", -1.0, 1.0)]),
    _u("swish_beta", A, "{v} * torch.sigmoid({v} * {beta})", "({v} / (1.0f + expf(-beta * {v})))",
       [("beta", 0.5, 2.0)]),
    _u("exp", M, ("torch.exp({v})", "{v}.exp()"), "expf({v})"),
    _u("expm1", M, "torch.expm1({v})", "expm1f({v})"),
    _u("exp2", M, "torch.exp2({v})", "exp2f({v})"),
    _u("log1p_abs", M, "torch.log1p(torch.abs({v}))", "log1pf(fabsf({v}))"),
    _u("log_abs", M, "torch.log(torch.abs({v}) + {eps})", "logf(fabsf({v}) + eps)", [("eps", 0.01, 1.0)]),
    _u("log2_abs", M, "torch.log2(torch.abs({v}) + 1.0)", "log2f(fabsf({v}) + 1.0f)"),
    _u("sqrt_abs", M, ("torch.sqrt(torch.abs({v}))", "{v}.abs().sqrt()"), "sqrtf(fabsf({v}))"),
    _u("rsqrt", M, "torch.rsqrt(torch.abs({v}) + {eps})", "rsqrtf(fabsf({v}) + eps)", [("eps", 0.1, 1.0)]),
    _u("abs", M, ("torch.abs({v})", "{v}.abs()"), "fabsf({v})"),
    _u("square", M, ("torch.square({v})", "{v} * {v}", "{v} ** 2"), "({v} * {v})"),
    _u("cube", M, ("{v} * {v} * {v}", "torch.pow({v}, 3)"), "({v} * {v} * {v})"),
    _u("inv_quadratic", M, "1.0 / (1.0 + {v} * {v})", "(1.0f / (1.0f + {v} * {v}))"),
    _u("sin", M, ("torch.sin({v})", "{v}.sin()"), "sinf({v})"),
    _u("cos", M, "torch.cos({v})", "cosf({v})"),
    _u("erf", M, "torch.erf({v})", "erff({v})"),
    _u("atan", M, "torch.atan({v})", "atanf({v})"),
    _u("sinh", M, "torch.sinh({v})", "sinhf({v})"),
    _u("cosh", M, "torch.cosh({v})", "coshf({v})"),
)}


@dataclass(frozen=True)
class BinaryOp:
    name: str
    torch: str  # {x}, {y} operands; scalars as {scale}, {shift}
    c: str  # C expression of xv, yv, scale, shift
    scalars: tuple[str, ...]


BINARY_OPS: dict[str, BinaryOp] = {op.name: op for op in (
    BinaryOp("gated_sigmoid", "{x} * torch.sigmoid({y}) * {scale}", "xv * (1.0f / (1.0f + expf(-yv))) * scale",
             ("scale",)),
    BinaryOp("squared_difference", "({x} - {y}) ** 2 * {scale}", "(xv - yv) * (xv - yv) * scale", ("scale",)),
    BinaryOp("max_affine", "torch.maximum({x} * {scale}, {y}) + {shift}", "fmaxf(xv * scale, yv) + shift",
             ("scale", "shift")),
    BinaryOp("min_affine", "torch.minimum({x}, {y} * {scale}) - {shift}", "fminf(xv, yv * scale) - shift",
             ("scale", "shift")),
    BinaryOp("safe_div", "{x} / (torch.abs({y}) + 1.0) * {scale}", "xv / (fabsf(yv) + 1.0f) * scale", ("scale",)),
    BinaryOp("mul_add", "{x} * {y} * {scale} + {shift}", "xv * yv * scale + shift", ("scale", "shift")),
    BinaryOp("where_select", "torch.where({x} > {y}, {x} * {scale}, {y} - {shift})",
             "(xv > yv ? xv * scale : yv - shift)", ("scale", "shift")),
    BinaryOp("lerp_affine", "torch.relu(torch.lerp({x}, {y}, {scale}) + {shift})",
             "fmaxf((xv + scale * (yv - xv)) + shift, 0.0f)", ("scale", "shift")),
    BinaryOp("hypot_scale", "torch.hypot({x}, {y}) * {scale} + {shift}", "hypotf(xv, yv) * scale + shift",
             ("scale", "shift")),
    BinaryOp("relu_difference", "torch.relu({x} - {y}) * {scale} + {shift}", "fmaxf(xv - yv, 0.0f) * scale + shift",
             ("scale", "shift")),
    BinaryOp("tanh_sum", "torch.tanh({x} + {y}) * {scale}", "tanhf(xv + yv) * scale", ("scale",)),
    BinaryOp("logaddexp_shift", "torch.logaddexp({x}, {y}) * {scale} - {shift}",
             "(fmaxf(xv, yv) + log1pf(expf(-fabsf(xv - yv)))) * scale - shift", ("scale", "shift")),
    BinaryOp("residual_scale", "({x} + {y} * {scale}) * {shift}", "(xv + yv * scale) * shift", ("scale", "shift")),
)}

STYLES = ("grid_stride", "one_per_thread", "vectorized", "unrolled")
# Ops with a step (their output jumps at a point): inputs computed before them must round as the reference's do.
DISCONTINUOUS_OPS = frozenset({"threshold", "hardshrink"})
UNARY_PATTERNS = ("affine_pre", "affine_post", "residual", "bias_vec", "plain")
BROADCASTS = ("same", "last_dim", "channel")


# --- CUDA ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorArg:
    name: str
    index: str  # full | last_dim | channel


def _index_expr(arg: TensorArg, i: str) -> str:
    if arg.index == "full":
        return f"{arg.name}[{i}]"
    if arg.index == "last_dim":
        return f"{arg.name}[({i}) % features]"
    return f"{arg.name}[(({i}) / inner) % channels]"


def _extra_ints(args: list[TensorArg]) -> list[str]:
    kinds = {a.index for a in args}
    ints = []
    if "last_dim" in kinds:
        ints.append("features")
    if "channel" in kinds:
        ints += ["inner", "channels"]
    return ints


def elementwise_source(*, kernel: str, host: str, device_fn: str, device_body: str, tensors: list[TensorArg],
                       scalars: list[str], style: str, threads: int, shape_checks: list[str]) -> str:
    """A CUDA source with one fused element-wise kernel (in `style`) and its host launcher `host`, which takes the
    tensors then the scalars (as doubles) and returns a new tensor shaped like the first tensor."""
    ints = _extra_ints(tensors)
    scalar_params = "".join(f", float {s}" for s in scalars)
    int_params = "".join(f", int64_t {n}" for n in ints)
    tensor_params = ", ".join(f"const float* __restrict__ {t.name}" for t in tensors)
    call = lambda i: f"{device_fn}({', '.join(_index_expr(t, i) for t in tensors)}{''.join(', ' + s for s in scalars)})"  # noqa: E731
    dev_params = ", ".join(f"float {t.name}_v" for t in tensors) + "".join(f", float {s}" for s in scalars)
    parts = [CUDA_PREAMBLE, f"__device__ __forceinline__ float {device_fn}({dev_params}) {{", device_body, "}", ""]
    scalar_args = "".join(f", {s}" for s in scalars)
    int_args = "".join(f", {n}" for n in ints)
    if style in ("grid_stride", "vectorized"):
        start = ", int64_t start" if style == "vectorized" else ""
        begin = "start + " if style == "vectorized" else ""
        tail = f"{kernel}_tail" if style == "vectorized" else kernel
        parts += [f"__global__ void {tail}({tensor_params}, float* __restrict__ out, int64_t n{start}{int_params}"
                  f"{scalar_params}) {{",
                  "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;",
                  f"    for (int64_t i = {begin}(int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{",
                  f"        out[i] = {call('i')};", "    }", "}", ""]
    if style == "one_per_thread":
        parts += [f"__global__ void {kernel}({tensor_params}, float* __restrict__ out, int64_t n{int_params}"
                  f"{scalar_params}) {{",
                  "    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
                  f"    if (i < n) {{", f"        out[i] = {call('i')};", "    }", "}", ""]
    if style == "unrolled":
        parts += [f"#define {kernel.upper()}_UNROLL 4", "",
                  f"__global__ void {kernel}({tensor_params}, float* __restrict__ out, int64_t n{int_params}"
                  f"{scalar_params}) {{",
                  f"    const int64_t base = (int64_t)blockIdx.x * blockDim.x * {kernel.upper()}_UNROLL + threadIdx.x;",
                  "#pragma unroll",
                  f"    for (int k = 0; k < {kernel.upper()}_UNROLL; ++k) {{",
                  "        const int64_t i = base + (int64_t)k * blockDim.x;",
                  f"        if (i < n) out[i] = {call('i')};", "    }", "}", ""]
    if style == "vectorized":
        full = [t for t in tensors if t.index == "full"]
        vec_params = ", ".join(f"const float4* __restrict__ {t.name}4" if t.index == "full"
                               else f"const float* __restrict__ {t.name}" for t in tensors)
        lanes = ("x", "y", "z", "w")
        body = ["    const int64_t stride = (int64_t)gridDim.x * blockDim.x;",
                "    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {"]
        body += [f"        const float4 {t.name}q = {t.name}4[i];" for t in full]
        body += ["        const int64_t e = i * 4;", "        float4 r;"]
        for lane_index, lane in enumerate(lanes):
            values = [f"{t.name}q.{lane}" if t.index == "full" else _index_expr(t, f"e + {lane_index}")
                      for t in tensors]
            body.append(f"        r.{lane} = {device_fn}({', '.join(values)}{scalar_args});")
        body += ["        out4[i] = r;", "    }"]
        parts += [f"__global__ void {kernel}({vec_params}, float4* __restrict__ out4, int64_t n4{int_params}"
                  f"{scalar_params}) {{", *body, "}", ""]
    # host launcher
    sig = ", ".join(f"torch::Tensor {t.name}" for t in tensors) + "".join(f", double {s}" for s in scalars)
    host_lines = [f"torch::Tensor {host}({sig}) {{"]
    host_lines += [f"    {float_check(t.name)}" for t in tensors]
    host_lines += [f"    auto {t.name}c = {t.name}.contiguous();" for t in tensors]
    first = tensors[0].name
    host_lines += [f"    auto out = torch::empty_like({first}c);", f"    const int64_t n = {first}c.numel();"]
    host_lines += [f"    {line}" for line in shape_checks]
    host_lines += ["    if (n == 0) return out;", f"    {current_stream()}", f"    const int threads = {threads};"]
    ptrs = ", ".join(f"{t.name}c.data_ptr<float>()" for t in tensors)
    casted = "".join(f", (float){s}" for s in scalars)
    if style == "grid_stride":
        host_lines += [f"    const unsigned int blocks = {grid_for('n', threads, 65535 * 8)};",
                       f"    {kernel}<<<blocks, threads, 0, stream>>>({ptrs}, out.data_ptr<float>(), n{int_args}{casted});"]
    elif style == "one_per_thread":
        host_lines += [f"    const unsigned int blocks = {grid_for('n', threads)};",
                       f"    {kernel}<<<blocks, threads, 0, stream>>>({ptrs}, out.data_ptr<float>(), n{int_args}{casted});"]
    elif style == "unrolled":
        host_lines += [f"    const unsigned int blocks = {grid_for('n', f'{threads} * {kernel.upper()}_UNROLL')};",
                       f"    {kernel}<<<blocks, threads, 0, stream>>>({ptrs}, out.data_ptr<float>(), n{int_args}{casted});"]
    else:
        full = [t for t in tensors if t.index == "full"]
        aligned = " && ".join(f"(reinterpret_cast<uintptr_t>({t.name}c.data_ptr<float>()) % 16 == 0)" for t in full)
        vec_ptrs = ", ".join(f"reinterpret_cast<const float4*>({t.name}c.data_ptr<float>())" if t.index == "full"
                             else f"{t.name}c.data_ptr<float>()" for t in tensors)
        host_lines += [f"    const bool aligned = {aligned} && (reinterpret_cast<uintptr_t>(out.data_ptr<float>()) % 16 == 0);",
                       "    const int64_t n4 = aligned ? n / 4 : 0;",
                       "    if (n4 > 0) {",
                       f"        const unsigned int blocks = {grid_for('n4', threads, 65535 * 8)};",
                       f"        {kernel}<<<blocks, threads, 0, stream>>>({vec_ptrs}, "
                       f"reinterpret_cast<float4*>(out.data_ptr<float>()), n4{int_args}{casted});",
                       f"        {launch_check()}", "    }",
                       "    const int64_t done = n4 * 4;",
                       "    if (done < n) {",
                       f"        const unsigned int blocks = {grid_for('n - done', threads, 65535 * 8)};",
                       f"        {kernel}_tail<<<blocks, threads, 0, stream>>>({ptrs}, out.data_ptr<float>(), n, done"
                       f"{int_args}{casted});",
                       "    }"]
    host_lines += [f"    {launch_check()}", "    return out;", "}"]
    return "\n".join(parts + host_lines) + "\n"


def host_prototype(host: str, tensors: list[str], scalars: list[str]) -> str:
    sig = ", ".join(f"torch::Tensor {t}" for t in tensors) + "".join(f", double {s}" for s in scalars)
    return f"torch::Tensor {host}({sig});"


# --- shapes ----------------------------------------------------------------------------------------------------------
def elementwise_shape(rng: random.Random, rank: int | None = None) -> list[tuple[str, int]]:
    """Module-level sizes of an input of 4M-32M elements (16-128 MB): large enough that the reference is not
    launch-bound, small enough that a judgement stays quick."""
    rank = rank or rng.choice((2, 2, 3, 4))
    total = 2 ** rng.randint(22, 25) * rng.choice((1, 1, 3)) // (2 if rng.random() < 0.3 else 1)
    if rank == 2:
        dim = rng.choice((1024, 2048, 4096, 8192, 16384, 1000, 3000, 5120))
        return [("batch_size", max(1, total // dim)), ("dim", dim)]
    if rank == 3:
        channels = rng.choice((16, 32, 64, 96, 128, 256))
        length = rng.choice((1024, 2048, 4096, 1536, 4000))
        return [("batch_size", max(1, total // (channels * length))), ("channels", channels), ("length", length)]
    channels = rng.choice((16, 32, 64, 3, 128))
    side = rng.choice((64, 128, 256, 112, 224))
    return [("batch_size", max(1, total // (channels * side * side))), ("channels", channels), ("height", side),
            ("width", side)]


def draw_param(rng: random.Random, low: float, high: float) -> float:
    return round_sig(rng.uniform(low, high), 3)


def _nonzero(rng: random.Random, low: float, high: float) -> float:
    value = draw_param(rng, low, high)
    return value if abs(value) > 1e-3 else 0.5


# --- unary families -------------------------------------------------------------------------------------------------
def unary_design_space(family: str) -> list[tuple[str, str, str]]:
    """(op, pattern, style) combinations of a unary family. The `plain` pattern (the op alone) is left out: it is
    KernelBench level 1's own activation tasks (19-32) over again, and decontamination would drop it anyway."""
    return [(op.name, pattern, style) for op in UNARY_OPS.values() if op.family == family
            for pattern in UNARY_PATTERNS if pattern != "plain" for style in STYLES]


def _sub(template: str, v: str, params: dict[str, str]) -> str:
    return template.format(v=v, **params)


def build_unary(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    """One instance of a unary design: the pieces `catalogue.build_instance` renders into the two files."""
    op_name, pattern, style = design
    op = UNARY_OPS[op_name]
    names = python_names(rng, 1)
    x = names.inputs[0]
    sizes = elementwise_shape(rng, 2 if pattern == "bias_vec" else None)
    op_values = {name: draw_param(rng, low, high) for name, low, high in op.params}
    if op_name in ("hardtanh", "clamp") and op_values["lo"] >= op_values["hi"]:
        op_values["lo"], op_values["hi"] = -0.5, 0.5
    scale = _nonzero(rng, 0.25, 2.0) * (-1 if rng.random() < 0.2 else 1)
    shift = draw_param(rng, -1.0, 1.0)
    gain = _nonzero(rng, 0.5, 2.0)
    # Four PyTorch kernels a chain (three measured about 2x fused on an H100, borderline for a 2.0x threshold).
    chain_scalars = {"plain": [], "affine_pre": [("scale", scale), ("shift", shift), ("gain", gain)],
                     "affine_post": [("gain", gain), ("scale", scale), ("shift", shift)],
                     "residual": [("scale", scale), ("shift", shift)],
                     "bias_vec": [("scale", scale), ("shift", shift)]}[pattern]
    scalars_py: list[tuple[str, float]] = chain_scalars + [(name, value) for name, value in op_values.items()]
    self_params = {name: f"self.{name}" for name, _ in scalars_py}
    init_lines = [f"self.{name} = {name}" for name, _ in scalars_py]
    if pattern == "bias_vec":
        init_lines.append("self.bias = nn.Parameter(torch.randn(dim) * 0.1)")
    spelling = rng.choice(op.torch)
    op_expr = lambda v: _sub(spelling, v, self_params)  # noqa: E731
    multi_line = rng.random() < 0.5
    affine = f"{x} * self.scale + self.shift"
    if pattern == "plain":
        forward = [f"return {op_expr(x)}"]
    elif pattern == "affine_pre":
        forward = ([f"{x} = {affine}", f"{x} = {op_expr(x)}", f"return {x} * self.gain"] if multi_line
                   else [f"return {op_expr(f'({affine})')} * self.gain"])
    elif pattern == "affine_post":
        forward = ([f"y = {op_expr(f'({x} * self.gain)')}", "return y * self.scale + self.shift"] if multi_line
                   else [f"return {op_expr(f'({x} * self.gain)')} * self.scale + self.shift"])
    elif pattern == "residual":
        forward = ([f"y = {op_expr(f'({affine})')}", f"return y + {x}"] if multi_line
                   else [f"return {op_expr(f'({affine})')} + {x}"])
    else:
        forward = ([f"y = {x} + self.bias", f"y = {op_expr('y')}", "return y * self.scale + self.shift"]
                   if multi_line else [f"return {op_expr(f'({x} + self.bias)')} * self.scale + self.shift"])
    # CUDA: the device function holds the chain; parameters keep their Python names. Before an op with a step
    # the affine rounds its multiply and its add separately, as the reference's two kernels do: a fused
    # multiply-add would move values within an ulp of the step to its other side (16M elements hold some).
    c_op = lambda v: _sub(op.c, v, {name: name for name in op_values})  # noqa: E731
    exact = op_name in DISCONTINUOUS_OPS
    pre_affine = "__fadd_rn(__fmul_rn(x_v, scale), shift)" if exact else "x_v * scale + shift"
    body = {"plain": f"    return {c_op('x_v')};",
            "affine_pre": f"    const float u = {pre_affine};\n    return {c_op('u')} * gain;",
            "affine_post": f"    const float u = x_v * gain;\n    return {c_op('u')} * scale + shift;",
            "residual": f"    const float u = {pre_affine};\n    return {c_op('u')} + x_v;",
            "bias_vec": f"    const float u = x_v + bias_v;\n    return {c_op('u')} * scale + shift;"}[pattern]
    tensors = [TensorArg("x", "full")] + ([TensorArg("bias", "last_dim")] if pattern == "bias_vec" else [])
    scalar_names = [name for name, _ in scalars_py]
    stems = (f"{op_name}", f"fused_{op_name}", f"{op_name}_{pattern}")
    stem = stems[cuda_names % len(stems)]
    kernel, host = f"{stem}_kernel", f"{stem}_forward" if cuda_names % 2 == 0 else f"{stem}_cuda"
    checks = ['TORCH_CHECK(xc.size(-1) == biasc.numel(), "bias must match the last dimension");',
              "const int64_t features = biasc.numel();"] if pattern == "bias_vec" else []
    cuda = elementwise_source(kernel=kernel, host=host, device_fn=f"{stem}_op", device_body=body, tensors=tensors,
                              scalars=scalar_names, style=style, threads=(256, 512, 128)[cuda_names % 3],
                              shape_checks=checks)
    design_obj = CudaDesign(cuda=cuda, prototypes=(host_prototype(host, [t.name for t in tensors], scalar_names),),
                            functions=(host,), stem=f"{op_name}_{style}")
    call_args = [x] + (["self.bias"] if pattern == "bias_vec" else []) + [f"self.{n}" for n in scalar_names]
    sizes_dict = dict(sizes)
    shape_expr = ", ".join(name for name, _ in sizes)
    spec = ModelSpec(
        docstring=_unary_doc(rng, op_name, pattern),
        # the bias is sized from a constructor argument: the candidate file has no module-level sizes
        init_args=([("dim", "dim")] if pattern == "bias_vec" else []) + scalars_py,
        init_lines=init_lines,
        sizes=sizes,
        input_lines=[f"{x} = torch.randn({shape_expr})"],
        needs_functional=op.functional,
    )
    return {"op": op_name, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call_args)})"],
            "params": {"pattern": pattern, **sizes_dict, **dict(scalars_py)}}


def _unary_doc(rng: random.Random, op: str, pattern: str) -> str:
    what = {"affine_pre": f"an affine transform, {op} and a gain", "affine_post": f"{op} of a scaled input "
            "followed by an affine map", "residual": f"{op} of an affine transform with a residual connection",
            "bias_vec": f"{op} of the input plus a learned bias, then an affine map",
            "plain": f"the {op} activation"}[pattern]
    return rng.choice((f"Applies {what}.", f"Simple model that computes {what}.",
                       f"Element-wise model: {what}.", f"A small block computing {what} on its input."))


# --- binary family --------------------------------------------------------------------------------------------------
def binary_design_space() -> list[tuple[str, str, str]]:
    return [(op, broadcast, style) for op in BINARY_OPS for broadcast in BROADCASTS for style in STYLES]


def build_binary(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    op_name, broadcast, style = design
    op = BINARY_OPS[op_name]
    names = python_names(rng, 2)
    x, y = names.inputs
    sizes = elementwise_shape(rng, 2 if broadcast == "last_dim" else 3 if broadcast == "channel" else None)
    shape_expr = ", ".join(name for name, _ in sizes)
    if broadcast == "same":
        y_line = f"{y} = torch.randn({shape_expr})"
    elif broadcast == "last_dim":
        y_line = f"{y} = torch.randn(dim)"
    else:
        y_line = f"{y} = torch.randn(channels, 1)"
    scalars_py = [("scale", _nonzero(rng, 0.25, 2.0)), ("shift", draw_param(rng, -1.0, 1.0))]
    scalars_py = [(n, v) for n, v in scalars_py if n in op.scalars]
    if op_name == "lerp_affine":
        scalars_py = [("scale", draw_param(rng, 0.1, 0.9))] + [(n, v) for n, v in scalars_py if n == "shift"]
    expr = op.torch.format(x=x, y=y, scale="self.scale", shift="self.shift")
    forward = [f"return {expr}"] if rng.random() < 0.6 else [f"out = {expr}", "return out"]
    index = {"same": "full", "last_dim": "last_dim", "channel": "channel"}[broadcast]
    tensors = [TensorArg("x", "full"), TensorArg("y", index)]
    checks = []
    if broadcast == "same":
        checks = ['TORCH_CHECK(xc.sizes() == yc.sizes(), "x and y must have the same shape");']
    elif broadcast == "last_dim":
        checks = ['TORCH_CHECK(xc.size(-1) == yc.numel(), "y must match the last dimension of x");',
                  "const int64_t features = yc.numel();"]
    else:
        checks = ['TORCH_CHECK(xc.dim() == 3 && xc.size(1) == yc.numel(), "y must hold one value per channel");',
                  "const int64_t channels = yc.numel();", "const int64_t inner = xc.size(2);"]
    body = "    const float xv = x_v;\n    const float yv = y_v;\n    return " + op.c + ";"
    stems = (op_name, f"{op_name}_bcast", f"fused_{op_name}")
    stem = stems[cuda_names % len(stems)]
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    scalar_names = [n for n, _ in scalars_py]
    cuda = elementwise_source(kernel=kernel, host=host, device_fn=f"{stem}_op", device_body=body, tensors=tensors,
                              scalars=scalar_names, style=style, threads=(256, 128, 512)[cuda_names % 3],
                              shape_checks=checks)
    design_obj = CudaDesign(cuda=cuda, prototypes=(host_prototype(host, ["x", "y"], scalar_names),),
                            functions=(host,), stem=f"{op_name}_{broadcast}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"Computes {op_name.replace('_', ' ')} of two tensors ({broadcast} broadcasting).",
                              f"Binary element-wise model: {op_name.replace('_', ' ')}.",
                              f"Combines two inputs with {op_name.replace('_', ' ')}.")),
        init_args=scalars_py, init_lines=[f"self.{n} = {n}" for n, _ in scalars_py], sizes=sizes,
        input_lines=[f"{x} = torch.randn({shape_expr})", y_line])
    call = ", ".join([x, y] + [f"self.{n}" for n in scalar_names])
    return {"op": op_name, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"broadcast": broadcast, **dict(sizes), **dict(scalars_py)}}


__all__ = ["BINARY_OPS", "STYLES", "UNARY_OPS", "build_binary", "build_unary", "binary_design_space",
           "elementwise_shape", "elementwise_source", "host_prototype", "unary_design_space"]
