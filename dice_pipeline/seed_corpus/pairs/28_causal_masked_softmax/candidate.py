import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <math_constants.h>

constexpr int ROWS_PER_BLOCK = 4;  // one warp per row
constexpr int MAX_COLS = 1024;
constexpr int PER_LANE = MAX_COLS / 32;

// Warp-per-row causal softmax. Row q of each (batch, head) keeps columns 0..q; the mask is computed from the
// indices instead of being built and read as a tensor. Masked outputs are written as exact zeros, which is what
// softmax gives for -inf logits. Values live in registers between the max, sum and write steps.
__global__ void causal_softmax_kernel(const float* __restrict__ scores, float* __restrict__ out,
                                      int64_t rows, int seq_len) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int q = (int)(row % seq_len);
    const float* in_row = scores + row * seq_len;
    float* out_row = out + row * seq_len;
    float vals[PER_LANE];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = lane + i * 32;
        vals[i] = (c < seq_len && c <= q) ? in_row[c] : -CUDART_INF_F;
        m = fmaxf(m, vals[i]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        vals[i] = (vals[i] == -CUDART_INF_F) ? 0.0f : expf(vals[i] - m);
        s += vals[i];
    }
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
    const float inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = lane + i * 32;
        if (c < seq_len) out_row[c] = vals[i] * inv;
    }
}

torch::Tensor causal_softmax(torch::Tensor scores) {
    TORCH_CHECK(scores.is_cuda() && scores.scalar_type() == torch::kFloat32, "scores must be float32 CUDA");
    TORCH_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2), "scores must be (..., seq, seq)");
    const int64_t seq_len = scores.size(-1);
    TORCH_CHECK(seq_len <= MAX_COLS, "seq_len above 1024 is not supported by this kernel");
    auto sc = scores.contiguous();
    auto out = torch::empty_like(sc);
    const int64_t rows = sc.numel() / (seq_len > 0 ? seq_len : 1);
    if (sc.numel() == 0) return out;
    const int64_t blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    causal_softmax_kernel<<<(unsigned)blocks, ROWS_PER_BLOCK * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
        sc.data_ptr<float>(), out.data_ptr<float>(), rows, (int)seq_len);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor causal_softmax(torch::Tensor scores);
"""

causal_softmax_ext = load_inline(
    name="seed_causal_masked_softmax",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["causal_softmax"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return causal_softmax_ext.causal_softmax(scores)
