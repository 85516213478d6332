"""Loss and pooling families (held out of training by default: see catalogue.HELD_OUT_FAMILIES). Losses reduce an
element-wise term of predictions and targets to a mean: a grid-stride partial sum a block, reduced with warp
shuffles and added atomically. Pooling (max and average, 1D and 2D, with stride and padding) runs a thread an
output element, with the element-wise step before it fused into the window loads. Standard library only.
"""

from __future__ import annotations

import random

from dice_pipeline.synthesis.operators.common import (
    CUDA_PREAMBLE,
    CudaDesign,
    ModelSpec,
    current_stream,
    float_check,
    launch_check,
    python_names,
    round_sig,
)
from dice_pipeline.synthesis.operators.norms import sum_reducers

# name: (torch call of {p}, {t} with parameters as self.<name>, C term of a (prediction) and b (target),
#        target draw, parameters (name, low, high))
LOSSES = {
    "mse": ("F.mse_loss({p}, {t})", "(a - b) * (a - b)", "torch.randn", ()),
    "l1": ("F.l1_loss({p}, {t})", "fabsf(a - b)", "torch.randn", ()),
    "smooth_l1": ("F.smooth_l1_loss({p}, {t}, beta=self.beta)",
                  "(fabsf(a - b) < beta ? 0.5f * (a - b) * (a - b) / beta : fabsf(a - b) - 0.5f * beta)",
                  "torch.randn", (("beta", 0.5, 2.0),)),
    "huber": ("F.huber_loss({p}, {t}, delta=self.delta)",
              "(fabsf(a - b) < delta ? 0.5f * (a - b) * (a - b) : delta * (fabsf(a - b) - 0.5f * delta))",
              "torch.randn", (("delta", 0.5, 2.0),)),
    "bce_with_logits": ("F.binary_cross_entropy_with_logits({p}, {t})",
                        "(fmaxf(a, 0.0f) - a * b + log1pf(expf(-fabsf(a))))", "torch.rand", ()),
    "soft_margin": ("F.soft_margin_loss({p}, {t})", "log1pf(expf(-a * b))", "sign", ()),
    "poisson_nll": ("F.poisson_nll_loss({p}, {t}, log_input=True)", "(expf(a) - b * a)", "counts", ()),
}


def loss_design_space() -> list[tuple[str, str, str]]:
    return [(loss, pre, "block_atomic") for loss in LOSSES for pre in ("none", "scale")] * 2


