import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Hardtanh clipping to [-1, 1] followed by a constant scale.
    """

    def __init__(self, scale):
        super(Model, self).__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(x, min_val=-1.0, max_val=1.0) * self.scale


batch_size = 8192
dim = 4096
scale = 3.0


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [scale]
