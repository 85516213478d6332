import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Max reduction over the last dimension (values only).
    """

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim)[0]


batch_size = 16384
dim1 = 4096
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim1)
    return [x]


def get_init_inputs():
    return [reduce_dim]
