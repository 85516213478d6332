import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Min reduction over the last dimension (values only).
    """

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.min(x, dim=self.dim)[0]


batch_size = 32768
dim1 = 2048
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim1)
    return [x]


def get_init_inputs():
    return [reduce_dim]
