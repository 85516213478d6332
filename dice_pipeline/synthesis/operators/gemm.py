"""GEMM and convolution families, the shape of most ConCuR pairs: the matrix product or the convolution stays in
cuBLAS/cuDNN (called from the extension's C++), and everything after it (bias, scale, activation, clamp: 2-4 ops
the reference runs as separate kernels) is one custom epilogue kernel applied in place. Variants: nn.Linear,
a weight matrix, batched (bmm), a transposed operand; Conv2d with per-channel epilogues. Standard library only.
"""

from __future__ import annotations

import random

from dice_pipeline.synthesis.operators.common import (
    ACTIVATIONS,
    CUDA_PREAMBLE,
    CudaDesign,
    ModelSpec,
    current_stream,
    float_check,
    launch_check,
    python_names,
    round_sig,
)

# Epilogue steps: (torch spelling applied to {y}, C statement on v). Bias is per output column (GEMM) or channel.
STEPS = {
    "bias": ("{y} + self.bias", "v = v + bias_v;"),
    "scale": ("{y} * self.scale", "v = v * scale;"),
    "shift": ("{y} + self.shift", "v = v + shift;"),
    "clamp": ("torch.clamp({y}, min=self.lo, max=self.hi)", "v = fminf(fmaxf(v, lo), hi);"),
    **{name: (torch_form, f"v = {c_form};") for name, (torch_form, c_form) in ACTIVATIONS.items()},
    "leaky_relu": ("F.leaky_relu({y}, 0.01)", "v = v > 0.0f ? v : 0.01f * v;"),
    "hardswish": ("F.hardswish({y})", "v = v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f;"),
    "mish": ("F.mish({y})", "v = v * tanhf(v > 20.0f ? v : log1pf(expf(v)));"),
    "elu": ("F.elu({y})", "v = v > 0.0f ? v : expm1f(v);"),
}
CHAINS = (
    ("relu", "scale"), ("gelu", "scale"), ("silu", "scale", "shift"), ("tanh", "scale", "shift"),
    ("sigmoid", "scale"), ("scale", "clamp"), ("hardswish", "shift"), ("mish", "scale"), ("leaky_relu", "scale"),
    ("elu", "clamp"), ("scale", "relu", "shift"), ("gelu", "scale", "clamp"), ("shift", "tanh", "scale"),
    ("relu", "scale", "clamp"),
)
GEMM_VARIANTS = ("linear", "matmul_weight", "bmm", "matmul_transposed")
EPILOGUE_STYLES = ("grid_stride", "vectorized")


def _scalars(chain: tuple[str, ...]) -> list[str]:
    found = []
    for step in chain:
        found += {"scale": ["scale"], "shift": ["shift"], "clamp": ["lo", "hi"]}.get(step, [])
    return found


def _draw(rng: random.Random, names: list[str]) -> list[tuple[str, float]]:
    values = {"scale": round_sig(rng.uniform(0.5, 2.0)), "shift": round_sig(rng.uniform(-0.5, 0.5)),
              "lo": round_sig(rng.uniform(-1.0, -0.2)), "hi": round_sig(rng.uniform(0.2, 1.0))}
    return [(n, values[n]) for n in names]


