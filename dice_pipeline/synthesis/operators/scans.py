"""Softmax / log-softmax and cumulative scans over one dimension, fused with the element-wise steps around them.

Softmax rows are reduced online (a running max and a rescaled running sum, merged across lanes), so the input is
read once for the statistics and once to write; a block-per-row kernel keeps the row in shared memory instead.
Scans go a warp a row, 32 elements a step with a shuffle scan and a carry; along a strided dimension a thread
walks its column. Standard library only.
"""

from __future__ import annotations

import random

from dice_pipeline.synthesis.operators.common import CUDA_PREAMBLE, CudaDesign, ModelSpec, launch_check, python_names
from dice_pipeline.synthesis.operators.reductions import (
    PRE_OPS,
    draw_scalars,
    geometry_helper,
    host_head,
    sizes_for,
)

SOFTMAX_STYLES = ("warp_online", "block_shared")
SOFTMAX_PRES = ("affine", "temperature", "scale")


def softmax_design_space() -> list[tuple[str, str, str]]:
    return [(op, pre, style) for op in ("softmax", "log_softmax") for pre in SOFTMAX_PRES
            for style in SOFTMAX_STYLES for _ in range(2)]


def _online_helpers(prefix: str) -> str:
    return f"""// Running (max, sum of exp(v - max)) pairs: merging rescales the smaller side's sum.
__device__ __forceinline__ void {prefix}_merge(float& m, float& s, float m2, float s2) {{
    const float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return;
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}}

__device__ __forceinline__ void {prefix}_warp_merge(float& m, float& s) {{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {{
        const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        {prefix}_merge(m, s, m2, s2);
    }}
}}
"""


