import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int RMS_THREADS = 256;

// One block per token row: the sum of squares is reduced across the block, then the row is scaled by
// rsqrt(mean + eps) and the weight in the same kernel.
__global__ void rmsnorm_kernel(const float4* __restrict__ x, const float4* __restrict__ weight,
                               float4* __restrict__ out, int hidden_vec, float inv_hidden, float eps) {
    __shared__ float partial[RMS_THREADS / 32];
    __shared__ float scale;
    const float4* row = x + (int64_t)blockIdx.x * hidden_vec;
    float4* row_out = out + (int64_t)blockIdx.x * hidden_vec;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < hidden_vec; c += RMS_THREADS) {
        float4 v = row[c];
        sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int offset = 16; offset > 0; offset >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sq;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < RMS_THREADS / 32; ++w) total += partial[w];
        scale = rsqrtf(total * inv_hidden + eps);
    }
    __syncthreads();
    const float r = scale;
    for (int c = threadIdx.x; c < hidden_vec; c += RMS_THREADS) {
        float4 v = row[c];
        float4 w = weight[c];
        row_out[c] = make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(hidden % 4 == 0 && weight.numel() == hidden, "hidden size must be a multiple of 4 and match weight");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.numel() / hidden;
    if (rows == 0) return out;
    rmsnorm_kernel<<<(unsigned)rows, RMS_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<const float4*>(wc.data_ptr<float>()),
        reinterpret_cast<float4*>(out.data_ptr<float>()), (int)(hidden / 4), 1.0f / (float)hidden, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);
"""

rmsnorm_ext = load_inline(
    name="seed_rmsnorm",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["rmsnorm_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_ext.rmsnorm_forward(x, self.weight, self.eps)
