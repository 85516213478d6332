import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int SCAN_THREADS = 1024;

// Inclusive scan of one row per block, in chunks of 1024 elements: warp-level Kogge-Stone scans with shuffles,
// a scan of the 32 warp totals by warp 0, then the running carry from earlier chunks is added.
__global__ void row_cumsum_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float warp_totals[32];
    __shared__ float carry;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* row_out = out + (int64_t)blockIdx.x * cols;
    if (threadIdx.x == 0) carry = 0.0f;
    __syncthreads();
    for (int base = 0; base < cols; base += SCAN_THREADS) {
        const int c = base + threadIdx.x;
        float v = c < cols ? row[c] : 0.0f;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const float up = __shfl_up_sync(0xffffffffu, v, offset);
            if (lane >= offset) v += up;
        }
        if (lane == 31) warp_totals[warp] = v;
        __syncthreads();
        if (warp == 0) {
            float t = warp_totals[lane];
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, t, offset);
                if (lane >= offset) t += up;
            }
            warp_totals[lane] = t;  // inclusive scan of warp totals
        }
        __syncthreads();
        const float prefix = carry + (warp > 0 ? warp_totals[warp - 1] : 0.0f);
        if (c < cols) row_out[c] = v + prefix;
        __syncthreads();  // everyone has read carry and warp_totals before they change
        if (threadIdx.x == 0) carry += warp_totals[31];
        __syncthreads();
    }
}

torch::Tensor row_cumsum(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2 && (dim == 1 || dim == -1), "this kernel scans the last dim of a 2D tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    row_cumsum_kernel<<<(unsigned)xc.size(0), SCAN_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)xc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor row_cumsum(torch::Tensor x, int64_t dim);
"""

cumsum_ext = load_inline(
    name="seed_cumsum_block_scan",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["row_cumsum"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_ext.row_cumsum(x, self.dim)
