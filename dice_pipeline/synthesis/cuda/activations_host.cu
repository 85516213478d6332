// Launchers for the element-wise GEMM epilogues.

torch::Tensor silu_mul(torch::Tensor gate, torch::Tensor up) {
    dice_check_float_cuda(gate, "gate");
    dice_check_float_cuda(up, "up");
    TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have the same shape");
    const c10::cuda::CUDAGuard guard(gate.device());
    gate = gate.contiguous();
    up = up.contiguous();
    auto out = torch::empty_like(gate);
    const long long n = gate.numel();
    if (n > 0) {
        silu_mul_kernel<<<dice_elementwise_blocks(n), DICE_ELEMENTWISE_THREADS, 0,
                          c10::cuda::getCurrentCUDAStream(gate.get_device())>>>(
            gate.data_ptr<float>(), up.data_ptr<float>(), out.data_ptr<float>(), n);
        dice_check_launch("silu_mul_kernel");
    }
    return out;
}

// In place on x (a GEMM output the caller owns): x = gelu(x + bias), bias broadcast over the last dimension.
torch::Tensor bias_gelu_(torch::Tensor x, torch::Tensor bias, bool tanh_approximation) {
    dice_check_float_cuda(x, "x");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous (it is updated in place)");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t columns = x.size(-1);
    const float* bias_ptr = dice_optional_ptr(bias, "bias", columns);
    const long long n = x.numel();
    if (n > 0) {
        bias_gelu_kernel<<<dice_elementwise_blocks(n), DICE_ELEMENTWISE_THREADS, 0,
                           c10::cuda::getCurrentCUDAStream(x.get_device())>>>(x.data_ptr<float>(), bias_ptr, n,
                                                                              (int)columns, tanh_approximation);
        dice_check_launch("bias_gelu_kernel");
    }
    return x;
}

// y + bias (+ residual when given), as a new tensor.
torch::Tensor bias_residual_add(torch::Tensor y, torch::Tensor bias, std::optional<torch::Tensor> residual) {
    dice_check_float_cuda(y, "y");
    const c10::cuda::CUDAGuard guard(y.device());
    y = y.contiguous();
    const int64_t columns = y.size(-1);
    const float* bias_ptr = dice_optional_ptr(bias, "bias", columns);
    std::optional<torch::Tensor> residual_c;
    if (residual.has_value()) {
        TORCH_CHECK(residual->sizes() == y.sizes(), "residual must have y's shape");
        residual_c = residual->contiguous();
    }
    const float* residual_ptr = dice_optional_ptr(residual_c, "residual", y.numel());
    auto out = torch::empty_like(y);
    const long long n = y.numel();
    if (n > 0) {
        bias_residual_add_kernel<<<dice_elementwise_blocks(n), DICE_ELEMENTWISE_THREADS, 0,
                                   c10::cuda::getCurrentCUDAStream(y.get_device())>>>(
            y.data_ptr<float>(), bias_ptr, residual_ptr, out.data_ptr<float>(), n, (int)columns);
        dice_check_launch("bias_residual_add_kernel");
    }
    return out;
}
