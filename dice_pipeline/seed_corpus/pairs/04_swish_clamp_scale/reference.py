import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Swish activation followed by a clamp and a constant scale.
    """

    def __init__(self, clamp_min, clamp_max, scale):
        super(Model, self).__init__()
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.sigmoid(x)
        x = torch.clamp(x, min=self.clamp_min, max=self.clamp_max)
        return x * self.scale


batch_size = 4096
dim = 8192
clamp_min = -0.2
clamp_max = 2.0
scale = 1.5


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [clamp_min, clamp_max, scale]