def build_softmax(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    op, pre_kind, style = design
    path = "column" if rng.random() < 0.25 else "row"
    # Rows up to 8192 floats fit the block-per-row kernel's shared-memory copy (32 KB).
    sizes, dim, shape = sizes_for(rng, path, (128, 256, 512, 1000, 1024, 2048, 4096, 8192))
    names = python_names(rng, 1)
    x = names.inputs[0]
    if pre_kind == "temperature":
        scalars = [("temperature", round(rng.uniform(0.5, 4.0), 2))]
        y, c_pre = f"{x} / self.temperature", "v / temperature"
    else:
        pre = PRE_OPS[pre_kind]
        scalars = draw_scalars(rng, pre)
        y, c_pre = pre.torch.format(x=x), pre.c
    # A scale after the softmax too: with one step before it, the fused kernel only halves the traffic (a 2x
    # speedup at best, borderline for a 2.0x threshold); with two it saves two thirds.
    post_scale = True
    scalars.append(("out_scale", round(rng.uniform(0.5, 2.0), 3)))
    fn = "torch.softmax" if op == "softmax" else "torch.log_softmax"
    fn = rng.choice((fn, fn.replace("torch.", "F.")))
    body = f"{fn}({y}, dim=self.dim)"
    forward = [f"return {body}{' * self.out_scale' if post_scale else ''}"]
    scalar_names = [n for n, _ in scalars]
    pre_scalars = [n for n in scalar_names if n != "out_scale"]
    prefix = ("sm", "smax", "soft")[cuda_names % 3]
    stem = f"{op}_{pre_kind}" + ("_scaled" if post_scale else "")
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    params = "".join(f", float {n}" for n in scalar_names)
    pre_params = "".join(f", float {n}" for n in pre_scalars)
    pre_args = "".join(f", {n}" for n in pre_scalars)
    post = " * out_scale" if post_scale else ""
    write = (f"(v - m - logf(s)){post}" if op == "log_softmax" else f"(expf(v - m) * inv){post}")
    parts = [CUDA_PREAMBLE, "#include <vector>", "", geometry_helper(prefix),
             f"__device__ __forceinline__ float {prefix}_pre(float v{pre_params}) {{ return {c_pre}; }}", "",
             _online_helpers(prefix)]
    head = (f"__global__ void {kernel}_rows(const float* __restrict__ x, float* __restrict__ out, int64_t rows, "
            f"int64_t reduce{params}) {{")
    if style == "warp_online":
        row = [head, "    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
               "    const int lane = threadIdx.x & 31;", "    if (row >= rows) return;",
               "    const float* p = x + row * reduce;", "    float* q = out + row * reduce;",
               "    float m = -INFINITY, s = 0.0f;",
               f"    for (int64_t r = lane; r < reduce; r += 32) {prefix}_merge(m, s, {prefix}_pre(p[r]{pre_args}), 1.0f);",
               f"    {prefix}_warp_merge(m, s);", "    const float inv = 1.0f / s;", "    (void)inv;",
               "    for (int64_t r = lane; r < reduce; r += 32) {", f"        const float v = {prefix}_pre(p[r]{pre_args});",
               f"        q[r] = {write};", "    }", "}", ""]
    else:
        row = [head, "    extern __shared__ float cached[];", "    __shared__ float part_m[32], part_s[32];",
               "    const int64_t row = blockIdx.x;", "    const float* p = x + row * reduce;",
               "    float* q = out + row * reduce;", "    float m = -INFINITY, s = 0.0f;",
               "    for (int64_t r = threadIdx.x; r < reduce; r += blockDim.x) {",
               f"        const float v = {prefix}_pre(p[r]{pre_args});", "        cached[r] = v;",
               f"        {prefix}_merge(m, s, v, 1.0f);", "    }", f"    {prefix}_warp_merge(m, s);",
               "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
               "    if (lane == 0) { part_m[warp] = m; part_s[warp] = s; }", "    __syncthreads();",
               "    const int warps = (blockDim.x + 31) >> 5;",
               "    m = lane < warps ? part_m[lane] : -INFINITY;", "    s = lane < warps ? part_s[lane] : 0.0f;",
               f"    {prefix}_warp_merge(m, s);", "    const float inv = 1.0f / s;", "    (void)inv;",
               "    for (int64_t r = threadIdx.x; r < reduce; r += blockDim.x) {", "        const float v = cached[r];",
               f"        q[r] = {write};", "    }", "}", ""]
    col = [f"__global__ void {kernel}_cols(const float* __restrict__ x, float* __restrict__ out, int64_t outer, "
           f"int64_t reduce, int64_t inner{params}) {{",
           "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;", "    if (idx >= outer * inner) return;",
           "    const int64_t base = (idx / inner) * reduce * inner + idx % inner;", "    float m = -INFINITY, s = 0.0f;",
           f"    for (int64_t r = 0; r < reduce; ++r) {prefix}_merge(m, s, {prefix}_pre(x[base + r * inner]{pre_args}), 1.0f);",
           "    const float inv = 1.0f / s;", "    (void)inv;", "    for (int64_t r = 0; r < reduce; ++r) {",
           f"        const float v = {prefix}_pre(x[base + r * inner]{pre_args});", f"        out[base + r * inner] = {write};",
           "    }", "}", ""]
    threads = (128, 256)[cuda_names % 2] if style == "warp_online" else (256, 512, 1024)[cuda_names % 3]
    casted = "".join(f", (float){n}" for n in scalar_names)
    args = f"xc.data_ptr<float>(), out.data_ptr<float>(), outer, reduce{casted}"
    if style == "warp_online":
        launch = [f"            const unsigned int blocks = (unsigned int)((outer * 32 + {threads} - 1) / {threads});",
                  f"            {kernel}_rows<<<blocks, {threads}, 0, stream>>>({args});"]
    else:
        # 48 KB of shared memory a block without opting in, less the 256 bytes of partial results
        launch = ['            TORCH_CHECK(reduce <= 12224, "rows longer than 12224 floats do not fit the shared-memory copy");',
                  f"            {kernel}_rows<<<(unsigned int)outer, {threads}, reduce * sizeof(float), stream>>>({args});"]
    host_lines = host_head(prefix, host, scalar_names)
    host_lines += ["    auto out = torch::empty_like(xc);", "    if (outer * inner > 0 && reduce > 0) {",
                   "        if (inner == 1) {", *launch, "        } else {",
                   "            const unsigned int blocks = (unsigned int)((outer * inner + 255) / 256);",
                   f"            {kernel}_cols<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), "
                   f"outer, reduce, inner{casted});", "        }", f"        {launch_check()}", "    }", "    return out;", "}"]
    cuda = "\n".join(parts + row + col + host_lines) + "\n"
    sig = "".join(f", double {n}" for n in scalar_names)
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}(torch::Tensor x, int64_t dim{sig});",),
                            functions=(host,), stem=f"{op}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"Applies {op.replace('_', ' ')} over a dimension of a scaled input.",
                              f"Simple model that performs a {op.replace('_', ' ')} activation.",
                              f"{op} with a {pre_kind} input transform.")),
        init_args=[("dim", dim), *scalars], init_lines=["self.dim = dim", *[f"self.{n} = {n}" for n, _ in scalars]],
        sizes=sizes, input_lines=[f"{x} = torch.randn({shape})"], needs_functional=fn.startswith("F."))
    call = ", ".join([x, "self.dim", *[f"self.{n}" for n in scalar_names]])
    return {"op": op, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"pre": pre_kind, "dim": dim, "path": path, **dict(sizes), **dict(scalars)}}


# --- cumulative scans -----------------------------------------------------------------------------------------------
SCANS = ("cumsum", "cumprod", "reverse_cumsum", "exclusive_cumsum")


def scan_design_space() -> list[tuple[str, str, str]]:
    return [(scan, pre, "warp_scan") for scan in SCANS for pre in ("scale", "affine", "tanh_scale")] * 2


