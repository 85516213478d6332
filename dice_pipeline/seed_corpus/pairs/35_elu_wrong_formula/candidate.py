import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// ELU for negative inputs, as written here: alpha * exp(x). (The definition is alpha * (exp(x) - 1).)
__global__ void elu_kernel(const float* __restrict__ x, float* __restrict__ out, float alpha, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        out[i] = v > 0.0f ? v : alpha * expf(v);
    }
}

torch::Tensor elu_forward(torch::Tensor x, double alpha) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return out;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 132LL * 16);
    elu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (float)alpha, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor elu_forward(torch::Tensor x, double alpha);
"""

elu_ext = load_inline(
    name="seed_elu_wrong_formula",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["elu_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super(ModelNew, self).__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return elu_ext.elu_forward(x, self.alpha)
