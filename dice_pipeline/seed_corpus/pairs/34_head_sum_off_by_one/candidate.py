import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// One thread per (batch, feature); it walks the heads, which are `features` floats apart, so a warp reads
// 32 consecutive features of one head per step (coalesced).
__global__ void head_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t batch, int num_heads,
                                int features) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * features) return;
    const int64_t b = idx / features;
    const int f = (int)(idx - b * features);
    const float* base = x + b * num_heads * features + f;
    float acc = 0.0f;
    for (int h = 0; h < num_heads - 1; ++h) acc += base[(int64_t)h * features];
    out[idx] = acc;
}

torch::Tensor head_sum(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 3, "x must be (batch, heads, features)");
    auto xc = x.contiguous();
    const int64_t batch = xc.size(0);
    const int num_heads = (int)xc.size(1), features = (int)xc.size(2);
    auto out = torch::empty({batch, features}, xc.options());
    if (out.numel() == 0) return out;
    const int threads = 256;
    head_sum_kernel<<<(unsigned)((out.numel() + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), batch, num_heads, features);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor head_sum(torch::Tensor x);
"""

head_sum_ext = load_inline(
    name="seed_head_sum_off_by_one",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["head_sum"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return head_sum_ext.head_sum(x)
