// Shared device helpers: warp and block sums. Block sizes are multiples of 32 (at most 1024).
#ifndef DICE_NORM_THREADS
#define DICE_NORM_THREADS 256
#endif
#ifndef DICE_ELEMENTWISE_THREADS
#define DICE_ELEMENTWISE_THREADS 256
#endif

__device__ __forceinline__ float dice_warp_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

// Sum over the block; every thread receives the total. `scratch` holds 32 floats. The leading barrier keeps a
// second call from overwriting partials that a slow warp is still reading from the first.
__device__ float dice_block_sum(float value, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    value = dice_warp_sum(value);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    float total = lane < num_warps ? scratch[lane] : 0.0f;
    return dice_warp_sum(total);
}
