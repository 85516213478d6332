// Launcher for the RoPE + bias + transpose kernel. x is (batch, seq, width) with unit stride in its last dimension
// and evenly spaced token rows (a plain projection output or a q/k/v slice of a fused one), or (batch, seq, heads, D).

static void dice_launch_rope_transpose(torch::Tensor x, int64_t heads, const float* bias_ptr,
                                       const float* inv_freq_ptr, torch::Tensor out) {
    const int64_t batch = x.size(0);
    const int64_t seq = x.size(1);
    const int64_t head_dim = out.size(3);
    const long long pairs = (long long)batch * seq * heads * (head_dim / 2);
    if (pairs == 0) {
        return;
    }
    rope_transpose_kernel<<<dice_elementwise_blocks(pairs), DICE_ELEMENTWISE_THREADS, 0,
                            c10::cuda::getCurrentCUDAStream(x.get_device())>>>(
        x.data_ptr<float>(), x.stride(1), bias_ptr, inv_freq_ptr, out.data_ptr<float>(), (int)batch, (int)seq,
        (int)heads, (int)head_dim);
    dice_check_launch("rope_transpose_kernel");
}

// Views x as (batch, seq, heads * head_dim) rows that the kernel can index with one row stride.
static torch::Tensor dice_as_token_rows(torch::Tensor x, int64_t heads) {
    if (x.dim() == 4) {
        TORCH_CHECK(x.size(2) == heads, "x has ", x.size(2), " heads, expected ", heads);
        x = x.contiguous().view({x.size(0), x.size(1), x.size(2) * x.size(3)});
    }
    TORCH_CHECK(x.dim() == 3, "x must be (batch, seq, width) or (batch, seq, heads, head_dim)");
    const bool rows_evenly_spaced = x.stride(2) == 1 && x.stride(0) == x.size(1) * x.stride(1);
    if (!rows_evenly_spaced) {
        x = x.contiguous();
    }
    TORCH_CHECK(x.size(2) % heads == 0, "width ", x.size(2), " does not split into ", heads, " heads");
    TORCH_CHECK((x.size(2) / heads) % 2 == 0, "head_dim must be even for RoPE");
    return x;
}

torch::Tensor rope_transpose(torch::Tensor x, int64_t heads, std::optional<torch::Tensor> bias,
                             std::optional<torch::Tensor> inv_freq) {
    dice_check_float_cuda(x, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    x = dice_as_token_rows(x, heads);
    const int64_t head_dim = x.size(2) / heads;
    auto out = torch::empty({x.size(0), heads, x.size(1), head_dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
    const float* bias_ptr = dice_optional_ptr(bias, "bias", heads * head_dim);
    const float* inv_freq_ptr = dice_optional_ptr(inv_freq, "inv_freq", head_dim / 2);
    dice_launch_rope_transpose(x, heads, bias_ptr, inv_freq_ptr, out);
    return out;
}
