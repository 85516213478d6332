// Causal softmax attention, flash-style (never materialises the seq x seq scores), fp32, head_dim D <= 128.
// q: (batch, heads, seq, D); k, v: (batch, kv_heads, seq, D); query head h reads key/value head
// h / (heads / kv_heads) (GQA; MQA when kv_heads == 1). out: (batch, seq, heads * D), ready for the output GEMM.
//
// A block owns 32 queries of one (batch, head) and walks the 32-key tiles up to the diagonal with an online
// softmax. 128 threads = 16 row groups x 8 column lanes: a thread owns query rows 2*group, 2*group+1, score
// columns lane + 8*c (c < 4) and output columns lane + 8*t (t < D/8). The 8 lanes of a row group are adjacent in
// a warp, so row max/sum are 3 xor-shuffles. Rows of the shared tiles are padded by one float to avoid bank
// conflicts on column-wise reads.
constexpr int kAttnBlockQ = 32;
constexpr int kAttnBlockK = 32;
constexpr int kAttnThreads = 128;

__device__ __forceinline__ float dice_group8_max(float value) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 4));
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
    return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
}

__device__ __forceinline__ float dice_group8_sum(float value) {
    value += __shfl_xor_sync(0xffffffffu, value, 4);
    value += __shfl_xor_sync(0xffffffffu, value, 2);
    return value + __shfl_xor_sync(0xffffffffu, value, 1);
}

// Copy rows [start, start + rows) of a (seq, D) head into a padded shared tile; rows past seq become zeros.
template <int D, int kRows>
__device__ __forceinline__ void dice_load_tile(float (*tile)[D + 1], const float* head, int start, int seq) {
    for (int e = threadIdx.x; e < kRows * D; e += kAttnThreads) {
        const int r = e / D;
        const int d = e % D;
        const int pos = start + r;
        tile[r][d] = pos < seq ? head[(long long)pos * D + d] : 0.0f;
    }
}

template <int D>
__global__ __launch_bounds__(kAttnThreads) void causal_attention_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ out,
    int seq, int heads, int kv_heads, float scale) {
    static_assert(D % 8 == 0 && D <= 128, "head_dim must be a multiple of 8, at most 128");
    __shared__ float q_tile[kAttnBlockQ][D + 1];
    __shared__ float kv_tile[kAttnBlockK][D + 1];  // keys, then values, of the current key tile
    __shared__ float p_tile[kAttnBlockQ][kAttnBlockK + 1];

    const int batch_head = blockIdx.y;
    const int b = batch_head / heads;
    const int h = batch_head % heads;
    const int kv_h = h / (heads / kv_heads);
    const float* q_head = q + (long long)batch_head * seq * D;
    const float* k_head = k + ((long long)b * kv_heads + kv_h) * seq * D;
    const float* v_head = v + ((long long)b * kv_heads + kv_h) * seq * D;
    // Longest (latest) query tiles first, so the causal triangle's heavy blocks do not straggle at the end.
    const int q_start = (gridDim.x - 1 - blockIdx.x) * kAttnBlockQ;

    const int lane8 = threadIdx.x & 7;
    const int row0 = (threadIdx.x >> 3) * 2;
    constexpr int kOutCols = D / 8;

    dice_load_tile<D, kAttnBlockQ>(q_tile, q_head, q_start, seq);

    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    float acc[2][kOutCols];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int t = 0; t < kOutCols; ++t) acc[i][t] = 0.0f;
    }

    const int last_key = min(q_start + kAttnBlockQ, seq) - 1;
    const int num_key_tiles = last_key / kAttnBlockK + 1;
    for (int tile = 0; tile < num_key_tiles; ++tile) {
        const int k_start = tile * kAttnBlockK;
        __syncthreads();  // the previous tile's value and probability reads are finished
        dice_load_tile<D, kAttnBlockK>(kv_tile, k_head, k_start, seq);
        __syncthreads();

        float score[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int c = 0; c < 4; ++c) score[i][c] = 0.0f;
        }
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            const float q0 = q_tile[row0][d];
            const float q1 = q_tile[row0 + 1][d];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float key = kv_tile[lane8 + 8 * c][d];
                score[0][c] += q0 * key;
                score[1][c] += q1 * key;
            }
        }

#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int q_pos = q_start + row0 + i;
            float tile_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int k_pos = k_start + lane8 + 8 * c;
                const bool visible = k_pos <= q_pos && k_pos < seq;
                score[i][c] = visible ? score[i][c] * scale : -INFINITY;
                tile_max = fmaxf(tile_max, score[i][c]);
            }
            // Key 0 is in tile 0 and visible to every row, so new_max is finite from the first tile on and
            // exp(-inf - new_max) is a clean 0 for masked keys.
            const float new_max = fmaxf(row_max[i], dice_group8_max(tile_max));
            const float correction = expf(row_max[i] - new_max);
            float tile_sum = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float p = expf(score[i][c] - new_max);
                p_tile[row0 + i][lane8 + 8 * c] = p;
                tile_sum += p;
            }
            row_sum[i] = row_sum[i] * correction + dice_group8_sum(tile_sum);
            row_max[i] = new_max;
#pragma unroll
            for (int t = 0; t < kOutCols; ++t) acc[i][t] *= correction;
        }
        __syncthreads();  // every thread is done with the keys, and p_tile is complete
        dice_load_tile<D, kAttnBlockK>(kv_tile, v_head, k_start, seq);
        __syncthreads();

#pragma unroll 4
        for (int j = 0; j < kAttnBlockK; ++j) {
            const float p0 = p_tile[row0][j];
            const float p1 = p_tile[row0 + 1][j];
#pragma unroll
            for (int t = 0; t < kOutCols; ++t) {
                const float value = kv_tile[j][lane8 + 8 * t];
                acc[0][t] += p0 * value;
                acc[1][t] += p1 * value;
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int q_pos = q_start + row0 + i;
        if (q_pos < seq) {
            const float inv_sum = 1.0f / row_sum[i];
            float* dst = out + (((long long)b * seq + q_pos) * heads + h) * D;
#pragma unroll
            for (int t = 0; t < kOutCols; ++t) dst[lane8 + 8 * t] = acc[i][t] * inv_sum;
        }
    }
}
