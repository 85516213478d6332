// Rotary position embedding fused with the bias add and the (batch, seq, heads, D) -> (batch, heads, seq, D)
// transpose that attention needs. One thread per rotated pair (d, d + D/2). inv_freq null: bias + transpose only.
// Precise cosf/sinf (no fast math): angles reach seq_len radians, where __cosf loses all accuracy.

__global__ __launch_bounds__(DICE_ELEMENTWISE_THREADS) void rope_transpose_kernel(
    const float* __restrict__ x, long long row_stride, const float* __restrict__ bias,
    const float* __restrict__ inv_freq, float* __restrict__ out, int batch, int seq, int heads, int head_dim) {
    const int half = head_dim / 2;
    const long long pairs = (long long)batch * seq * heads * half;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(p % half);
        long long rest = p / half;
        const int head = (int)(rest % heads);
        rest /= heads;
        const int pos = (int)(rest % seq);
        const int b = (int)(rest / seq);
        // x's token rows are row_stride apart (a slice of a fused qkv projection has a stride of 3 * hidden).
        const float* in = x + ((long long)b * seq + pos) * row_stride + (long long)head * head_dim;
        float* dst = out + (((long long)b * heads + head) * seq + pos) * head_dim;
        float x1 = in[j];
        float x2 = in[j + half];
        if (bias != nullptr) {
            x1 += bias[head * head_dim + j];
            x2 += bias[head * head_dim + j + half];
        }
        if (inv_freq != nullptr) {
            const float angle = (float)pos * inv_freq[j];
            const float c = cosf(angle);
            const float s = sinf(angle);
            dst[j] = x1 * c - x2 * s;
            dst[j + half] = x2 * c + x1 * s;
        } else {
            dst[j] = x1;
            dst[j + half] = x2;
        }
    }
}
