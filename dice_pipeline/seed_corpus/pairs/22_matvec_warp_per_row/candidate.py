import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int WARPS_PER_BLOCK = 8;

// One warp per output row: lanes stride over the row in float4 steps (fully coalesced 512-byte warp loads),
// the vector stays hot in L1/L2, and a shuffle reduction produces the dot product.
__global__ void matvec_kernel(const float4* __restrict__ A, const float4* __restrict__ v, float* __restrict__ y,
                              int rows, int k_vec) {
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS_PER_BLOCK + warp;
    if (row >= rows) return;
    const float4* a_row = A + (int64_t)row * k_vec;
    float acc = 0.0f;
    for (int c = lane; c < k_vec; c += 32) {
        float4 a = a_row[c];
        float4 b = __ldg(&v[c]);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
        acc = fmaf(a.z, b.z, acc);
        acc = fmaf(a.w, b.w, acc);
    }
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) y[row] = acc;
}

torch::Tensor matvec(torch::Tensor A, torch::Tensor v) {
    TORCH_CHECK(A.is_cuda() && v.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(A.dim() == 2 && v.dim() == 1 && A.size(1) == v.size(0), "expects A (M, K) and v (K,)");
    TORCH_CHECK(A.size(1) % 4 == 0, "K must be a multiple of 4");
    auto Ac = A.contiguous();
    auto vc = v.contiguous();
    const int rows = (int)Ac.size(0);
    auto y = torch::empty({rows}, Ac.options());
    if (rows == 0) return y;
    const int blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    matvec_kernel<<<blocks, WARPS_PER_BLOCK * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(Ac.data_ptr<float>()), reinterpret_cast<const float4*>(vc.data_ptr<float>()),
        y.data_ptr<float>(), rows, (int)(Ac.size(1) / 4));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = """
torch::Tensor matvec(torch::Tensor A, torch::Tensor v);
"""

matvec_ext = load_inline(
    name="seed_matvec_warp_per_row",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["matvec"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return matvec_ext.matvec(A, v)
