import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Mish activation written out as x * tanh(softplus(x)).
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


batch_size = 8192
dim = 4096


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
