import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int MAX_CHANNELS = 64;

// Softmax across channels for every (n, h, w). One thread per pixel: channel c of pixel p is at
// n * C * HW + c * HW + p, so neighbouring threads (neighbouring pixels) read neighbouring addresses for every c.
// The channel values are held in registers, so the input is read once.
__global__ void channel_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int channels,
                                       int64_t hw, int64_t pixels) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pixels) return;
    const int64_t n = idx / hw;
    const int64_t p = idx - n * hw;
    const float* base = x + n * channels * hw + p;
    float* out = y + n * channels * hw + p;
    float vals[MAX_CHANNELS];
    float m = -INFINITY;
#pragma unroll
    for (int c = 0; c < MAX_CHANNELS; ++c) {
        if (c < channels) {
            vals[c] = base[c * hw];
            m = fmaxf(m, vals[c]);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < MAX_CHANNELS; ++c) {
        if (c < channels) {
            vals[c] = expf(vals[c] - m);
            s += vals[c];
        }
    }
    const float inv = 1.0f / s;
#pragma unroll
    for (int c = 0; c < MAX_CHANNELS; ++c) {
        if (c < channels) out[c * hw] = vals[c] * inv;
    }
}

torch::Tensor channel_softmax(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 4, "x must be NCHW");
    TORCH_CHECK(x.size(1) >= 1 && x.size(1) <= MAX_CHANNELS, "1 to 64 channels supported");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t hw = xc.size(2) * xc.size(3);
    const int64_t pixels = xc.size(0) * hw;
    if (pixels == 0) return y;
    const int threads = 128;
    channel_softmax_kernel<<<(unsigned)((pixels + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), (int)xc.size(1), hw, pixels);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = """
torch::Tensor channel_softmax(torch::Tensor x);
"""

channel_softmax_ext = load_inline(
    name="seed_channel_softmax",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["channel_softmax"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return channel_softmax_ext.channel_softmax(x)
