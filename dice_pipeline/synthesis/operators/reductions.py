"""Reductions over one dimension: sum/mean/max/min/prod/logsumexp, argmax/argmin, vector norms (the norm itself or
the input normalised by it), softmax/log-softmax and cumulative scans (cumsum, cumprod, reversed, exclusive).

The reference applies an element-wise step before the reduction (each its own PyTorch kernel); the candidate reads
the input once. Every source handles any dimension: the host views the input as [outer, R, inner] and takes a
row kernel (inner == 1: a warp or a block a row, warp-shuffle reductions) or a column kernel (a thread an output,
coalesced across the inner dimension). Standard library only.
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
    launch_check,
    python_names,
    round_sig,
)

ROW_STYLES = ("warp_per_row", "block_per_row")


@dataclass(frozen=True)
class PreOp:
    name: str
    torch: str  # {x}; parameters as self.scale / self.shift
    c: str  # of v, scale, shift
    scalars: tuple[str, ...]


PRE_OPS = {p.name: p for p in (
    PreOp("scale", "{x} * self.scale", "v * scale", ("scale",)),
    PreOp("affine", "{x} * self.scale + self.shift", "v * scale + shift", ("scale", "shift")),
    PreOp("abs_scale", "torch.abs({x}) * self.scale", "fabsf(v) * scale", ("scale",)),
    PreOp("square", "{x} * {x}", "v * v", ()),
    PreOp("tanh_scale", "torch.tanh({x}) * self.scale", "tanhf(v) * scale", ("scale",)),
    PreOp("relu_shift", "torch.relu({x}) + self.shift", "fmaxf(v, 0.0f) + shift", ("shift",)),
    PreOp("near_one", "1.0 + {x} * self.scale", "1.0f + v * scale", ("scale",)),
)}


@dataclass(frozen=True)
class Reduce:
    name: str
    identity: str
    combine: str  # of a, b
    finalize: str  # of acc, count
    torch: tuple[str, ...]  # {y} operand, {d} dim


REDUCES = {r.name: r for r in (
    Reduce("sum", "0.0f", "a + b", "acc", ("torch.sum({y}, dim={d})", "{y}.sum(dim={d})")),
    Reduce("mean", "0.0f", "a + b", "acc / (float)count", ("torch.mean({y}, dim={d})", "{y}.mean(dim={d})")),
    Reduce("max", "-INFINITY", "fmaxf(a, b)", "acc", ("torch.max({y}, dim={d})[0]", "torch.amax({y}, dim={d})",
                                                     "{y}.max(dim={d}).values")),
    Reduce("min", "INFINITY", "fminf(a, b)", "acc", ("torch.min({y}, dim={d})[0]", "torch.amin({y}, dim={d})")),
    Reduce("prod", "1.0f", "a * b", "acc", ("torch.prod({y}, dim={d})",)),
)}


def geometry_helper(prefix: str) -> str:
    return f"""static void {prefix}_geometry(const torch::Tensor& x, int64_t dim, int64_t& outer, int64_t& reduce,
                                  int64_t& inner, std::vector<int64_t>& kept) {{
    const int64_t rank = x.dim();
    if (dim < 0) dim += rank;
    TORCH_CHECK(dim >= 0 && dim < rank, "dim out of range");
    outer = 1; inner = 1; reduce = x.size(dim);
    for (int64_t k = 0; k < rank; ++k) {{
        if (k < dim) outer *= x.size(k);
        if (k > dim) inner *= x.size(k);
        if (k != dim) kept.push_back(x.size(k));
    }}
}}
"""


def _warp_reduce(prefix: str, combine: str) -> str:
    return f"""__device__ __forceinline__ float {prefix}_combine(float a, float b) {{ return {combine}; }}

__device__ __forceinline__ float {prefix}_warp_reduce(float v) {{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = {prefix}_combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}}

