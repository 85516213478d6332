// Host-side checks and launch helpers shared by every launcher: inputs must be float32 CUDA tensors, kernels go to
// PyTorch's current stream on the tensor's device, and a failed launch raises instead of passing silently.

static void dice_check_float_cuda(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type());
}

static const float* dice_optional_ptr(const std::optional<torch::Tensor>& t, const char* name, int64_t numel) {
    if (!t.has_value() || !t->defined()) {
        return nullptr;
    }
    dice_check_float_cuda(*t, name);
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t->numel() == numel, name, " must have ", numel, " elements, got ", t->numel());
    return t->data_ptr<float>();
}

static void dice_check_launch(const char* kernel) {
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, kernel, " launch failed: ", cudaGetErrorString(err));
}

// Enough blocks to fill the GPU several times over; the kernels stride through the rest.
static int dice_elementwise_blocks(long long n) {
    const long long blocks = (n + DICE_ELEMENTWISE_THREADS - 1) / DICE_ELEMENTWISE_THREADS;
    return (int)std::max(1LL, std::min(blocks, 65536LL));
}
