import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Swaps the last two dimensions of a batch of matrices and materialises the result.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous()


batch_size = 64
rows = 1024
cols = 1024


def get_inputs():
    x = torch.randn(batch_size, rows, cols)
    return [x]


def get_init_inputs():
    return []
