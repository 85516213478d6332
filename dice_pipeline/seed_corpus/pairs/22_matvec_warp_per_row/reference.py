import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Matrix-vector product y = A @ v.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, v)


M = 16384
K = 4096


def get_inputs():
    A = torch.randn(M, K)
    v = torch.randn(K)
    return [A, v]


def get_init_inputs():
    return []
