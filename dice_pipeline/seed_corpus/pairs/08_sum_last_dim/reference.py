import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Sums a 2D tensor over the given dimension (the last one here).
    """

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


rows = 32768
cols = 2048
reduce_dim = -1


def get_inputs():
    x = torch.randn(rows, cols)
    return [x]


def get_init_inputs():
    return [reduce_dim]