def _epilogue_kernels(prefix: str, kernel: str, statements: list[str], scalars: list[str], style: str,
                      index: str, second_bias: bool = False) -> str:
    """In-place epilogue over a contiguous output: `index` is the bias position of element i ("i % cols" for a
    GEMM's columns, "(i / plane) % cols" for a convolution's channels). `second_bias`: a second per-position
    bias added with the first (a convolution's own bias, kept out of the cuDNN call so no PyTorch kernel but the
    convolution runs)."""
    params = "".join(f", float {s}" for s in scalars)
    args = "".join(f", {s}" for s in scalars)
    body = "\n".join(f"    {s}" for s in statements)
    bias2_param = ", const float* __restrict__ bias2" if second_bias else ""

    def bias_at(i: str) -> str:
        position = index.format(i=i)
        return f"bias[{position}] + bias2[{position}]" if second_bias else f"bias[{position}]"

    lines = [f"__device__ __forceinline__ float {prefix}_epilogue(float v, float bias_v{params}) {{", body,
             "    return v;", "}", "",
             f"__global__ void {kernel}{'_tail' if style == 'vectorized' else ''}(float* __restrict__ y, "
             f"const float* __restrict__ bias{bias2_param}, int64_t n, int64_t start, int64_t cols, int64_t plane"
             f"{params}) {{",
             "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;",
             "    for (int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {",
             f"        y[i] = {prefix}_epilogue(y[i], {bias_at('i')}{args});", "    }", "}", ""]
    if style == "vectorized":
        lanes = "".join(f"        r.{c} = {prefix}_epilogue(r.{c}, {bias_at(f'e + {k}')}{args});\n"
                        for k, c in enumerate("xyzw"))
        lines += [f"__global__ void {kernel}(float4* __restrict__ y4, const float* __restrict__ bias{bias2_param}, "
                  f"int64_t n4, int64_t cols, int64_t plane{params}) {{",
                  "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;",
                  "    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {",
                  "        float4 r = y4[i];", "        const int64_t e = i * 4;", lanes.rstrip("\n"),
                  "        y4[i] = r;", "    }", "}", ""]
    return "\n".join(lines)


def _epilogue_launch(kernel: str, scalars: list[str], style: str, threads: int, second_bias: bool = False
                     ) -> list[str]:
    casted = "".join(f", (float){s}" for s in scalars)
    biases = "biasc.data_ptr<float>()" + (", bias2c.data_ptr<float>()" if second_bias else "")
    grid = lambda count: f"(unsigned int)std::max<int64_t>(1, std::min<int64_t>(({count} + {threads} - 1) / {threads}, 65535 * 8))"  # noqa: E731
    if style == "grid_stride":
        return [f"    {kernel}<<<{grid('n')}, {threads}, 0, stream>>>(y.data_ptr<float>(), {biases}, n, 0, "
                f"cols, plane{casted});", f"    {launch_check()}"]
    return ["    const bool aligned = reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;",
            "    const int64_t n4 = aligned ? n / 4 : 0;", "    if (n4 > 0) {",
            f"        {kernel}<<<{grid('n4')}, {threads}, 0, stream>>>(reinterpret_cast<float4*>(y.data_ptr<float>()), "
            f"{biases}, n4, cols, plane{casted});", f"        {launch_check()}", "    }",
            "    if (n4 * 4 < n) {",
            f"        {kernel}_tail<<<{grid('n - n4 * 4')}, {threads}, 0, stream>>>(y.data_ptr<float>(), "
            f"{biases}, n, n4 * 4, cols, plane{casted});", f"        {launch_check()}", "    }"]


def gemm_design_space() -> list[tuple[str, tuple[str, ...], str]]:
    return [(variant, chain, style) for variant in GEMM_VARIANTS for chain in CHAINS for style in EPILOGUE_STYLES]


