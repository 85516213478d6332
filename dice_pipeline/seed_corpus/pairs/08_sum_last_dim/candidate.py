import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// One block per row. Threads stride over the row in float4 steps, then a warp-shuffle + shared-memory tree
// combines the per-thread partials. Requires cols % 4 == 0 (checked on the host).
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float warp_partials[32];
    const float4* row = reinterpret_cast<const float4*>(x + (int64_t)blockIdx.x * cols);
    const int cols_vec = cols / 4;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols_vec; c += blockDim.x) {
        float4 v = row[c];
        acc += (v.x + v.y) + (v.z + v.w);
    }
    acc = warp_sum(acc);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) warp_partials[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const int num_warps = blockDim.x >> 5;
        float v = lane < num_warps ? warp_partials[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

torch::Tensor sum_last_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    TORCH_CHECK(dim == -1 || dim == x.dim() - 1, "this kernel reduces over the last dimension only");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols % 4 == 0, "the reduced dimension must be a multiple of 4");
    auto xc = x.contiguous();
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
    auto out = torch::empty(out_shape, xc.options());
    const int64_t rows = xc.numel() / cols;
    if (rows == 0) return out;
    row_sum_kernel<<<(unsigned)rows, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor sum_last_dim(torch::Tensor x, int64_t dim);
"""

sum_ext = load_inline(
    name="seed_sum_last_dim",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["sum_last_dim"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_last_dim(x, self.dim)
