import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <cfloat>

// Shared by both reductions of a row; `scratch` holds one partial per warp.
__device__ float block_reduce(float v, float* scratch, bool is_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < num_warps ? scratch[lane] : (is_max ? -FLT_MAX : 0.0f);
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();  // scratch is reused by the next reduction
    return v;
}

// Pass 1: row max. Pass 2: sum of exp(x - max). Pass 3: write exp(x - max) / sum. The row (16 KB) is re-read
// from L1/L2 in passes 2 and 3, so DRAM sees it roughly once.
__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float scratch[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* row_out = out + (int64_t)blockIdx.x * cols;
    float row_max = -FLT_MAX;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row_max = fmaxf(row_max, row[c]);
    row_max = block_reduce(row_max, scratch, true);
    float denom = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) denom += expf(row[c] - row_max);
    denom = block_reduce(denom, scratch, false);
    const float inv = 1.0f / denom;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row_out[c] = expf(row[c] - row_max) * inv;
}

torch::Tensor softmax_last_dim(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x needs a non-empty last dimension");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    if (rows == 0) return out;
    softmax_rows_kernel<<<(unsigned)rows, 512, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor softmax_last_dim(torch::Tensor x);
"""

softmax_ext = load_inline(
    name="seed_softmax_three_pass",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["softmax_last_dim"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_ext.softmax_last_dim(x)
