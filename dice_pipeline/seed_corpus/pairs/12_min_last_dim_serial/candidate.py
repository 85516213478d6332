import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

// One thread per row, scanning the row serially.
__global__ void row_min_serial_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int cols) {
    int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* p = x + row * cols;
    float best = p[0];
    for (int c = 1; c < cols; ++c) best = fminf(best, p[c]);
    out[row] = best;
}

torch::Tensor min_last_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2 && (dim == 1 || dim == -1), "this kernel reduces the last dim of a 2D tensor");
    TORCH_CHECK(x.size(1) > 0, "cannot take the min of an empty row");
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0);
    auto out = torch::empty({rows}, xc.options());
    if (rows == 0) return out;
    const int threads = 128;
    row_min_serial_kernel<<<(unsigned)((rows + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), rows, (int)xc.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = """
torch::Tensor min_last_dim(torch::Tensor x, int64_t dim);
"""

min_ext = load_inline(
    name="seed_min_last_dim_serial",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["min_last_dim"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return min_ext.min_last_dim(x, self.dim)
