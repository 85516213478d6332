import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int BLOCK = 512;
constexpr int VEC_PER_THREAD = 2;  // 512 threads * 2 float4 = 4096 features held in registers

// The residual sum h = x + r lives only in registers: it is squared and reduced, then scaled and written.
// Rows wider than BLOCK * VEC_PER_THREAD * 4 are rejected on the host.
__global__ void residual_rmsnorm_kernel(const float4* __restrict__ x, const float4* __restrict__ r,
                                        const float4* __restrict__ weight, float4* __restrict__ out,
                                        int hidden_vec, float inv_hidden, float eps) {
    __shared__ float partial[BLOCK / 32];
    const int64_t base = (int64_t)blockIdx.x * hidden_vec;
    float4 h[VEC_PER_THREAD];
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC_PER_THREAD; ++k) {
        const int c = threadIdx.x + k * BLOCK;
        if (c < hidden_vec) {
            float4 a = x[base + c], b = r[base + c];
            h[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        } else {
            h[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        sq += h[k].x * h[k].x + h[k].y * h[k].y + h[k].z * h[k].z + h[k].w * h[k].w;
    }
    for (int offset = 16; offset > 0; offset >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sq;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) total += partial[w];
    const float scale = rsqrtf(total * inv_hidden + eps);
#pragma unroll
    for (int k = 0; k < VEC_PER_THREAD; ++k) {
        const int c = threadIdx.x + k * BLOCK;
        if (c < hidden_vec) {
            float4 w = weight[c];
            out[base + c] = make_float4(w.x * (h[k].x * scale), w.y * (h[k].y * scale), w.z * (h[k].z * scale),
                                        w.w * (h[k].w * scale));
        }
    }
}

torch::Tensor residual_rmsnorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && residual.is_cuda() && weight.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual must have the same shape");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(hidden % 4 == 0 && hidden <= BLOCK * VEC_PER_THREAD * 4 && weight.numel() == hidden,
                "hidden size must be a multiple of 4, at most 4096, and match the weight");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto wc = weight.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.numel() / hidden;
    if (rows == 0) return out;
    residual_rmsnorm_kernel<<<(unsigned)rows, BLOCK, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<const float4*>(rc.data_ptr<float>()),
        reinterpret_cast<const float4*>(wc.data_ptr<float>()), reinterpret_cast<float4*>(out.data_ptr<float>()),
        (int)(hidden / 4), 1.0f / (float)hidden, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor residual_rmsnorm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
"""

residual_rmsnorm_ext = load_inline(
    name="seed_fused_residual_rmsnorm",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["residual_rmsnorm"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual_rmsnorm_ext.residual_rmsnorm(hidden_states, residual, self.weight, self.eps)
