import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Computes tanh(a * b + c) element-wise on three tensors of the same shape.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a * b + c)


batch_size = 4096
dim = 4096


def get_inputs():
    a = torch.randn(batch_size, dim)
    b = torch.randn(batch_size, dim)
    c = torch.randn(batch_size, dim)
    return [a, b, c]


def get_init_inputs():
    return []
