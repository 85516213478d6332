import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Mean of a 3D tensor over its middle dimension.
    """

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=self.dim)


batch_size = 64
reduce_size = 1024
inner_size = 1024
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, reduce_size, inner_size)
    return [x]


def get_init_inputs():
    return [reduce_dim]
