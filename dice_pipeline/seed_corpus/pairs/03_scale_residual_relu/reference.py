import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Scales the input, adds a residual branch and applies ReLU: relu(x * scale + residual).
    """

    def __init__(self, scale):
        super(Model, self).__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + residual)


batch_size = 4096
features = 8192
scale = 0.5


def get_inputs():
    x = torch.randn(batch_size, features)
    residual = torch.randn(batch_size, features)
    return [x, residual]


def get_init_inputs():
    return [scale]
