import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include <math_constants.h>

// Flash-style causal attention without tensor cores: a block of BQ threads owns BQ consecutive queries of one
// (batch, head), one query per thread with q and the output accumulator in registers. Key/value tiles of BKV rows
// are staged in shared memory and every thread reads the same key row (a broadcast). Softmax is computed online,
// so the (seq x seq) score matrix never exists in memory.
template <int D, int BQ, int BKV>
__global__ void causal_attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, float* __restrict__ out, int seq_len,
                                        float scale) {
    __shared__ float k_tile[BKV][D];
    __shared__ float v_tile[BKV][D];
    const int64_t base = (int64_t)blockIdx.y * seq_len * D;
    const int q_first = blockIdx.x * BQ;
    const int q_idx = q_first + threadIdx.x;
    const bool active = q_idx < seq_len;
    float q_reg[D];
    float acc[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
        q_reg[d] = active ? q[base + (int64_t)q_idx * D + d] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float running_max = -CUDART_INF_F;
    float running_sum = 0.0f;
    const int q_last = min(q_first + BQ, seq_len) - 1;
    for (int k0 = 0; k0 <= q_last; k0 += BKV) {
        for (int i = threadIdx.x; i < BKV * D; i += BQ) {
            const int r = i / D;
            const int c = i % D;
            const bool in_range = k0 + r < seq_len;
            k_tile[r][c] = in_range ? k[base + (int64_t)(k0 + r) * D + c] : 0.0f;
            v_tile[r][c] = in_range ? v[base + (int64_t)(k0 + r) * D + c] : 0.0f;
        }
        __syncthreads();
        if (active) {
            const int j_end = min(BKV, q_idx - k0 + 1);  // causal: keys up to and including the query position
            for (int j = 0; j < j_end; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < D; ++d) s = fmaf(q_reg[d], k_tile[j][d], s);
                if (s > running_max) {
                    // Rescale only when the maximum moves; most keys skip this branch.
                    const float correction = __expf(running_max - s);
                    running_sum *= correction;
#pragma unroll
                    for (int d = 0; d < D; ++d) acc[d] *= correction;
                    running_max = s;
                }
                const float p = __expf(s - running_max);
                running_sum += p;
#pragma unroll
                for (int d = 0; d < D; ++d) acc[d] = fmaf(p, v_tile[j][d], acc[d]);
            }
        }
        __syncthreads();
    }
    if (active) {
        const float inv = 1.0f / running_sum;
#pragma unroll
        for (int d = 0; d < D; ++d) out[base + (int64_t)q_idx * D + d] = acc[d] * inv;
    }
}

torch::Tensor causal_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(q.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(), "q, k, v must be (B, H, S, D)");
    TORCH_CHECK(q.size(3) == 64, "this kernel is compiled for head_dim 64");
    auto qc = q.contiguous();
    auto kc = k.contiguous();
    auto vc = v.contiguous();
    auto out = torch::empty_like(qc);
    const int seq_len = (int)qc.size(2);
    const int64_t batch_heads = qc.size(0) * qc.size(1);
    if (out.numel() == 0) return out;
    TORCH_CHECK(batch_heads <= 65535, "batch * heads exceeds grid.y");
    constexpr int D = 64, BQ = 64, BKV = 64;
    dim3 grid((seq_len + BQ - 1) / BQ, (unsigned)batch_heads);
    causal_attention_kernel<D, BQ, BKV><<<grid, BQ, 0, c10::cuda::getCurrentCUDAStream()>>>(
        qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), out.data_ptr<float>(), seq_len,
        1.0f / sqrtf((float)D));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor causal_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v);
"""

attention_ext = load_inline(
    name="seed_causal_attention",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["causal_attention"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_ext.causal_attention(q, k, v)
