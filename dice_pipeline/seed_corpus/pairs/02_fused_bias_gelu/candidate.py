import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ float gelu_erf(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

// x is (rows, hidden) contiguous; each thread handles 4 consecutive features of one row.
__global__ void bias_gelu_vec4_kernel(const float4* __restrict__ x, const float* __restrict__ bias,
                                      float4* __restrict__ out, int64_t n_vec, int hidden_vec) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
        int col = (int)(i % hidden_vec) * 4;
        float4 v = x[i];
        v.x = gelu_erf(v.x + bias[col + 0]);
        v.y = gelu_erf(v.y + bias[col + 1]);
        v.z = gelu_erf(v.z + bias[col + 2]);
        v.w = gelu_erf(v.w + bias[col + 3]);
        out[i] = v;
    }
}

__global__ void bias_gelu_scalar_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                        float* __restrict__ out, int64_t n, int hidden) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = gelu_erf(x[i] + bias[i % hidden]);
    }
}

torch::Tensor bias_gelu_forward(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && bias.is_cuda(), "bias_gelu_forward: inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32, "float32 only");
    const int hidden = (int)x.size(-1);
    TORCH_CHECK(bias.numel() == hidden, "bias must have one entry per feature");
    auto xc = x.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return out;
    const int threads = 256;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    if (hidden % 4 == 0) {
        int64_t n_vec = n / 4;
        int blocks = (int)std::min<int64_t>((n_vec + threads - 1) / threads, 65535LL * 4);
        bias_gelu_vec4_kernel<<<blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xc.data_ptr<float>()), bc.data_ptr<float>(),
            reinterpret_cast<float4*>(out.data_ptr<float>()), n_vec, hidden / 4);
    } else {
        int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535LL * 4);
        bias_gelu_scalar_kernel<<<blocks, threads, 0, stream>>>(
            xc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n, hidden);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor bias_gelu_forward(torch::Tensor x, torch::Tensor bias);
"""

bias_gelu_ext = load_inline(
    name="seed_fused_bias_gelu",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["bias_gelu_forward"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size):
        super(ModelNew, self).__init__()
        self.bias = nn.Parameter(torch.randn(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu_ext.bias_gelu_forward(x, self.bias)
