import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    ELU activation with a configurable alpha.
    """

    def __init__(self, alpha):
        super(Model, self).__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=self.alpha)


batch_size = 8192
dim = 4096
alpha = 1.0


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [alpha]
