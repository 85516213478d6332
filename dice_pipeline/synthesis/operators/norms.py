"""Normalisation families. Row norms (LayerNorm and RMSNorm over the last dimension, written out op by op or
through F.layer_norm / nn.LayerNorm after a residual add) run a warp or a block a row: statistics in two passes
(mean, then the centred sum of squares) over a row that stays in L2, then one write with the affine and the
activation that follows. Channel norms: batch norm in eval mode (an element-wise kernel with per-channel
statistics), instance norm and group norm (a block a plane or a group). Standard library only.
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
)
from dice_pipeline.synthesis.operators.elementwise import TensorArg, elementwise_source, host_prototype

# The activation after a norm: name -> (torch spelling of {y}, C expression of v).
NORM_ACTIVATIONS = {"none": ("{y}", "v"), **{name: ACTIVATIONS[name] for name in ("relu", "gelu", "silu", "tanh")}}

ROW_NORM_OPS = ("layernorm_manual", "layernorm_functional", "layernorm_module", "rmsnorm_manual")
ROW_STYLES = ("warp_per_row", "block_per_row")


def row_norm_design_space() -> list[tuple[str, str, str]]:
    return [(op, act, style) for op in ROW_NORM_OPS for act in NORM_ACTIVATIONS for style in ROW_STYLES
            if not (op != "rmsnorm_manual" and op != "layernorm_manual" and act == "none")]


def sum_reducers(prefix: str) -> str:
    return f"""__device__ __forceinline__ float {prefix}_warp_sum(float v) {{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}}

