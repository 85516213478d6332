import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Evaluates the cubic 3x^3 - 2x^2 + 0.5x - 1 element-wise, written the way one would in eager PyTorch.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3.0 * x ** 3 - 2.0 * x ** 2 + 0.5 * x - 1.0


batch_size = 4096
dim = 8192


def get_inputs():
    x = torch.rand(batch_size, dim) * 2.0 - 1.0
    return [x]


def get_init_inputs():
    return []