// Every thread of the block gets the result; `shared` holds one value a warp and is free again on return.
__device__ float {prefix}_block_reduce(float v, float* shared, float identity) {{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = {prefix}_warp_reduce(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = (threadIdx.x < warps) ? shared[threadIdx.x] : identity;
    if (warp == 0) v = {prefix}_warp_reduce(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}}
"""


def sizes_for(rng: random.Random, path: str, reduce_sizes: tuple[int, ...] | None = None
               ) -> tuple[list[tuple[str, int]], int, str]:
    """(module-level sizes, dim, shape expression) for a row (reduce the last dim) or column (reduce dim 1 of a
    3D input whose outer x inner positions number at least 64K) reduction over 4M-32M elements."""
    total = 2 ** rng.randint(22, 25)
    if path == "row":
        reduce = rng.choice(reduce_sizes or (256, 512, 1000, 1024, 2048, 4096, 8192))
        if rng.random() < 0.5:
            return [("batch_size", max(64, total // reduce)), ("dim1", reduce)], rng.choice((1, -1)), \
                "batch_size, dim1"
        seq = rng.choice((16, 32, 64, 128))
        return ([("batch_size", max(4, total // (reduce * seq))), ("seq_len", seq), ("dim2", reduce)],
                rng.choice((2, -1)), "batch_size, seq_len, dim2")
    inner = rng.choice((512, 1024, 2048, 4096))
    reduce = rng.choice(reduce_sizes or (32, 64, 128, 256, 512))
    outer = max(65536 // inner + 1, total // (reduce * inner))
    return [("batch_size", outer), ("dim1", reduce), ("dim2", inner)], 1, "batch_size, dim1, dim2"


def _pre_torch(pre: PreOp, x: str) -> str:
    return pre.torch.format(x=x)


def draw_scalars(rng: random.Random, pre: PreOp) -> list[tuple[str, float]]:
    values = []
    for name in pre.scalars:
        if name == "scale":
            value = round_sig(rng.uniform(0.01, 0.05), 2) if pre.name == "near_one" else \
                round_sig(rng.uniform(0.3, 2.0) * (-1 if rng.random() < 0.15 else 1), 3)
        else:
            value = round_sig(rng.uniform(-1.0, 1.0), 3)
        values.append((name, value))
    return values


def host_head(prefix: str, host: str, scalars: list[str], extra: str = "") -> list[str]:
    sig = "".join(f", double {s}" for s in scalars)
    return [f"torch::Tensor {host}(torch::Tensor x, int64_t dim{sig}{extra}) {{", f"    {float_check('x')}",
            "    auto xc = x.contiguous();", "    int64_t outer, reduce, inner;", "    std::vector<int64_t> kept;",
            f"    {prefix}_geometry(xc, dim, outer, reduce, inner, kept);", f"    {current_stream()}"]


def _row_launch(style: str, kernel: str, args: str, threads: int) -> list[str]:
    if style == "warp_per_row":
        return [f"        const unsigned int blocks = (unsigned int)((outer * 32 + {threads} - 1) / {threads});",
                f"        {kernel}_rows<<<blocks, {threads}, 0, stream>>>({args});"]
    return [f"        {kernel}_rows<<<(unsigned int)outer, {threads}, 0, stream>>>({args});"]


def _row_prologue(style: str) -> list[str]:
    if style == "warp_per_row":
        return ["    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
                "    const int lane = threadIdx.x & 31;", "    if (row >= rows) return;",
                "    const int64_t first = lane, step = 32;"]
    return ["    __shared__ float shared[32];", "    const int64_t row = blockIdx.x;",
            "    const int64_t first = threadIdx.x, step = blockDim.x;"]


def _reduce_all(style: str, prefix: str, var: str, identity: str) -> str:
    if style == "warp_per_row":
        return f"    {var} = {prefix}_warp_reduce({var});"
    return f"    {var} = {prefix}_block_reduce({var}, shared, {identity});"


def _leader(style: str) -> str:
    return "lane == 0" if style == "warp_per_row" else "threadIdx.x == 0"


# --- sum / mean / max / min / prod / logsumexp ------------------------------------------------------------------------
def reduction_design_space() -> list[tuple[str, str, str]]:
    space = []
    for reduce in (*REDUCES, "logsumexp"):
        pres = ("near_one",) if reduce == "prod" else ("scale", "affine", "abs_scale", "square", "tanh_scale",
                                                        "relu_shift")
        for pre in pres:
            for style in ROW_STYLES:
                space.append((reduce, pre, style))
    return space


def build_reduction(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    reduce_name, pre_name, style = design
    pre = PRE_OPS[pre_name]
    path = "column" if rng.random() < 0.35 else "row"
    # A product of values near 1 stays finite only over short rows.
    sizes, dim, shape = sizes_for(rng, path, (16, 32, 48, 64) if reduce_name == "prod" else None)
    names = python_names(rng, 1)
    x = names.inputs[0]
    scalars = draw_scalars(rng, pre)
    keepdim = rng.random() < 0.25
    y = _pre_torch(pre, x)
    if reduce_name == "logsumexp":
        expr = f"torch.logsumexp({y}, dim=self.dim{', keepdim=True' if keepdim else ''})"
    else:
        spelling = rng.choice(REDUCES[reduce_name].torch)
        if keepdim and "[0]" not in spelling and ".values" not in spelling:
            spelling = spelling.replace("dim={d})", "dim={d}, keepdim=True)")
        else:
            keepdim = False
        expr = spelling.format(y=f"({y})" if spelling.startswith("{y}") else y, d="self.dim")
    forward = [f"return {expr}"] if rng.random() < 0.5 else [f"y = {y}", f"return {expr.replace(y, 'y', 1).replace('(y).', 'y.')}"]
    prefix = ("red", "rdc", "acc")[cuda_names % 3]
    stem = f"{reduce_name}_reduce" if cuda_names % 2 == 0 else f"{reduce_name}_{pre_name}"
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    threads = (256, 128, 512)[cuda_names % 3] if style == "warp_per_row" else (256, 512, 1024)[cuda_names % 3]
    c_pre = f"__device__ __forceinline__ float {prefix}_pre(float v{''.join(', float ' + s for s in pre.scalars)}) " \
            f"{{ return {pre.c}; }}"
    pre_args = "".join(f", {s}" for s in pre.scalars)
    scalar_params = "".join(f", float {s}" for s in pre.scalars)
    parts = [CUDA_PREAMBLE, "#include <vector>", "", geometry_helper(prefix), c_pre, ""]
    if reduce_name == "logsumexp":
        parts += [_warp_reduce(f"{prefix}_max", "fmaxf(a, b)"), _warp_reduce(f"{prefix}_sum", "a + b")]
        row = [f"__global__ void {kernel}_rows(const float* __restrict__ x, float* __restrict__ out, int64_t rows, "
               f"int64_t reduce{scalar_params}) {{", *_row_prologue(style),
               "    const float* p = x + row * reduce;", "    float m = -INFINITY;",
               f"    for (int64_t r = first; r < reduce; r += step) m = fmaxf(m, {prefix}_pre(p[r]{pre_args}));",
               _reduce_all(style, f"{prefix}_max", "m", "-INFINITY"), "    float s = 0.0f;",
               f"    for (int64_t r = first; r < reduce; r += step) s += expf({prefix}_pre(p[r]{pre_args}) - m);",
               _reduce_all(style, f"{prefix}_sum", "s", "0.0f"),
               f"    if ({_leader(style)}) out[row] = m + logf(s);", "}", ""]
        col = [f"__global__ void {kernel}_cols(const float* __restrict__ x, float* __restrict__ out, int64_t outer, "
               f"int64_t reduce, int64_t inner{scalar_params}) {{",
               "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
               "    if (idx >= outer * inner) return;",
               "    const float* p = x + (idx / inner) * reduce * inner + idx % inner;", "    float m = -INFINITY;",
               f"    for (int64_t r = 0; r < reduce; ++r) m = fmaxf(m, {prefix}_pre(p[r * inner]{pre_args}));",
               "    float s = 0.0f;",
               f"    for (int64_t r = 0; r < reduce; ++r) s += expf({prefix}_pre(p[r * inner]{pre_args}) - m);",
               "    out[idx] = m + logf(s);", "}", ""]
    else:
        op = REDUCES[reduce_name]
        parts.append(_warp_reduce(prefix, op.combine))
        final = op.finalize.replace("count", "reduce")
        row = [f"__global__ void {kernel}_rows(const float* __restrict__ x, float* __restrict__ out, int64_t rows, "
               f"int64_t reduce{scalar_params}) {{", *_row_prologue(style),
               "    const float* p = x + row * reduce;", f"    float acc = {op.identity};",
               f"    for (int64_t r = first; r < reduce; r += step) acc = {prefix}_combine(acc, "
               f"{prefix}_pre(p[r]{pre_args}));",
               _reduce_all(style, prefix, "acc", op.identity),
               f"    if ({_leader(style)}) out[row] = {final};", "}", ""]
        col = [f"__global__ void {kernel}_cols(const float* __restrict__ x, float* __restrict__ out, int64_t outer, "
               f"int64_t reduce, int64_t inner{scalar_params}) {{",
               "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
               "    if (idx >= outer * inner) return;",
               "    const float* p = x + (idx / inner) * reduce * inner + idx % inner;",
               f"    float acc = {op.identity};",
               f"    for (int64_t r = 0; r < reduce; ++r) acc = {prefix}_combine(acc, {prefix}_pre(p[r * inner]"
               f"{pre_args}));",
               f"    out[idx] = {final};", "}", ""]
    casted = "".join(f", (float){s}" for s in pre.scalars)
    host_lines = host_head(prefix, host, list(pre.scalars), ", bool keepdim")
    host_lines += ["    auto out = torch::empty({outer * inner}, xc.options());", "    if (outer * inner > 0) {",
                   "        if (inner == 1) {",
                   *["    " + line for line in _row_launch(style, kernel, f"xc.data_ptr<float>(), out.data_ptr<float>(), "
                                                                          f"outer, reduce{casted}", threads)],
                   "        } else {",
                   "            const unsigned int blocks = (unsigned int)((outer * inner + 255) / 256);",
                   f"            {kernel}_cols<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), "
                   f"outer, reduce, inner{casted});", "        }", f"        {launch_check()}", "    }",
                   "    if (keepdim) {", "        std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());",
                   "        shape[dim < 0 ? dim + xc.dim() : dim] = 1;", "        return out.view(shape);", "    }",
                   "    return out.view(kept);", "}"]
    cuda = "\n".join(parts + row + col + host_lines) + "\n"
    sig = "".join(f", double {s}" for s in pre.scalars)
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}(torch::Tensor x, int64_t dim{sig}, "
                                                   "bool keepdim);",), functions=(host,),
                            stem=f"{reduce_name}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"Reduces the input with {reduce_name} over one dimension after an element-wise step.",
                              f"Simple model that performs a {reduce_name} reduction over a dimension.",
                              f"{reduce_name.capitalize()} over dimension `dim` of a transformed input.")),
        init_args=[("dim", dim), *scalars], init_lines=["self.dim = dim", *[f"self.{n} = {n}" for n, _ in scalars]],
        sizes=sizes, input_lines=[f"{x} = torch.randn({shape})"])
    call = ", ".join([x, "self.dim", *[f"self.{n}" for n, _ in scalars], "True" if keepdim else "False"])
    return {"op": reduce_name, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"pre": pre_name, "dim": dim, "keepdim": keepdim, "path": path, **dict(sizes), **dict(scalars)}}


# --- argmax / argmin --------------------------------------------------------------------------------------------------
def arg_design_space() -> list[tuple[str, str, str]]:
    return [(op, pre, style) for op in ("argmax", "argmin") for pre in ("scale", "affine")
            for style in ROW_STYLES] * 3


def build_arg_reduction(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    """argmax/argmin of an affine transform. The fused kernel rounds the multiply and the add separately, as the
    reference's two kernels do, so near-ties resolve the same way; ties go to the lowest index, as PyTorch's."""
    op, pre_name, style = design
    pre = PRE_OPS[pre_name]
    path = "column" if rng.random() < 0.35 else "row"
    sizes, dim, shape = sizes_for(rng, path)
    names = python_names(rng, 1)
    x = names.inputs[0]
    scalars = draw_scalars(rng, pre)
    y = _pre_torch(pre, x)
    expr = rng.choice((f"torch.{op}({y}, dim=self.dim)", f"({y}).{op}(dim=self.dim)"))
    forward = [f"return {expr}"]
    better = "b > a" if op == "argmax" else "b < a"
    prefix = ("arg", "pick", "sel")[cuda_names % 3]
    kernel, host = f"{op}_kernel", f"{op}_forward" if cuda_names % 2 == 0 else f"{op}_{pre_name}_cuda"
    threads = 256 if style == "warp_per_row" else (256, 512)[cuda_names % 2]
    exact = "__fmul_rn(v, scale)" if pre_name == "scale" else "__fadd_rn(__fmul_rn(v, scale), shift)"
    scalar_params = "".join(f", float {s}" for s in pre.scalars)
    pre_args = "".join(f", {s}" for s in pre.scalars)
    parts = [CUDA_PREAMBLE, "#include <vector>", "", geometry_helper(prefix),
             f"__device__ __forceinline__ float {prefix}_pre(float v{scalar_params}) {{ return {exact}; }}", "",
             f"// Does candidate (b, j) beat (a, i)? Equal values keep the lower index.",
             f"__device__ __forceinline__ bool {prefix}_better(float a, int64_t i, float b, int64_t j) {{",
             f"    return ({better}) || (b == a && j < i);", "}", "",
             f"__device__ __forceinline__ void {prefix}_warp_pick(float& v, int64_t& i) {{", "#pragma unroll",
             "    for (int offset = 16; offset > 0; offset >>= 1) {",
             "        const float ov = __shfl_xor_sync(0xffffffffu, v, offset);",
             "        const int64_t oi = __shfl_xor_sync(0xffffffffu, i, offset);",
             f"        if ({prefix}_better(v, i, ov, oi)) {{ v = ov; i = oi; }}", "    }", "}", ""]
    init = "-INFINITY" if op == "argmax" else "INFINITY"
    row = [f"__global__ void {kernel}_rows(const float* __restrict__ x, int64_t* __restrict__ out, int64_t rows, "
           f"int64_t reduce{scalar_params}) {{"]
    if style == "warp_per_row":
        row += ["    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
                "    const int lane = threadIdx.x & 31;", "    if (row >= rows) return;",
                "    const float* p = x + row * reduce;", f"    float best = {init};", "    int64_t at = reduce;",
                "    for (int64_t r = lane; r < reduce; r += 32) {", f"        const float v = {prefix}_pre(p[r]{pre_args});",
                f"        if ({prefix}_better(best, at, v, r)) {{ best = v; at = r; }}", "    }",
                f"    {prefix}_warp_pick(best, at);", "    if (lane == 0) out[row] = at;", "}", ""]
    else:
        row += ["    __shared__ float best_v[32];", "    __shared__ int64_t best_i[32];",
                "    const int64_t row = blockIdx.x;", "    const float* p = x + row * reduce;",
                f"    float best = {init};", "    int64_t at = reduce;",
                "    for (int64_t r = threadIdx.x; r < reduce; r += blockDim.x) {",
                f"        const float v = {prefix}_pre(p[r]{pre_args});",
                f"        if ({prefix}_better(best, at, v, r)) {{ best = v; at = r; }}", "    }",
                f"    {prefix}_warp_pick(best, at);", "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
                "    if (lane == 0) { best_v[warp] = best; best_i[warp] = at; }", "    __syncthreads();",
                "    if (warp == 0) {", "        const int warps = (blockDim.x + 31) >> 5;",
                f"        best = lane < warps ? best_v[lane] : {init};",
                "        at = lane < warps ? best_i[lane] : reduce;", f"        {prefix}_warp_pick(best, at);",
                "        if (lane == 0) out[row] = at;", "    }", "}", ""]
    col = [f"__global__ void {kernel}_cols(const float* __restrict__ x, int64_t* __restrict__ out, int64_t outer, "
           f"int64_t reduce, int64_t inner{scalar_params}) {{",
           "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
           "    if (idx >= outer * inner) return;",
           "    const float* p = x + (idx / inner) * reduce * inner + idx % inner;",
           f"    float best = {init};", "    int64_t at = 0;", "    for (int64_t r = 0; r < reduce; ++r) {",
           f"        const float v = {prefix}_pre(p[r * inner]{pre_args});",
           f"        if ({prefix}_better(best, at, v, r) || r == 0) {{ best = v; at = r; }}", "    }",
           "    out[idx] = at;", "}", ""]
    casted = "".join(f", (float){s}" for s in pre.scalars)
    host_lines = host_head(prefix, host, list(pre.scalars))
    host_lines += ["    auto out = torch::empty({outer * inner}, xc.options().dtype(torch::kLong));",
                   "    if (outer * inner > 0) {", "        if (inner == 1) {",
                   *["    " + line for line in _row_launch(style, kernel, f"xc.data_ptr<float>(), "
                                                                          f"out.data_ptr<int64_t>(), outer, reduce{casted}",
                                                            threads)],
                   "        } else {", "            const unsigned int blocks = (unsigned int)((outer * inner + 255) / 256);",
                   f"            {kernel}_cols<<<blocks, 256, 0, stream>>>(xc.data_ptr<float>(), "
                   f"out.data_ptr<int64_t>(), outer, reduce, inner{casted});", "        }", f"        {launch_check()}",
                   "    }", "    return out.view(kept);", "}"]
    cuda = "\n".join(parts + row + col + host_lines) + "\n"
    sig = "".join(f", double {s}" for s in pre.scalars)
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}(torch::Tensor x, int64_t dim{sig});",),
                            functions=(host,), stem=f"{op}_{style}")
    spec = ModelSpec(
        docstring=rng.choice((f"Returns the index of the {'largest' if op == 'argmax' else 'smallest'} transformed "
                              "value along a dimension.", f"Simple model that performs {op} over a dimension.",
                              f"{op} of an affine transform of the input.")),
        init_args=[("dim", dim), *scalars], init_lines=["self.dim = dim", *[f"self.{n} = {n}" for n, _ in scalars]],
        sizes=sizes, input_lines=[f"{x} = torch.randn({shape})"], returns_doc="int64 indices.")
    call = ", ".join([x, "self.dim", *[f"self.{n}" for n, _ in scalars]])
    return {"op": op, "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"pre": pre_name, "dim": dim, "path": path, **dict(sizes), **dict(scalars)}}


# --- vector norms -------------------------------------------------------------------------------------------------
NORMS = {
    # name: (accumulate, combine, finalize, torch spellings of the norm of {y} over {d})
    "l2": ("v * v", "a + b", "sqrtf(acc)", ("torch.norm({y}, p=2, dim={d}{k})",
                                            "torch.linalg.vector_norm({y}, ord=2, dim={d}{k})")),
    "l1": ("fabsf(v)", "a + b", "acc", ("torch.norm({y}, p=1, dim={d}{k})", "torch.sum(torch.abs({y}), dim={d}{k})")),
    "linf": ("fabsf(v)", "fmaxf(a, b)", "acc", ("torch.linalg.vector_norm({y}, ord=float('inf'), dim={d}{k})",
                                                "torch.amax(torch.abs({y}), dim={d}{k})")),
}


def norm_design_space() -> list[tuple[str, str, str]]:
    return [(norm, mode, style) for norm in NORMS for mode in ("norm", "normalize", "f_normalize")
            for style in ROW_STYLES if not (mode == "f_normalize" and norm == "linf")]


def build_vector_norm(rng: random.Random, design: tuple[str, str, str], cuda_names: int) -> dict:
    norm, mode, style = design
    accumulate, combine, finalize, spellings = NORMS[norm]
    pre = PRE_OPS["affine"]
    path = "column" if rng.random() < 0.3 else "row"
    sizes, dim, shape = sizes_for(rng, path)
    names = python_names(rng, 1)
    x = names.inputs[0]
    scalars = draw_scalars(rng, pre)
    eps = rng.choice((1e-12, 1e-8, 1e-6))
    y = _pre_torch(pre, x)
    p = {"l2": 2, "l1": 1, "linf": "float('inf')"}[norm]
    if mode == "norm":
        forward = [f"y = {y}", f"return {rng.choice(spellings).format(y='y', d='self.dim', k='')}"]
    elif mode == "normalize":
        forward = [f"y = {y}", f"return y / {rng.choice(spellings).format(y='y', d='self.dim', k=', keepdim=True')}"]
    else:
        forward = [f"y = {y}", f"return F.normalize(y, p={p}, dim=self.dim, eps=self.eps)"]
    prefix = ("nrm", "vn", "norm")[cuda_names % 3]
    stem = f"{norm}_{mode}"
    kernel, host = f"{stem}_kernel", f"{stem}_forward"
    threads = 256 if style == "warp_per_row" else (256, 512)[cuda_names % 2]
    scalar_params = ", float scale, float shift"
    parts = [CUDA_PREAMBLE, "#include <vector>", "", geometry_helper(prefix),
             f"__device__ __forceinline__ float {prefix}_pre(float v, float scale, float shift) "
             "{ return v * scale + shift; }",
             f"__device__ __forceinline__ float {prefix}_term(float v) {{ return {accumulate}; }}",
             _warp_reduce(prefix, combine)]
    denominator = {"norm": "", "normalize": "nrm", "f_normalize": "fmaxf(nrm, eps)"}[mode]
    write_norm = mode == "norm"
    out_t = "float* __restrict__ out"
    row = [f"__global__ void {kernel}_rows(const float* __restrict__ x, {out_t}, int64_t rows, int64_t reduce"
           f"{scalar_params}, float eps) {{", *_row_prologue(style), "    const float* p = x + row * reduce;",
           "    float acc = 0.0f;",
           f"    for (int64_t r = first; r < reduce; r += step) acc = {prefix}_combine(acc, "
           f"{prefix}_term({prefix}_pre(p[r], scale, shift)));",
           _reduce_all(style, prefix, "acc", "0.0f"), f"    const float nrm = {finalize};"]
    if write_norm:
        row += [f"    if ({_leader(style)}) out[row] = nrm;", "}", ""]
    else:
        row += [f"    const float inv = 1.0f / {denominator};", "    float* q = out + row * reduce;",
                "    for (int64_t r = first; r < reduce; r += step) q[r] = "
                f"{prefix}_pre(p[r], scale, shift) * inv;", "}", ""]
    col = [f"__global__ void {kernel}_cols(const float* __restrict__ x, {out_t}, int64_t outer, int64_t reduce, "
           f"int64_t inner{scalar_params}, float eps) {{",
           "    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;", "    if (idx >= outer * inner) return;",
           "    const int64_t base = (idx / inner) * reduce * inner + idx % inner;", "    float acc = 0.0f;",
           f"    for (int64_t r = 0; r < reduce; ++r) acc = {prefix}_combine(acc, "
           f"{prefix}_term({prefix}_pre(x[base + r * inner], scale, shift)));", f"    const float nrm = {finalize};"]
    if write_norm:
        col += ["    out[idx] = nrm;", "}", ""]
    else:
        col += [f"    const float inv = 1.0f / {denominator};",
                "    for (int64_t r = 0; r < reduce; ++r) out[base + r * inner] = "
                f"{prefix}_pre(x[base + r * inner], scale, shift) * inv;", "}", ""]
    host_lines = host_head(prefix, host, ["scale", "shift", "eps"])
    alloc = "torch::empty({outer * inner}, xc.options())" if write_norm else "torch::empty_like(xc)"
    args = "xc.data_ptr<float>(), out.data_ptr<float>(), outer, reduce"
    host_lines += [f"    auto out = {alloc};", "    if (outer * inner > 0 && reduce > 0) {", "        if (inner == 1) {",
                   *["    " + line for line in _row_launch(style, kernel, f"{args}, (float)scale, (float)shift, "
                                                                          "(float)eps", threads)],
                   "        } else {", "            const unsigned int blocks = (unsigned int)((outer * inner + 255) / 256);",
                   f"            {kernel}_cols<<<blocks, 256, 0, stream>>>({args}, inner, (float)scale, (float)shift, "
                   "(float)eps);", "        }", f"        {launch_check()}", "    }",
                   f"    return {'out.view(kept)' if write_norm else 'out'};", "}"]
    cuda = "\n".join(parts + row + col + host_lines) + "\n"
    design_obj = CudaDesign(cuda=cuda, prototypes=(f"torch::Tensor {host}(torch::Tensor x, int64_t dim, double scale, "
                                                   "double shift, double eps);",), functions=(host,),
                            stem=f"{norm}_{mode}_{style}")
    init_args = [("dim", dim), *scalars] + ([("eps", eps)] if mode == "f_normalize" else [])
    spec = ModelSpec(
        docstring=rng.choice((f"Computes the {norm} norm of a transformed input along a dimension"
                              + ("." if mode == "norm" else " and normalises by it."),
                              f"Vector {norm} normalisation model.", f"{norm.upper()} norm over `dim`.")),
        init_args=init_args, init_lines=[f"self.{n} = {n}" for n, _ in init_args], sizes=sizes,
        input_lines=[f"{x} = torch.randn({shape})"], needs_functional=mode == "f_normalize")
    eps_arg = "self.eps" if mode == "f_normalize" else "0.0"
    call = ", ".join([x, "self.dim", "self.scale", "self.shift", eps_arg])
    return {"op": f"{norm}_{mode}", "style": style, "spec": spec, "names": names, "design": design_obj,
            "forward_reference": forward, "forward_candidate": [f"return {names.handle}.{host}({call})"],
            "params": {"dim": dim, "path": path, "mode": mode, **dict(sizes), **dict(scalars)}}


__all__ = ["PRE_OPS", "REDUCES", "ROW_STYLES", "arg_design_space", "build_arg_reduction", "build_reduction",
           "build_vector_norm", "norm_design_space", "reduction_design_space"]
