import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// Direct convolution, one thread per output element (n, co, oy, ox) with ox fastest: a warp shares (n, co, oy),
// so weight reads are warp-wide broadcasts and input reads are contiguous along x. Stride 1, dilation 1.
__global__ void conv2d_direct_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                     const float* __restrict__ bias, float* __restrict__ y,
                                     int N, int C_in, int H, int W, int C_out, int KH, int KW, int pad,
                                     int H_out, int W_out) {
    const int64_t total = (int64_t)N * C_out * H_out * W_out;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int ox = (int)(idx % W_out);
    const int oy = (int)((idx / W_out) % H_out);
    const int co = (int)((idx / ((int64_t)W_out * H_out)) % C_out);
    const int n = (int)(idx / ((int64_t)W_out * H_out * C_out));
    float acc = bias != nullptr ? bias[co] : 0.0f;
    for (int ci = 0; ci < C_in; ++ci) {
        const float* x_plane = x + ((int64_t)n * C_in + ci) * H * W;
        const float* w_filter = w + ((int64_t)co * C_in + ci) * KH * KW;
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = oy - pad + ky;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < KW; ++kx) {
                const int ix = ox - pad + kx;
                if (ix < 0 || ix >= W) continue;
                acc = fmaf(x_plane[(int64_t)iy * W + ix], w_filter[ky * KW + kx], acc);
            }
        }
    }
    y[idx] = acc;
}

torch::Tensor conv2d_direct(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t padding) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4 && x.size(1) == weight.size(1), "expects NCHW input and OIHW weight");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int N = (int)xc.size(0), C_in = (int)xc.size(1), H = (int)xc.size(2), W = (int)xc.size(3);
    const int C_out = (int)wc.size(0), KH = (int)wc.size(2), KW = (int)wc.size(3);
    const int H_out = H + 2 * (int)padding - KH + 1;
    const int W_out = W + 2 * (int)padding - KW + 1;
    TORCH_CHECK(H_out > 0 && W_out > 0, "kernel larger than the padded input");
    auto y = torch::empty({N, C_out, H_out, W_out}, xc.options());
    const float* bias_ptr = nullptr;
    torch::Tensor bc;
    if (bias.defined() && bias.numel() > 0) {
        TORCH_CHECK(bias.numel() == C_out, "bias must have one entry per output channel");
        bc = bias.contiguous();
        bias_ptr = bc.data_ptr<float>();
    }
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    conv2d_direct_kernel<<<(unsigned)((total + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bias_ptr, y.data_ptr<float>(), N, C_in, H, W, C_out, KH, KW,
        (int)padding, H_out, W_out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = """
torch::Tensor conv2d_direct(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t padding);
"""

conv_ext = load_inline(
    name="seed_conv2d_direct",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["conv2d_direct"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super(ModelNew, self).__init__()
        # Parameter holder with nn.Conv2d's initialisation; the forward pass uses the custom kernel only.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_ext.conv2d_direct(x, self.conv.weight, self.conv.bias, self.padding)
