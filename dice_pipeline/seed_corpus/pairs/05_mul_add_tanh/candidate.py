import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

__global__ void mul_add_tanh_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    const float* __restrict__ c, float* __restrict__ out, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = tanhf(fmaf(a[i], b[i], c[i]));
    }
}

torch::Tensor mul_add_tanh(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "a, b and c must have the same shape");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32, "float32 only");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto cc = c.contiguous();
    auto out = torch::empty_like(ac);
    const int64_t n = ac.numel();
    if (n == 0) return out;
    int device = ac.get_device();
    int sm_count = 0;
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    const int threads = 256;
    // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
    int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, (int64_t)sm_count * 32);
    mul_add_tanh_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), cc.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor mul_add_tanh(torch::Tensor a, torch::Tensor b, torch::Tensor c);
"""

mul_add_tanh_ext = load_inline(
    name="seed_mul_add_tanh",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["mul_add_tanh"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return mul_add_tanh_ext.mul_add_tanh(a, b, c)
