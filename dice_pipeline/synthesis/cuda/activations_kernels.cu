// Element-wise epilogues fused around cuBLAS GEMMs: SwiGLU's silu(gate) * up, bias + GELU (exact or tanh),
// and bias + residual add. Grid-stride loops over 64-bit indices.

__device__ __forceinline__ float dice_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float dice_gelu(float x, bool tanh_approximation) {
    if (tanh_approximation) {
        const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
        const float kKappa = 0.044715f;
        const float inner = kBeta * (x + kKappa * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__global__ __launch_bounds__(DICE_ELEMENTWISE_THREADS) void silu_mul_kernel(
    const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        out[i] = dice_silu(gate[i]) * up[i];
    }
}

// In place: x[i] = gelu(x[i] + bias[i % columns]).
__global__ __launch_bounds__(DICE_ELEMENTWISE_THREADS) void bias_gelu_kernel(
    float* __restrict__ x, const float* __restrict__ bias, long long n, int columns, bool tanh_approximation) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        x[i] = dice_gelu(x[i] + bias[i % columns], tanh_approximation);
    }
}

// out[i] = residual[i] + (y[i] + bias[i % columns]); the bias is added first, as nn.Linear does before the add.
// residual may be null (a plain bias epilogue).
__global__ __launch_bounds__(DICE_ELEMENTWISE_THREADS) void bias_residual_add_kernel(
    const float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual,
    float* __restrict__ out, long long n, int columns) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float biased = y[i] + bias[i % columns];
        out[i] = residual != nullptr ? residual[i] + biased : biased;
    }
}
