// Launcher for causal attention with fused bias + RoPE: projections (batch, seq, heads * D) in, (batch, seq,
// heads * D) out. inv_freq None skips RoPE (GPT-2); biases None skip the bias add.

template <int D>
static void dice_launch_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  torch::Tensor& out, int seq, int heads, int kv_heads, float scale) {
    const dim3 grid((seq + kAttnBlockQ - 1) / kAttnBlockQ, q.size(0) * heads);
    causal_attention_kernel<D><<<grid, kAttnThreads, 0, c10::cuda::getCurrentCUDAStream(q.get_device())>>>(
        q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(), seq, heads, kv_heads,
        scale);
    dice_check_launch("causal_attention_kernel");
}

torch::Tensor rope_causal_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                    std::optional<torch::Tensor> q_bias, std::optional<torch::Tensor> k_bias,
                                    std::optional<torch::Tensor> v_bias, std::optional<torch::Tensor> inv_freq,
                                    int64_t heads, int64_t kv_heads) {
    dice_check_float_cuda(q, "q");
    dice_check_float_cuda(k, "k");
    dice_check_float_cuda(v, "v");
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    const c10::cuda::CUDAGuard guard(q.device());
    q = dice_as_token_rows(q, heads);
    k = dice_as_token_rows(k, kv_heads);
    v = dice_as_token_rows(v, kv_heads);
    const int64_t batch = q.size(0);
    const int64_t seq = q.size(1);
    const int64_t head_dim = q.size(2) / heads;
    TORCH_CHECK(k.size(0) == batch && k.size(1) == seq && v.size(0) == batch && v.size(1) == seq,
                "q, k and v must share batch and sequence sizes");
    TORCH_CHECK(k.size(2) == kv_heads * head_dim && v.size(2) == kv_heads * head_dim,
                "k and v must have kv_heads * head_dim columns");

    auto head_major = q.options().memory_format(at::MemoryFormat::Contiguous);
    auto q_heads = torch::empty({batch, heads, seq, head_dim}, head_major);
    auto k_heads = torch::empty({batch, kv_heads, seq, head_dim}, head_major);
    auto v_heads = torch::empty({batch, kv_heads, seq, head_dim}, head_major);
    const float* inv_freq_ptr = dice_optional_ptr(inv_freq, "inv_freq", head_dim / 2);
    dice_launch_rope_transpose(q, heads, dice_optional_ptr(q_bias, "q_bias", heads * head_dim), inv_freq_ptr,
                               q_heads);
    dice_launch_rope_transpose(k, kv_heads, dice_optional_ptr(k_bias, "k_bias", kv_heads * head_dim), inv_freq_ptr,
                               k_heads);
    dice_launch_rope_transpose(v, kv_heads, dice_optional_ptr(v_bias, "v_bias", kv_heads * head_dim), nullptr,
                               v_heads);

    auto out = torch::empty({batch, seq, heads * head_dim}, head_major);
    if (batch * seq == 0) {
        return out;
    }
    const float scale = (float)(1.0 / std::sqrt((double)head_dim));
    switch (head_dim) {
        case 32: dice_launch_attention<32>(q_heads, k_heads, v_heads, out, (int)seq, (int)heads, (int)kv_heads, scale); break;
        case 64: dice_launch_attention<64>(q_heads, k_heads, v_heads, out, (int)seq, (int)heads, (int)kv_heads, scale); break;
        case 96: dice_launch_attention<96>(q_heads, k_heads, v_heads, out, (int)seq, (int)heads, (int)kv_heads, scale); break;
        case 128: dice_launch_attention<128>(q_heads, k_heads, v_heads, out, (int)seq, (int)heads, (int)kv_heads, scale); break;
        default: TORCH_CHECK(false, "head_dim ", head_dim, " is not supported (32, 64, 96 or 128)");
    }
    return out;
}
