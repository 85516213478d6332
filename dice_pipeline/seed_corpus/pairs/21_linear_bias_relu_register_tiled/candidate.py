import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

constexpr int BM = 64;   // output rows per block
constexpr int BN = 64;   // output columns per block
constexpr int BK = 16;   // reduction slice staged in shared memory
constexpr int TM = 4;    // outputs per thread along M
constexpr int TN = 4;    // outputs per thread along N
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256

// Y = relu(X @ W^T + b) with X (M, K) and W (N, K) as stored by nn.Linear. Each thread keeps a 4x4 tile of
// accumulators in registers, so one shared-memory load feeds four FMAs. Both tiles are stored k-major so the
// inner loop reads a column of each; the +4 padding spreads the transposing stores over banks.
__global__ void linear_bias_relu_kernel(const float* __restrict__ X, const float* __restrict__ W,
                                        const float* __restrict__ bias, float* __restrict__ Y, int M, int N, int K) {
    __shared__ float Xs[BK][BM + 4];
    __shared__ float Ws[BK][BN + 4];
    const int tid = threadIdx.x;
    const int ty = tid / (BN / TN);
    const int tx = tid % (BN / TN);
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int idx = tid; idx < BM * BK; idx += THREADS) {
            const int r = idx / BK;
            const int c = idx % BK;
            const int gk = k0 + c;
            Xs[c][r] = (m0 + r < M && gk < K) ? X[(int64_t)(m0 + r) * K + gk] : 0.0f;
            Ws[c][r] = (n0 + r < N && gk < K) ? W[(int64_t)(n0 + r) * K + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = Xs[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Ws[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty * TM + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx * TN + j;
            if (n < N) Y[(int64_t)m * N + n] = fmaxf(acc[i][j] + bias[n], 0.0f);
        }
    }
}

torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "expects x (M, K), weight (N, K)");
    TORCH_CHECK(bias.numel() == weight.size(0), "bias must have one entry per output feature");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int M = (int)xc.size(0), K = (int)xc.size(1), N = (int)wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    if (M == 0 || N == 0) return y;
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    linear_bias_relu_kernel<<<grid, THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = """
torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
"""

linear_relu_ext = load_inline(
    name="seed_linear_bias_relu_register_tiled",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["linear_bias_relu"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        # Holds the parameters only (same initialisation as the reference); the forward pass never calls it.
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu_ext.linear_bias_relu(x, self.linear.weight, self.linear.bias)