def build_gemm(rng: random.Random, design: tuple[str, tuple[str, ...], str], cuda_names: int) -> dict:
    variant, chain, style = design
    names = python_names(rng, 2 if variant in ("bmm", "matmul_transposed") else 1)
    scalars = _draw(rng, _scalars(chain))
    # Small inner dimensions keep the product cheap beside the epilogue's memory traffic, as in the tall-skinny
    # projections and small-K layers where fusion pays.
    k = rng.choice((16, 32, 32, 64, 64, 128, 256))
    n_out = rng.choice((1024, 2048, 4096, 3072, 8192))
    rows = max(256, 2 ** rng.randint(22, 25) // n_out)
    full = ("bias",) + chain
    steps = " -> ".join(full)
    init_lines = [f"self.{n} = {n}" for n, _ in scalars]
    if variant == "linear":
        x = names.inputs[0]
        sizes = [("batch_size", rows), ("in_features", k), ("out_features", n_out)]
        init_args = [("in_features", "in_features"), ("out_features", "out_features")] + scalars
        init_lines = ["self.linear = nn.Linear(in_features, out_features)"] + init_lines
        first = f"y = self.linear({x})"
        inputs = [f"{x} = torch.randn(batch_size, in_features)"]
        product = "at::mm(xc, weightc.t())"
        tensor_args = ["x", "weight", "bias"]
        call = [x, "self.linear.weight", "self.linear.bias"]
        applied = chain
    else:
        init_args = [("out_features", "out_features")] + scalars
        init_lines = ["self.bias = nn.Parameter(0.1 * torch.randn(out_features))"] + init_lines
        applied = full
        if variant == "matmul_weight":
            x = names.inputs[0]
            sizes = [("batch_size", rows), ("in_features", k), ("out_features", n_out)]
            init_args = [("in_features", "in_features")] + init_args
            init_lines = ["self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features ** 0.5)"] \
                + init_lines
            first = f"y = torch.matmul({x}, self.weight)"
            inputs = [f"{x} = torch.randn(batch_size, in_features)"]
            product = "at::mm(xc, weightc)"
            tensor_args = ["x", "weight", "bias"]
            call = [x, "self.weight", "self.bias"]
        elif variant == "bmm":
            a, b = names.inputs
            batch = rng.choice((4, 8, 16, 32))
            sizes = [("batch", batch), ("m", max(64, rows // batch)), ("k", k), ("out_features", n_out)]
            first = f"y = torch.bmm({a}, {b})"
            inputs = [f"{a} = torch.randn(batch, m, k)", f"{b} = torch.randn(batch, k, out_features) / k ** 0.5"]
            product = "at::bmm(xc, weightc)"
            tensor_args = ["x", "weight", "bias"]
            call = [a, b, "self.bias"]
        else:
            a, b = names.inputs
            sizes = [("k", k), ("m", rows), ("out_features", n_out)]
            first = f"y = torch.matmul({a}.t(), {b})"
            inputs = [f"{a} = torch.randn(k, m)", f"{b} = torch.randn(k, out_features) / k ** 0.5"]
            product = "at::mm(xc.t(), weightc)"
            tensor_args = ["x", "weight", "bias"]
            call = [a, b, "self.bias"]
    first = first.replace("y = ", "h = ", 1)
    forward = [first] + [f"h = {STEPS[s][0].format(y='h')}" for s in applied] + ["return h"]
    prefix = ("gemm", "mm", "proj")[cuda_names % 3]
    stem = f"{variant}_{'_'.join(chain)}"
    kernel, host = f"{stem}_epilogue", f"{stem}_forward"
    scalar_names = [n for n, _ in scalars]
    statements = [STEPS[s][1] for s in full]
    sig = ", ".join(f"torch::Tensor {t}" for t in tensor_args) + "".join(f", double {s}" for s in scalar_names)
    threads = (256, 512)[cuda_names % 2]
    cuda = "\n".join([
        CUDA_PREAMBLE,
        _epilogue_kernels(prefix, kernel, statements, scalar_names, style, "({i}) % cols"),
        f"torch::Tensor {host}({sig}) {{",
        *[f"    {float_check(t)}" for t in tensor_args],
        *[f"    auto {t}c = {t}.contiguous();" for t in tensor_args],
        "    // The product stays in cuBLAS; the epilogue runs in place on its output.",
        f"    auto y = {product}.contiguous();",
        "    const int64_t n = y.numel();", "    const int64_t cols = y.size(-1);", "    const int64_t plane = 1;",
        '    TORCH_CHECK(biasc.numel() == cols, "bias must have one value per output column");',
        "    if (n == 0) return y;", f"    {current_stream()}",
        *_epilogue_launch(kernel, scalar_names, style, threads), "    return y;", "}", ""])
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}({sig});",), functions=(host,),
                            stem=f"{variant}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"A {variant.replace('_', ' ')} followed by {steps}.",
                              f"Simple model: matrix multiplication, then {steps}.",
                              f"Projection layer ({variant}) with a {len(full)}-step epilogue: {steps}.")),
        init_args=init_args, init_lines=init_lines, sizes=sizes, input_lines=inputs,
        needs_functional=any(STEPS[s][0].startswith("F.") for s in full))
    call += [f"self.{n}" for n in scalar_names]
    return {"op": variant, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"chain": list(full), **dict(sizes), **dict(scalars)}}


