import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += scratch[w];
    __syncthreads();
    return total;
}

// Two-pass statistics (mean, then the sum of squared deviations) avoid the cancellation of E[x^2] - E[x]^2
// when the mean is large. Rows are 16 KB and re-read from L1/L2.
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, float* __restrict__ out, int hidden, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (int64_t)blockIdx.x * hidden;
    float* row_out = out + (int64_t)blockIdx.x * hidden;
    float s = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) s += row[c];
    const float mean = block_sum(s, scratch) / hidden;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        float d = row[c] - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq, scratch) / hidden + eps);
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        row_out[c] = (row[c] - mean) * rstd * gamma[c] + beta[c];
    }
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps) {
    TORCH_CHECK(x.is_cuda() && gamma.is_cuda() && beta.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(gamma.numel() == hidden && beta.numel() == hidden, "gamma/beta must match the hidden size");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.numel() / hidden;
    if (rows == 0) return out;
    layernorm_kernel<<<(unsigned)rows, 512, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), gamma.contiguous().data_ptr<float>(), beta.contiguous().data_ptr<float>(),
        out.data_ptr<float>(), (int)hidden, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps);
"""

layernorm_ext = load_inline(
    name="seed_layernorm",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["layernorm_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_forward(x, self.weight, self.bias, self.eps)
