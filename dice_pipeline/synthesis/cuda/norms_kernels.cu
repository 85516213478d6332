// Fused residual-add + normalisation, one block per row, fp32 throughout. The summed row is kept in shared
// memory when it fits (kCacheRow) so x and residual are read from global memory once.
// h = x + (residual + residual_bias); residual and residual_bias may be null.

__device__ __forceinline__ float dice_residual_sum(const float* x_row, const float* residual_row,
                                                   const float* residual_bias, int i) {
    float h = x_row[i];
    if (residual_row != nullptr) {
        float r = residual_row[i];
        if (residual_bias != nullptr) {
            r += residual_bias[i];
        }
        h += r;
    }
    return h;
}

template <bool kCacheRow>
__global__ __launch_bounds__(DICE_NORM_THREADS) void rmsnorm_residual_kernel(
    const float* __restrict__ x, const float* __restrict__ residual, const float* __restrict__ weight,
    float* __restrict__ out, int hidden, float eps) {
    extern __shared__ float row_cache[];
    __shared__ float scratch[32];
    const long long row_offset = (long long)blockIdx.x * hidden;
    const float* x_row = x + row_offset;
    const float* residual_row = residual != nullptr ? residual + row_offset : nullptr;
    float* out_row = out + row_offset;

    float sum_squares = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = dice_residual_sum(x_row, residual_row, nullptr, i);
        if (kCacheRow) {
            row_cache[i] = h;
        }
        sum_squares += h * h;
    }
    const float inv_rms = rsqrtf(dice_block_sum(sum_squares, scratch) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = kCacheRow ? row_cache[i] : dice_residual_sum(x_row, residual_row, nullptr, i);
        out_row[i] = weight[i] * (h * inv_rms);
    }
}

// LayerNorm with a two-pass (mean, then centred variance) reduction, as accurate as PyTorch's Welford.
// If sum_out is not null the pre-norm sum h is written too (the block's new residual stream).
template <bool kCacheRow>
__global__ __launch_bounds__(DICE_NORM_THREADS) void layernorm_residual_kernel(
    const float* __restrict__ x, const float* __restrict__ residual, const float* __restrict__ residual_bias,
    const float* __restrict__ weight, const float* __restrict__ bias, float* __restrict__ sum_out,
    float* __restrict__ out, int hidden, float eps) {
    extern __shared__ float row_cache[];
    __shared__ float scratch[32];
    const long long row_offset = (long long)blockIdx.x * hidden;
    const float* x_row = x + row_offset;
    const float* residual_row = residual != nullptr ? residual + row_offset : nullptr;
    float* out_row = out + row_offset;
    float* sum_row = sum_out != nullptr ? sum_out + row_offset : nullptr;

    float total = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = dice_residual_sum(x_row, residual_row, residual_bias, i);
        if (kCacheRow) {
            row_cache[i] = h;
        }
        if (sum_row != nullptr) {
            sum_row[i] = h;
        }
        total += h;
    }
    const float mean = dice_block_sum(total, scratch) / hidden;
    float centred_squares = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = kCacheRow ? row_cache[i] : dice_residual_sum(x_row, residual_row, residual_bias, i);
        centred_squares += (h - mean) * (h - mean);
    }
    const float inv_std = rsqrtf(dice_block_sum(centred_squares, scratch) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float h = kCacheRow ? row_cache[i] : dice_residual_sum(x_row, residual_row, residual_bias, i);
        out_row[i] = (h - mean) * inv_std * weight[i] + bias[i];
    }
}
