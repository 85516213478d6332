import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <cfloat>

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__global__ void row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float warp_best[32];
    const float4* row = reinterpret_cast<const float4*>(x + (int64_t)blockIdx.x * cols);
    float best = -FLT_MAX;
    for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
        float4 v = row[c];
        best = fmaxf(best, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    }
    best = warp_max(best);
    if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? warp_best[threadIdx.x] : -FLT_MAX;
        v = warp_max(v);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}

torch::Tensor max_last_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2 && (dim == 1 || dim == -1), "this kernel reduces the last dim of a 2D tensor");
    TORCH_CHECK(x.size(1) % 4 == 0 && x.size(1) > 0, "the reduced dimension must be a positive multiple of 4");
    auto xc = x.contiguous();
    auto out = torch::empty({xc.size(0)}, xc.options());
    if (xc.size(0) == 0) return out;
    row_max_kernel<<<(unsigned)xc.size(0), 512, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)xc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor max_last_dim(torch::Tensor x, int64_t dim);
"""

max_ext = load_inline(
    name="seed_max_last_dim",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["max_last_dim"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_ext.max_last_dim(x, self.dim)
