import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int TILE_W = 32;
constexpr int TILE_H = 8;

// Depthwise KxK conv, stride 1, "same" padding (K odd). A block computes a 32x8 output tile of one (n, c) plane:
// it stages the (32+K-1) x (8+K-1) input halo in shared memory once, so each input pixel is read from DRAM about
// once instead of K*K times through the cache.
template <int K>
__global__ void depthwise_conv_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      float* __restrict__ y, int C, int H, int W) {
    constexpr int R = K / 2;
    __shared__ float tile[TILE_H + K - 1][TILE_W + K - 1];
    __shared__ float filt[K * K];
    const int plane = blockIdx.z;  // n * C + c
    const int c = plane % C;
    const int ox0 = blockIdx.x * TILE_W;
    const int oy0 = blockIdx.y * TILE_H;
    const float* x_plane = x + (int64_t)plane * H * W;
    const int tid = threadIdx.y * TILE_W + threadIdx.x;
    if (tid < K * K) filt[tid] = w[c * K * K + tid];
    for (int i = tid; i < (TILE_H + K - 1) * (TILE_W + K - 1); i += TILE_W * TILE_H) {
        const int ty = i / (TILE_W + K - 1);
        const int tx = i % (TILE_W + K - 1);
        const int iy = oy0 + ty - R;
        const int ix = ox0 + tx - R;
        tile[ty][tx] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x_plane[(int64_t)iy * W + ix] : 0.0f;
    }
    __syncthreads();
    const int ox = ox0 + threadIdx.x;
    const int oy = oy0 + threadIdx.y;
    if (ox >= W || oy >= H) return;
    float acc = 0.0f;
#pragma unroll
    for (int ky = 0; ky < K; ++ky)
#pragma unroll
        for (int kx = 0; kx < K; ++kx) acc = fmaf(tile[threadIdx.y + ky][threadIdx.x + kx], filt[ky * K + kx], acc);
    y[(int64_t)plane * H * W + (int64_t)oy * W + ox] = acc;
}

torch::Tensor depthwise_conv3x3(torch::Tensor x, torch::Tensor weight) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "expects NCHW input and (C, 1, K, K) weight");
    TORCH_CHECK(weight.size(0) == x.size(1) && weight.size(1) == 1, "weight must be depthwise (C, 1, K, K)");
    TORCH_CHECK(weight.size(2) == 3 && weight.size(3) == 3, "this kernel is specialised for 3x3 filters");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int N = (int)xc.size(0), C = (int)xc.size(1), H = (int)xc.size(2), W = (int)xc.size(3);
    auto y = torch::empty_like(xc);
    if (y.numel() == 0) return y;
    TORCH_CHECK((int64_t)N * C <= 65535, "too many (batch, channel) planes for grid.z");
    dim3 block(TILE_W, TILE_H);
    dim3 grid((W + TILE_W - 1) / TILE_W, (H + TILE_H - 1) / TILE_H, N * C);
    depthwise_conv_kernel<3><<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), C, H, W);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = """
torch::Tensor depthwise_conv3x3(torch::Tensor x, torch::Tensor weight);
"""

depthwise_ext = load_inline(
    name="seed_depthwise_conv2d",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["depthwise_conv3x3"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, channels, kernel_size):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return depthwise_ext.depthwise_conv3x3(x, self.conv.weight)