def conv_design_space() -> list[tuple[str, tuple[str, ...], str]]:
    return [("conv2d", chain, style) for chain in CHAINS for style in EPILOGUE_STYLES]


def build_conv(rng: random.Random, design: tuple[str, tuple[str, ...], str], cuda_names: int) -> dict:
    _, chain, style = design
    names = python_names(rng, 1)
    x = names.inputs[0]
    scalars = _draw(rng, _scalars(chain))
    cin = rng.choice((3, 4, 8, 16))
    cout = rng.choice((16, 32, 64))
    kernel_size = rng.choice((1, 3, 3))
    side = rng.choice((64, 96, 128, 192, 256))
    batch = max(2, 2 ** rng.randint(22, 24) // (cout * side * side))
    padding = kernel_size // 2
    sizes = [("batch_size", batch), ("in_channels", cin), ("out_channels", cout), ("kernel_size", kernel_size),
             ("height", side), ("width", side)]
    init_args = [("in_channels", "in_channels"), ("out_channels", "out_channels"), ("kernel_size", "kernel_size")] \
        + scalars
    init_lines = [f"self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding={padding})",
                  "self.channel_bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))",
                  *[f"self.{n} = {n}" for n, _ in scalars]]
    full = ("bias",) + chain
    forward = [f"h = self.conv({x})", "h = h + self.channel_bias"] + \
        [f"h = {STEPS[s][0].format(y='h')}" for s in chain] + ["return h"]
    prefix = ("conv", "cv", "epi")[cuda_names % 3]
    stem = f"conv2d_{'_'.join(chain)}"
    kernel, host = f"{stem}_epilogue", f"{stem}_forward"
    scalar_names = [n for n, _ in scalars]
    sig = ("torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias, torch::Tensor bias, int64_t padding"
           + "".join(f", double {s}" for s in scalar_names))
    threads = (256, 512)[cuda_names % 2]
    cuda = "\n".join([
        CUDA_PREAMBLE,
        _epilogue_kernels(prefix, kernel, [STEPS[s][1] for s in full], scalar_names, style, "(({i}) / plane) % cols",
                          second_bias=True),
        f"torch::Tensor {host}({sig}) {{", f"    {float_check('x')}", f"    {float_check('weight')}",
        f"    {float_check('conv_bias')}", f"    {float_check('bias')}", "    auto biasc = conv_bias.contiguous();",
        "    auto bias2c = bias.contiguous();",
        "    // The convolution stays in cuDNN, without its bias: both biases and the rest of the epilogue run in",
        "    // one pass, in place on its output.",
        "    auto y = at::conv2d(x.contiguous(), weight, {}, {1, 1}, {padding, padding}).contiguous();",
        "    const int64_t n = y.numel();", "    const int64_t cols = y.size(1);",
        "    const int64_t plane = y.size(2) * y.size(3);",
        '    TORCH_CHECK(biasc.numel() == cols && bias2c.numel() == cols, "one bias value per output channel");',
        "    if (n == 0) return y;", f"    {current_stream()}",
        *_epilogue_launch(kernel, scalar_names, style, threads, second_bias=True), "    return y;", "}", ""])
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}({sig});",), functions=(host,),
                            stem=f"conv2d_{style}")
    steps = " -> ".join(full)
    spec = ModelSpec(
        docstring=rng.choice((f"Conv2d followed by {steps}.", f"A convolution with a fused-able epilogue: {steps}.",
                              f"Simple model that performs a 2D convolution, then {steps}.")),
        init_args=init_args, init_lines=init_lines, sizes=sizes,
        input_lines=[f"{x} = torch.randn(batch_size, in_channels, height, width)"],
        needs_functional=any(STEPS[s][0].startswith("F.") for s in chain))
    call = [x, "self.conv.weight", "self.conv.bias", "self.channel_bias", str(padding)] + \
        [f"self.{n}" for n in scalar_names]
    return {"op": "conv2d", "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"chain": list(full), "padding": padding, **dict(sizes), **dict(scalars)}}


__all__ = ["CHAINS", "STEPS", "build_conv", "build_gemm", "conv_design_space", "gemm_design_space"]
