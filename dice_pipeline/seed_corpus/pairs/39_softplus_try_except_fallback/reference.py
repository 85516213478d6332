import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Softplus with a sharper transition (beta = 2).
    """

    def __init__(self, beta, threshold):
        super(Model, self).__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=self.beta, threshold=self.threshold)


batch_size = 65536
dim = 1000
beta = 2.0
threshold = 20.0


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [beta, threshold]