def build_cumulative(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    scan, pre_name, style = design
    if scan == "cumprod":
        pre_name = "near_one"
    pre = PRE_OPS[pre_name]
    path = "column" if rng.random() < 0.3 else "row"
    sizes, dim, shape = sizes_for(rng, path, (64, 128, 256) if scan == "cumprod" else (256, 512, 1024, 2048, 4096))
    names = python_names(rng, 1)
    x = names.inputs[0]
    scalars = draw_scalars(rng, pre)
    y = pre.torch.format(x=x)
    forward = {"cumsum": [f"return torch.cumsum({y}, dim=self.dim)"],
               "cumprod": [f"return torch.cumprod({y}, dim=self.dim)"],
               "reverse_cumsum": [f"y = {y}", "return torch.flip(torch.cumsum(torch.flip(y, [self.dim]), dim=self.dim), "
                                  "[self.dim])"],
               "exclusive_cumsum": [f"y = {y}", "return torch.cumsum(y, dim=self.dim) - y"]}[scan]
    combine, identity = ("a * b", "1.0f") if scan == "cumprod" else ("a + b", "0.0f")
    reverse = scan == "reverse_cumsum"
    exclusive = scan == "exclusive_cumsum"
    prefix = ("scan", "cum", "pfx")[cuda_names % 3]
    kernel, host = f"{scan}_kernel", f"{scan}_forward"
    params = "".join(f", float {n}" for n in pre.scalars)
    pre_args = "".join(f", {n}" for n in pre.scalars)
    position = "reduce - 1 - (base + lane)" if reverse else "base + lane"
    column_position = "reduce - 1 - step" if reverse else "step"
    value_out = "v - own" if exclusive else "v"
    parts = [CUDA_PREAMBLE, "#include <vector>", "", geometry_helper(prefix),
             f"__device__ __forceinline__ float {prefix}_pre(float v{params}) {{ return {pre.c}; }}",
             f"__device__ __forceinline__ float {prefix}_combine(float a, float b) {{ return {combine}; }}", "",
             f"__global__ void {kernel}_rows(const float* __restrict__ x, float* __restrict__ out, int64_t rows, "
             f"int64_t reduce{params}) {{",
             "    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
             "    const int lane = threadIdx.x & 31;", "    if (row >= rows) return;",
             "    const float* p = x + row * reduce;", "    float* q = out + row * reduce;",
             f"    float carry = {identity};", "    for (int64_t base = 0; base < reduce; base += 32) {",
             f"        const int64_t r = {position};", "        const bool inside = base + lane < reduce;",
             f"        const float own = inside ? {prefix}_pre(p[r]{pre_args}) : {identity};", "        float v = own;",
             "#pragma unroll", "        for (int offset = 1; offset < 32; offset <<= 1) {",
             "            const float t = __shfl_up_sync(0xffffffffu, v, offset);",
             f"            if (lane >= offset) v = {prefix}_combine(v, t);", "        }",
             f"        v = {prefix}_combine(v, carry);", f"        if (inside) q[r] = {value_out};",
             "        carry = __shfl_sync(0xffffffffu, v, 31);", "    }", "}", "",
             f"__global__ void {kernel}_cols(const float* __restrict__ x, float* __restrict__ out, int64_t outer, "
             f"int64_t reduce, int64_t inner{params}) {{",
             "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;", "    if (idx >= outer * inner) return;",
             "    const int64_t base = (idx / inner) * reduce * inner + idx % inner;", f"    float v = {identity};",
             "    for (int64_t step = 0; step < reduce; ++step) {", f"        const int64_t r = {column_position};",
             f"        const float own = {prefix}_pre(x[base + r * inner]{pre_args});",
             f"        v = {prefix}_combine(v, own);", f"        out[base + r * inner] = {value_out};", "    }", "}", ""]
    casted = "".join(f", (float){n}" for n in pre.scalars)
    host_lines = host_head(prefix, host, list(pre.scalars))
    host_lines += ["    auto out = torch::empty_like(xc);", "    if (outer * inner > 0 && reduce > 0) {",
                   "        if (inner == 1) {",
                   "            const unsigned int blocks = (unsigned int)((outer * 32 + 255) / 256);",
                   f"            {kernel}_rows<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), "
                   f"outer, reduce{casted});", "        } else {",
                   "            const unsigned int blocks = (unsigned int)((outer * inner + 255) / 256);",
                   f"            {kernel}_cols<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), "
                   f"outer, reduce, inner{casted});", "        }", f"        {launch_check()}", "    }", "    return out;", "}"]
    cuda = "\n".join(parts + host_lines) + "\n"
    sig = "".join(f", double {n}" for n in pre.scalars)
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}(torch::Tensor x, int64_t dim{sig});",),
                            functions=(host,), stem=f"{scan}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"A {scan.replace('_', ' ')} along a dimension of a transformed input.",
                              f"Simple model that performs a {scan.replace('_', ' ')} operation.")),
        init_args=[("dim", dim), *scalars], init_lines=["self.dim = dim", *[f"self.{n} = {n}" for n, _ in scalars]],
        sizes=sizes, input_lines=[f"{x} = torch.randn({shape})"])
    call = ", ".join([x, "self.dim", *[f"self.{n}" for n, _ in scalars]])
    return {"op": scan, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"pre": pre_name, "dim": dim, "path": path, **dict(sizes), **dict(scalars)}}


__all__ = ["build_cumulative", "build_softmax", "scan_design_space", "softmax_design_space"]