__device__ float {prefix}_block_sum(float v, float* shared) {{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = {prefix}_warp_sum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = (threadIdx.x < warps) ? shared[threadIdx.x] : 0.0f;
    if (warp == 0) v = {prefix}_warp_sum(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}}
"""


def build_row_norm(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    op, act, style = design
    rms = op == "rmsnorm_manual"
    residual = op in ("layernorm_functional", "layernorm_module") or (not rms and rng.random() < 0.25)
    names = python_names(rng, 2 if residual else 1)
    x = names.inputs[0]
    dim = rng.choice((256, 512, 768, 1024, 2048, 4096, 5120, 8192))
    total = 2 ** rng.randint(22, 25)
    three_d = rng.random() < 0.5
    if three_d:
        seq = rng.choice((64, 128, 256, 512))
        sizes = [("batch_size", max(2, total // (dim * seq))), ("seq_len", seq), ("hidden", dim)]
    else:
        sizes = [("batch_size", max(1024, total // dim)), ("hidden", dim)]
    shape = ", ".join(n for n, _ in sizes)
    eps = rng.choice((1e-5, 1e-6, 1e-5, 1e-8))
    act_torch, act_c = NORM_ACTIVATIONS[act]
    needs_f = act in ("gelu", "silu")
    if op == "layernorm_module":
        init_lines = ["self.norm = nn.LayerNorm(hidden, eps=eps)"]
        weight, bias = "self.norm.weight", "self.norm.bias"
    else:
        init_lines = ["self.eps = eps", "self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))"]
        if not rms:
            init_lines.append("self.bias = nn.Parameter(0.1 * torch.randn(hidden))")
        weight, bias = "self.weight", "self.bias"
    src = f"{x} + {names.inputs[1]}" if residual else x
    h = "h" if residual else x
    forward = [f"h = {src}"] if residual else []
    if op == "layernorm_manual":
        var = rng.choice((f"(({h} - mean) ** 2).mean(dim=-1, keepdim=True)",
                          f"{h}.var(dim=-1, keepdim=True, unbiased=False)"))
        forward += [f"mean = {h}.mean(dim=-1, keepdim=True)", f"var = {var}",
                    f"y = ({h} - mean) / torch.sqrt(var + self.eps)", "y = y * self.weight + self.bias"]
    elif op == "rmsnorm_manual":
        forward += [rng.choice((f"y = {h} * torch.rsqrt({h}.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
                                f"y = {h} / torch.sqrt(torch.mean({h} ** 2, dim=-1, keepdim=True) + self.eps)")),
                    "y = y * self.weight"]
    elif op == "layernorm_functional":
        needs_f = True
        forward += [f"y = F.layer_norm({h}, ({h}.shape[-1],), self.weight, self.bias, self.eps)"]
    else:
        forward += [f"y = self.norm({h})"]
    forward.append(f"return {act_torch.format(y='y')}")
    prefix = ("ln", "rn", "nrm")[cuda_names % 3]
    stem = f"{op}_{act}" + ("_res" if residual else "")
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    load = "(p[j] + pr[j])" if residual else "p[j]"
    warp = style == "warp_per_row"
    params = "const float* __restrict__ x" + (", const float* __restrict__ res" if residual else "") + \
        ", const float* __restrict__ w" + ("" if rms else ", const float* __restrict__ b")
    lines = [CUDA_PREAMBLE, sum_reducers(prefix),
             f"__device__ __forceinline__ float {prefix}_act(float v) {{ return {act_c}; }}", "",
             f"__global__ void {kernel}({params}, float* __restrict__ out, int64_t rows, int64_t dim, float eps) {{"]
    if warp:
        lines += ["    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
                  "    if (row >= rows) return;", "    const int64_t first = threadIdx.x & 31, step = 32;"]
        total_of = lambda v: f"{prefix}_warp_sum({v})"  # noqa: E731
    else:
        lines += ["    __shared__ float shared[32];", "    const int64_t row = blockIdx.x;",
                  "    const int64_t first = threadIdx.x, step = blockDim.x;"]
        total_of = lambda v: f"{prefix}_block_sum({v}, shared)"  # noqa: E731
    lines += ["    const float* p = x + row * dim;", "    float* q = out + row * dim;"]
    if residual:
        lines.append("    const float* pr = res + row * dim;")
    if rms:
        lines += ["    float acc = 0.0f;", f"    for (int64_t j = first; j < dim; j += step) {{ const float v = {load}; "
                  "acc += v * v; }", f"    const float inv = rsqrtf({total_of('acc')} / (float)dim + eps);",
                  f"    for (int64_t j = first; j < dim; j += step) q[j] = {prefix}_act({load} * inv * w[j]);", "}"]
    else:
        lines += ["    float acc = 0.0f;", f"    for (int64_t j = first; j < dim; j += step) acc += {load};",
                  f"    const float mean = {total_of('acc')} / (float)dim;", "    float dev = 0.0f;",
                  f"    for (int64_t j = first; j < dim; j += step) {{ const float d = {load} - mean; dev += d * d; }}",
                  f"    const float inv = rsqrtf({total_of('dev')} / (float)dim + eps);",
                  f"    for (int64_t j = first; j < dim; j += step) q[j] = {prefix}_act(({load} - mean) * inv * w[j] + b[j]);",
                  "}"]
    tensors = ["x"] + (["res"] if residual else []) + ["weight"] + ([] if rms else ["bias"])
    sig = ", ".join(f"torch::Tensor {t}" for t in tensors) + ", double eps"
    threads = (128, 256)[cuda_names % 2] if warp else (256, 512, 1024)[cuda_names % 3]
    host_lines = [f"torch::Tensor {host}({sig}) {{", *[f"    {float_check(t)}" for t in tensors],
                  *[f"    auto {t}c = {t}.contiguous();" for t in tensors],
                  "    const int64_t dim = xc.size(-1);", "    const int64_t rows = dim > 0 ? xc.numel() / dim : 0;",
                  '    TORCH_CHECK(weightc.numel() == dim, "weight must match the last dimension");']
    if residual:
        host_lines.append('    TORCH_CHECK(resc.sizes() == xc.sizes(), "residual must match x");')
    host_lines += ["    auto out = torch::empty_like(xc);", "    if (rows == 0) return out;", f"    {current_stream()}"]
    args = ", ".join(f"{t}c.data_ptr<float>()" for t in tensors) + ", out.data_ptr<float>(), rows, dim, (float)eps"
    if warp:
        host_lines.append(f"    const unsigned int blocks = (unsigned int)((rows * 32 + {threads} - 1) / {threads});")
        host_lines.append(f"    {kernel}<<<blocks, {threads}, 0, stream>>>({args});")
    else:
        host_lines.append(f"    {kernel}<<<(unsigned int)rows, {threads}, 0, stream>>>({args});")
    host_lines += [f"    {launch_check()}", "    return out;", "}"]
    cuda = "\n".join(lines + [""] + host_lines) + "\n"
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}({sig});",), functions=(host,),
                            stem=f"{op}_{style}")
    call = [x] + ([names.inputs[1]] if residual else []) + [weight] + ([] if rms else [bias])
    call.append("self.norm.eps" if op == "layernorm_module" else "self.eps")
    inputs = [f"{n} = torch.randn({shape})" for n in names.inputs]
    spec = ModelSpec(
        docstring=rng.choice((f"{'RMS' if rms else 'Layer'} normalisation over the last dimension"
                              f"{' of a residual sum' if residual else ''}, then {act}.",
                              f"Normalises each row{' of x + residual' if residual else ''} ({op.split('_')[0]}).",
                              f"A transformer-style {'RMSNorm' if rms else 'LayerNorm'} block.")),
        init_args=[("hidden", dim), ("eps", eps)], init_lines=init_lines, sizes=sizes, input_lines=inputs,
        needs_functional=needs_f)
    # get_init_inputs passes the module-level hidden size and eps
    spec.init_args = [("hidden", "hidden"), ("eps", eps)]
    return {"op": op, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"activation": act, "residual": residual, "eps": eps, **dict(sizes)}}


# --- channel norms --------------------------------------------------------------------------------------------------
CHANNEL_NORM_OPS = ("batchnorm_eval", "instancenorm", "groupnorm")


def channel_norm_design_space() -> list[tuple[str, str, str]]:
    return [(op, act, style) for op in CHANNEL_NORM_OPS for act in NORM_ACTIVATIONS if act != "none"
            for style in (("grid_stride", "one_per_thread") if op == "batchnorm_eval" else ("block_per_group",))] * 2


def _image_sizes(rng: random.Random) -> list[tuple[str, int]]:
    channels = rng.choice((16, 32, 64, 96, 128, 256))
    side = rng.choice((32, 48, 64, 96, 128))
    total = 2 ** rng.randint(22, 25)
    return [("batch_size", max(2, total // (channels * side * side))), ("channels", channels), ("height", side),
            ("width", side)]


def build_channel_norm(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    op, act, style = design
    names = python_names(rng, 1)
    x = names.inputs[0]
    sizes = _image_sizes(rng)
    channels = dict(sizes)["channels"]
    shape = ", ".join(n for n, _ in sizes)
    eps = rng.choice((1e-5, 1e-3, 1e-5))
    scale = round(rng.uniform(0.5, 2.0), 3)
    act_torch, act_c = NORM_ACTIVATIONS[act]
    prefix = ("cn", "chn", "gn")[cuda_names % 3]
    stem = f"{op}_{act}"
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    groups = 1
    if op == "batchnorm_eval":
        init_lines = ["self.eps = eps", "self.scale = scale",
                      "self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(channels))",
                      "self.bias = nn.Parameter(0.1 * torch.randn(channels))",
                      'self.register_buffer("running_mean", 0.1 * torch.randn(channels))',
                      'self.register_buffer("running_var", 0.5 + torch.rand(channels))']
        forward = [f"y = F.batch_norm({x}, self.running_mean, self.running_var, self.weight, self.bias, "
                   "training=False, eps=self.eps)", f"return {act_torch.format(y='y')} * self.scale"]
        tensors = [TensorArg("x", "full"), TensorArg("mean", "channel"), TensorArg("var", "channel"),
                   TensorArg("w", "channel"), TensorArg("b", "channel")]
        body = (f"    const float v = (x_v - mean_v) * rsqrtf(var_v + eps) * w_v + b_v;\n"
                f"    return ({act_c}) * scale;")
        checks = ['TORCH_CHECK(xc.dim() >= 2 && meanc.numel() == xc.size(1), "one statistic per channel");',
                  "const int64_t channels = xc.size(1);", "const int64_t inner = n / (xc.size(0) * channels);"]
        cuda = elementwise_source(kernel=kernel, host=host, device_fn=f"{prefix}_bn", device_body=body,
                                  tensors=tensors, scalars=["eps", "scale"], style=style,
                                  threads=(256, 512)[cuda_names % 2], shape_checks=checks)
        prototype = host_prototype(host, ["x", "mean", "var", "w", "b"], ["eps", "scale"])
        call = [x, "self.running_mean", "self.running_var", "self.weight", "self.bias", "self.eps", "self.scale"]
        init_args = [("channels", "channels"), ("eps", eps), ("scale", scale)]
    else:
        if op == "groupnorm":
            groups = rng.choice([g for g in (2, 4, 8, 16, 32) if channels % g == 0 and g < channels])
            init_lines = ["self.scale = scale", "self.norm = nn.GroupNorm(groups, channels, eps=eps)"]
            forward = [f"y = self.norm({x})", f"return {act_torch.format(y='y')} * self.scale"]
            call = [x, "self.norm.weight", "self.norm.bias", "self.norm.num_groups", "self.norm.eps", "self.scale"]
            init_args = [("channels", "channels"), ("groups", groups), ("eps", eps), ("scale", scale)]
        else:
            init_lines = ["self.eps = eps", "self.scale = scale"]
            forward = [f"y = F.instance_norm({x}, eps=self.eps)", f"return {act_torch.format(y='y')} * self.scale"]
            call = [x, "self.eps", "self.scale"]
            init_args = [("eps", eps), ("scale", scale)]
        affine = op == "groupnorm"
        cuda = _group_norm_source(prefix, kernel, host, act_c, affine, (256, 512, 1024)[cuda_names % 3])
        prototype = (f"torch::Tensor {host}(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
                     "int64_t groups, double eps, double scale);" if affine else
                     f"torch::Tensor {host}(torch::Tensor x, double eps, double scale);")
    design_obj = CudaDesign(cuda=cuda, prototypes=(prototype,), functions=(host,), stem=f"{op}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"{op.replace('_', ' ')} followed by {act} and a scale.",
                              f"Normalises each {'channel' if op == 'batchnorm_eval' else 'group'} of an image "
                              f"batch ({op}), then applies {act}.", f"Conv-net style {op} + {act} block.")),
        init_args=init_args, init_lines=init_lines, sizes=sizes, input_lines=[f"{x} = torch.randn({shape})"],
        needs_functional=True)
    return {"op": op, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"activation": act, "groups": groups, "eps": eps, "scale": scale, **dict(sizes)}}


def _group_norm_source(prefix: str, kernel: str, host: str, act_c: str, affine: bool, threads: int) -> str:
    """A block per (sample, group): the group's channels are contiguous, so its statistics are two passes over
    one span; the write applies the per-channel affine (group norm) and the activation. Instance norm is the case of
    one channel a group, no affine."""
    wb = ", const float* __restrict__ w, const float* __restrict__ b" if affine else ""
    affine_expr = " * w[c] + b[c]" if affine else ""
    channel = "const int64_t c = (group % groups) * group_channels + j / plane;" if affine else ""
    kernel_src = f"""{CUDA_PREAMBLE}
{sum_reducers(prefix)}
__device__ __forceinline__ float {prefix}_act(float v) {{ return {act_c}; }}

__global__ void {kernel}(const float* __restrict__ x{wb}, float* __restrict__ out, int64_t groups,
                         int64_t group_channels, int64_t plane, float eps, float scale) {{
    __shared__ float shared[32];
    const int64_t group = blockIdx.x;  // sample * groups + group index
    const int64_t span = group_channels * plane;
    const float* p = x + group * span;
    float* q = out + group * span;
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < span; j += blockDim.x) acc += p[j];
    const float mean = {prefix}_block_sum(acc, shared) / (float)span;
    float dev = 0.0f;
    for (int64_t j = threadIdx.x; j < span; j += blockDim.x) {{ const float d = p[j] - mean; dev += d * d; }}
    const float inv = rsqrtf({prefix}_block_sum(dev, shared) / (float)span + eps);
    for (int64_t j = threadIdx.x; j < span; j += blockDim.x) {{
        {channel}
        const float v = (p[j] - mean) * inv{affine_expr};
        q[j] = {prefix}_act(v) * scale;
    }}
}}
"""
    if affine:
        head = (f"torch::Tensor {host}(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t groups, "
                "double eps, double scale) {")
        checks = [float_check("weight"), float_check("bias"), "auto wc = weight.contiguous();",
                  "auto bc = bias.contiguous();",
                  'TORCH_CHECK(groups > 0 && channels % groups == 0, "channels must divide into groups");']
        extra = ", wc.data_ptr<float>(), bc.data_ptr<float>()"
    else:
        head = f"torch::Tensor {host}(torch::Tensor x, double eps, double scale) {{"
        checks = ["const int64_t groups = channels;"]
        extra = ""
    host_src = "\n".join([head, f"    {float_check('x')}", '    TORCH_CHECK(x.dim() >= 3, "x must be (N, C, ...)");',
                          "    auto xc = x.contiguous();", "    const int64_t channels = xc.size(1);",
                          *[f"    {c}" for c in checks],
                          "    const int64_t plane = xc.numel() / (xc.size(0) * channels);",
                          "    auto out = torch::empty_like(xc);", "    if (xc.numel() == 0) return out;",
                          f"    {current_stream()}",
                          f"    {kernel}<<<(unsigned int)(xc.size(0) * groups), {threads}, 0, stream>>>("
                          f"xc.data_ptr<float>(){extra}, out.data_ptr<float>(), groups, channels / groups, plane, "
                          "(float)eps, (float)scale);", f"    {launch_check()}", "    return out;", "}"])
    return kernel_src + "\n" + host_src + "\n"


__all__ = ["NORM_ACTIVATIONS", "build_channel_norm", "build_row_norm", "channel_norm_design_space",
           "row_norm_design_space"]
