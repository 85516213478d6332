// Launchers for the fused residual + norm kernels: one block per row of the last dimension.

static bool dice_row_fits_in_shared(int64_t hidden) { return hidden * (int64_t)sizeof(float) <= 48 * 1024; }

torch::Tensor rmsnorm_residual_forward(torch::Tensor x, std::optional<torch::Tensor> residual, torch::Tensor weight,
                                       double eps) {
    dice_check_float_cuda(x, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    x = x.contiguous();
    const int64_t hidden = x.size(-1);
    const int64_t rows = x.numel() / hidden;
    std::optional<torch::Tensor> residual_c;
    if (residual.has_value()) {
        TORCH_CHECK(residual->sizes() == x.sizes(), "residual must have x's shape");
        residual_c = residual->contiguous();
    }
    const float* residual_ptr = dice_optional_ptr(residual_c, "residual", x.numel());
    torch::Tensor weight_c = weight.contiguous();
    dice_check_float_cuda(weight_c, "weight");
    TORCH_CHECK(weight_c.numel() == hidden, "weight must have ", hidden, " elements");
    auto out = torch::empty_like(x);
    if (rows == 0) {
        return out;
    }
    auto stream = c10::cuda::getCurrentCUDAStream(x.get_device());
    if (dice_row_fits_in_shared(hidden)) {
        rmsnorm_residual_kernel<true><<<rows, DICE_NORM_THREADS, hidden * sizeof(float), stream>>>(
            x.data_ptr<float>(), residual_ptr, weight_c.data_ptr<float>(), out.data_ptr<float>(), (int)hidden,
            (float)eps);
    } else {
        rmsnorm_residual_kernel<false><<<rows, DICE_NORM_THREADS, 0, stream>>>(
            x.data_ptr<float>(), residual_ptr, weight_c.data_ptr<float>(), out.data_ptr<float>(), (int)hidden,
            (float)eps);
    }
    dice_check_launch("rmsnorm_residual_kernel");
    return out;
}

// Returns {normed} or, with return_sum, {normed, x + residual + residual_bias}.
std::vector<torch::Tensor> layernorm_residual_forward(torch::Tensor x, std::optional<torch::Tensor> residual,
                                                      std::optional<torch::Tensor> residual_bias,
                                                      torch::Tensor weight, torch::Tensor bias, double eps,
                                                      bool return_sum) {
    dice_check_float_cuda(x, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    x = x.contiguous();
    const int64_t hidden = x.size(-1);
    const int64_t rows = x.numel() / hidden;
    std::optional<torch::Tensor> residual_c;
    if (residual.has_value()) {
        TORCH_CHECK(residual->sizes() == x.sizes(), "residual must have x's shape");
        residual_c = residual->contiguous();
    }
    TORCH_CHECK(!residual_bias.has_value() || residual.has_value(), "residual_bias needs a residual");
    const float* residual_ptr = dice_optional_ptr(residual_c, "residual", x.numel());
    const float* residual_bias_ptr = dice_optional_ptr(residual_bias, "residual_bias", hidden);
    torch::Tensor weight_c = weight.contiguous();
    torch::Tensor bias_c = bias.contiguous();
    dice_check_float_cuda(weight_c, "weight");
    dice_check_float_cuda(bias_c, "bias");
    TORCH_CHECK(weight_c.numel() == hidden && bias_c.numel() == hidden, "weight and bias must have ", hidden,
                " elements");
    auto out = torch::empty_like(x);
    torch::Tensor sum_out;
    if (return_sum) {
        sum_out = torch::empty_like(x);
    }
    if (rows > 0) {
        float* sum_ptr = return_sum ? sum_out.data_ptr<float>() : nullptr;
        auto stream = c10::cuda::getCurrentCUDAStream(x.get_device());
        if (dice_row_fits_in_shared(hidden)) {
            layernorm_residual_kernel<true><<<rows, DICE_NORM_THREADS, hidden * sizeof(float), stream>>>(
                x.data_ptr<float>(), residual_ptr, residual_bias_ptr, weight_c.data_ptr<float>(),
                bias_c.data_ptr<float>(), sum_ptr, out.data_ptr<float>(), (int)hidden, (float)eps);
        } else {
            layernorm_residual_kernel<false><<<rows, DICE_NORM_THREADS, 0, stream>>>(
                x.data_ptr<float>(), residual_ptr, residual_bias_ptr, weight_c.data_ptr<float>(),
                bias_c.data_ptr<float>(), sum_ptr, out.data_ptr<float>(), (int)hidden, (float)eps);
        }
        dice_check_launch("layernorm_residual_kernel");
    }
    if (return_sum) {
        return {out, sum_out};
    }
    return {out};
}