def build_loss(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    loss, pre, style = design
    torch_call, term, target_draw, param_specs = LOSSES[loss]
    names = python_names(rng, 2)
    pred, target = names.inputs
    dim = rng.choice((1024, 2048, 4096, 8192))
    sizes = [("batch_size", max(64, 2 ** rng.randint(22, 24) // dim)), ("dim", dim)]
    params = [(n, round_sig(rng.uniform(lo, hi))) for n, lo, hi in param_specs]
    if pre == "scale":
        params.append(("scale", round_sig(rng.uniform(0.5, 2.0))))
    p_expr = f"{pred} * self.scale" if pre == "scale" else pred
    forward = [f"return {torch_call.format(p=p_expr, t=target)}"]
    target_line = {"torch.randn": f"{target} = torch.randn(batch_size, dim)",
                   "torch.rand": f"{target} = torch.rand(batch_size, dim)",
                   "sign": f"{target} = torch.randint(0, 2, (batch_size, dim)).float() * 2 - 1",
                   "counts": f"{target} = torch.randint(0, 5, (batch_size, dim)).float()"}[target_draw]
    prefix = ("loss", "ls", "obj")[cuda_names % 3]
    kernel, host = f"{loss}_loss_kernel", f"{loss}_loss_forward"
    scalar_names = [n for n, _ in params]
    fparams = "".join(f", float {n}" for n in scalar_names)
    load_a = "pred[i] * scale" if pre == "scale" else "pred[i]"
    threads = (256, 512)[cuda_names % 2]
    cuda = "\n".join([
        CUDA_PREAMBLE, sum_reducers(prefix),
        f"__global__ void {kernel}(const float* __restrict__ pred, const float* __restrict__ target, "
        f"float* __restrict__ out, int64_t n, float inv_n{fparams}) {{",
        "    __shared__ float shared[32];", "    float acc = 0.0f;",
        "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;",
        "    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {",
        f"        const float a = {load_a};", "        const float b = target[i];", f"        acc += {term};", "    }",
        f"    acc = {prefix}_block_sum(acc, shared);", "    if (threadIdx.x == 0) atomicAdd(out, acc * inv_n);", "}", "",
        f"torch::Tensor {host}(torch::Tensor pred, torch::Tensor target{''.join(', double ' + n for n in scalar_names)}) {{",
        f"    {float_check('pred')}", f"    {float_check('target')}",
        '    TORCH_CHECK(pred.sizes() == target.sizes(), "pred and target must have the same shape");',
        "    auto pc = pred.contiguous();", "    auto tc = target.contiguous();",
        "    auto out = torch::zeros({}, pc.options());", "    const int64_t n = pc.numel();",
        "    if (n == 0) return out;", f"    {current_stream()}",
        f"    const unsigned int blocks = (unsigned int)std::min<int64_t>((n + {threads} - 1) / {threads}, 2048);",
        f"    {kernel}<<<blocks, {threads}, 0, stream>>>(pc.data_ptr<float>(), tc.data_ptr<float>(), "
        f"out.data_ptr<float>(), n, 1.0f / (float)n{''.join(', (float)' + n for n in scalar_names)});",
        f"    {launch_check()}", "    return out;", "}", ""])
    prototype = f"torch::Tensor {host}(torch::Tensor pred, torch::Tensor target{''.join(', double ' + n for n in scalar_names)});"
    design_obj = CudaDesign(cuda=cuda, prototypes=(prototype,), functions=(host,), stem=f"{loss}_loss")
    spec = ModelSpec(
        docstring=rng.choice((f"Computes the {loss.replace('_', ' ')} loss (mean reduction).",
                              f"A loss module: {loss.replace('_', ' ')} between predictions and targets.")),
        init_args=params, init_lines=[f"self.{n} = {n}" for n, _ in params], sizes=sizes,
        input_lines=[f"{pred} = torch.randn(batch_size, dim)", target_line], returns_doc="a scalar loss.",
        needs_functional=torch_call.startswith("F."))
    call = [pred, target] + [f"self.{n}" for n in scalar_names]
    return {"op": loss, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"pre": pre, **dict(sizes), **dict(params)}}


# --- pooling ------------------------------------------------------------------------------------------------------
POOLS = ("max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d")
POOL_PRES = {"tanh": ("torch.tanh({x})", "tanhf(v)"), "relu": ("torch.relu({x})", "fmaxf(v, 0.0f)"),
             "scale": ("{x} * self.scale", "v * scale")}


def pool_design_space() -> list[tuple[str, str, str]]:
    return [(pool, pre, "thread_per_output") for pool in POOLS for pre in POOL_PRES] * 2


def build_pool(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    pool, pre, style = design
    two_d = pool.endswith("2d")
    is_max = pool.startswith("max")
    names = python_names(rng, 1)
    x = names.inputs[0]
    k = rng.choice((2, 3, 4))
    stride = rng.choice((1, 2, k))
    padding = rng.choice([p for p in (0, 1) if p <= k // 2])
    channels = rng.choice((16, 32, 64))
    if two_d:
        side = rng.choice((64, 128, 256))
        sizes = [("batch_size", max(2, 2 ** rng.randint(22, 24) // (channels * side * side))), ("channels", channels),
                 ("height", side), ("width", side)]
    else:
        length = rng.choice((1024, 4096, 8192))
        sizes = [("batch_size", max(2, 2 ** rng.randint(22, 24) // (channels * length))), ("channels", channels),
                 ("length", length)]
    shape = ", ".join(n for n, _ in sizes)
    params = [("kernel_size", k), ("stride", stride), ("padding", padding)]
    if pre == "scale":
        params.append(("scale", round_sig(rng.uniform(0.5, 2.0))))
    pre_torch, pre_c = POOL_PRES[pre]
    forward = [f"y = {pre_torch.format(x=x)}",
               f"return F.{pool}(y, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding)"]
    prefix = ("pool", "pl", "win")[cuda_names % 3]
    kernel, host = f"{pool}_{pre}_kernel", f"{pool}_{pre}_forward"
    scale_param = ", float scale" if pre == "scale" else ""
    scale_arg = ", scale" if pre == "scale" else ""
    init = "-INFINITY" if is_max else "0.0f"
    accumulate = "acc = fmaxf(acc, v);" if is_max else "acc += v;"
    window = "(float)(kernel * kernel)" if two_d else "(float)kernel"
    finish = "acc" if is_max else f"acc / {window}"
    if two_d:
        loops = ["    const int64_t ow = idx % out_w, oh = (idx / out_w) % out_h, plane = idx / (out_w * out_h);",
                 "    const float* p = x + plane * in_h * in_w;", f"    float acc = {init};",
                 "    for (int kh = 0; kh < kernel; ++kh) {", "        const int64_t ih = oh * stride - padding + kh;",
                 "        if (ih < 0 || ih >= in_h) continue;", "        for (int kw = 0; kw < kernel; ++kw) {",
                 "            const int64_t iw = ow * stride - padding + kw;", "            if (iw < 0 || iw >= in_w) continue;",
                 f"            const float v = {prefix}_pre(p[ih * in_w + iw]{scale_arg});", f"            {accumulate}",
                 "        }", "    }"]
        dims = "int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w"
        host_geometry = ["    const int64_t in_h = xc.size(2), in_w = xc.size(3);",
                         "    const int64_t out_h = (in_h + 2 * padding - kernel) / stride + 1;",
                         "    const int64_t out_w = (in_w + 2 * padding - kernel) / stride + 1;",
                         "    auto out = torch::empty({xc.size(0), xc.size(1), out_h, out_w}, xc.options());",
                         "    const int64_t total = out.numel();"]
        dim_args = "in_h, in_w, out_h, out_w"
        rank_check = 'TORCH_CHECK(x.dim() == 4, "x must be (N, C, H, W)");'
    else:
        loops = ["    const int64_t ol = idx % out_l, plane = idx / out_l;", "    const float* p = x + plane * in_l;",
                 f"    float acc = {init};", "    for (int kk = 0; kk < kernel; ++kk) {",
                 "        const int64_t il = ol * stride - padding + kk;", "        if (il < 0 || il >= in_l) continue;",
                 f"        const float v = {prefix}_pre(p[il]{scale_arg});", f"        {accumulate}", "    }"]
        dims = "int64_t in_l, int64_t out_l"
        host_geometry = ["    const int64_t in_l = xc.size(2);",
                         "    const int64_t out_l = (in_l + 2 * padding - kernel) / stride + 1;",
                         "    auto out = torch::empty({xc.size(0), xc.size(1), out_l}, xc.options());",
                         "    const int64_t total = out.numel();"]
        dim_args = "in_l, out_l"
        rank_check = 'TORCH_CHECK(x.dim() == 3, "x must be (N, C, L)");'
    threads = (256, 128)[cuda_names % 2]
    cuda = "\n".join([
        CUDA_PREAMBLE,
        f"__device__ __forceinline__ float {prefix}_pre(float v{scale_param}) {{ return {pre_c}; }}", "",
        f"__global__ void {kernel}(const float* __restrict__ x, float* __restrict__ out, int64_t total, {dims}, "
        f"int kernel, int stride, int padding{scale_param}) {{",
        "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;", "    if (idx >= total) return;",
        *loops, f"    out[idx] = {finish};", "}", "",
        f"torch::Tensor {host}(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding"
        f"{', double scale' if pre == 'scale' else ''}) {{", f"    {float_check('x')}", f"    {rank_check}",
        '    TORCH_CHECK(kernel > 0 && stride > 0 && padding >= 0 && padding <= kernel / 2, "invalid window");',
        "    auto xc = x.contiguous();", *host_geometry, "    if (total == 0) return out;", f"    {current_stream()}",
        f"    {kernel}<<<(unsigned int)((total + {threads} - 1) / {threads}), {threads}, 0, stream>>>("
        f"xc.data_ptr<float>(), out.data_ptr<float>(), total, {dim_args}, (int)kernel, (int)stride, (int)padding"
        f"{', (float)scale' if pre == 'scale' else ''});", f"    {launch_check()}", "    return out;", "}", ""])
    prototype = (f"torch::Tensor {host}(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding"
                 f"{', double scale' if pre == 'scale' else ''});")
    design_obj = CudaDesign(cuda=cuda, prototypes=(prototype,), functions=(host,), stem=f"{pool}_{pre}")
    spec = ModelSpec(
        docstring=rng.choice((f"{pre} followed by {pool.replace('_', ' ')}.",
                              f"Simple model that performs {'max' if is_max else 'average'} pooling after {pre}.")),
        init_args=params, init_lines=[f"self.{n} = {n}" for n, _ in params], sizes=sizes,
        input_lines=[f"{x} = torch.randn({shape})"], needs_functional=True)
    call = [x, "self.kernel_size", "self.stride", "self.padding"] + (["self.scale"] if pre == "scale" else [])
    return {"op": pool, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({', '.join(call)})"],
            "params": {"pre": pre, **dict(sizes), **dict(params)}}


__all__ = ["LOSSES", "POOLS", "build_loss", "build_pool", "loss_design_space", "pool_design_space"]
