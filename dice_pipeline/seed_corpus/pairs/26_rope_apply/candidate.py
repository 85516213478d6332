import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// Each thread owns the rotation pair (d, d + half) of one (batch, head, position) row:
//   out[d]        = q[d] * cos[d]               - q[d + half] * sin[d]
//   out[d + half] = q[d + half] * cos[d + half] + q[d] * sin[d + half]
// Consecutive threads take consecutive d, so both halves are read and written coalesced.
__global__ void rope_kernel(const float* __restrict__ q, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, float* __restrict__ out,
                            int64_t rows, int seq_len, int head_dim) {
    const int half = head_dim / 2;
    const int64_t pairs = rows * half;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += stride) {
        const int64_t row = p / half;
        const int d = (int)(p - row * half);
        const int pos = (int)(row % seq_len);
        const float* q_row = q + row * head_dim;
        const float* c_row = cos_t + (int64_t)pos * head_dim;
        const float* s_row = sin_t + (int64_t)pos * head_dim;
        const float lo = q_row[d];
        const float hi = q_row[d + half];
        out[row * head_dim + d] = lo * c_row[d] - hi * s_row[d];
        out[row * head_dim + d + half] = hi * c_row[d + half] + lo * s_row[d + half];
    }
}

torch::Tensor rope_apply(torch::Tensor q, torch::Tensor cos_t, torch::Tensor sin_t) {
    TORCH_CHECK(q.is_cuda() && cos_t.is_cuda() && sin_t.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(q.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(q.dim() == 4, "q must be (batch, heads, seq, head_dim)");
    const int64_t seq_len = q.size(2), head_dim = q.size(3);
    TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
    TORCH_CHECK(cos_t.dim() == 2 && cos_t.size(0) == seq_len && cos_t.size(1) == head_dim && cos_t.sizes() == sin_t.sizes(),
                "cos and sin must be (seq, head_dim)");
    auto qc = q.contiguous();
    auto cc = cos_t.contiguous();
    auto sc = sin_t.contiguous();
    auto out = torch::empty_like(qc);
    const int64_t rows = qc.numel() / head_dim;
    if (rows == 0) return out;
    const int threads = 256;
    const int64_t pairs = rows * (head_dim / 2);
    const int blocks = (int)std::min<int64_t>((pairs + threads - 1) / threads, 132LL * 32);
    rope_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        qc.data_ptr<float>(), cc.data_ptr<float>(), sc.data_ptr<float>(), out.data_ptr<float>(), rows, (int)seq_len,
        (int)head_dim);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor rope_apply(torch::Tensor q, torch::Tensor cos_t, torch::Tensor sin_t);
"""

rope_ext = load_inline(
    name="seed_rope_apply",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["rope_apply"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rope_ext.rope_apply(q, cos, sin)
