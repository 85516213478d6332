import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int THREADS = 256;
constexpr int MAX_BLOCKS = 1024;

__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[THREADS / 32];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x == 0) {
        for (int w = 0; w < THREADS / 32; ++w) total += partial[w];
    }
    return total;  // valid in thread 0 only
}

// Stage 1: each block accumulates squared differences over a grid-stride range and writes one partial.
// Stage 2: a single block sums the partials in a fixed order, so the result is deterministic (no atomics).
__global__ void squared_error_partials_kernel(const float4* __restrict__ a, const float4* __restrict__ b,
                                              float* __restrict__ partials, int64_t n_vec) {
    float acc = 0.0f;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
        const float4 p = a[i], t = b[i];
        const float dx = p.x - t.x, dy = p.y - t.y, dz = p.z - t.z, dw = p.w - t.w;
        acc += dx * dx + dy * dy + dz * dz + dw * dw;
    }
    const float total = block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void finish_mean_kernel(const float* __restrict__ partials, int num_partials,
                                   const float* __restrict__ a, const float* __restrict__ b, int64_t tail_start,
                                   int64_t n, float* __restrict__ out) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) acc += partials[i];
    for (int64_t i = tail_start + threadIdx.x; i < n; i += blockDim.x) {
        const float d = a[i] - b[i];
        acc += d * d;
    }
    const float total = block_sum(acc);
    if (threadIdx.x == 0) out[0] = total / (float)n;
}

torch::Tensor mse_loss(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.is_cuda() && targets.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "predictions and targets must have the same shape");
    TORCH_CHECK(predictions.scalar_type() == torch::kFloat32 && targets.scalar_type() == torch::kFloat32, "float32 only");
    auto pc = predictions.contiguous();
    auto tc = targets.contiguous();
    const int64_t n = pc.numel();
    TORCH_CHECK(n > 0, "mean of an empty tensor is undefined");
    auto out = torch::empty({}, pc.options());
    const int64_t n_vec = n / 4;
    const int blocks = (int)std::max<int64_t>(1, std::min<int64_t>((n_vec + THREADS - 1) / THREADS, MAX_BLOCKS));
    auto partials = torch::empty({blocks}, pc.options());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    squared_error_partials_kernel<<<blocks, THREADS, 0, stream>>>(
        reinterpret_cast<const float4*>(pc.data_ptr<float>()), reinterpret_cast<const float4*>(tc.data_ptr<float>()),
        partials.data_ptr<float>(), n_vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_mean_kernel<<<1, THREADS, 0, stream>>>(partials.data_ptr<float>(), blocks, pc.data_ptr<float>(),
                                                  tc.data_ptr<float>(), n_vec * 4, n, out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor mse_loss(torch::Tensor predictions, torch::Tensor targets);
"""

mse_ext = load_inline(
    name="seed_mse_loss",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["mse_loss"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse_ext.mse_loss(predictions, targets)
