import torch
import torch.nn as nn


class Model(nn.Module):
    """
    RMSNorm as written in LLaMA-style model code: x * rsqrt(mean(x^2) + eps) * weight.
    """

    def __init__(self, hidden_size, eps):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


batch_size = 8
seq_len = 2048
hidden_size = 4096
eps = 1e-6


def get_inputs():
    x = torch.randn(batch_size, seq_len, hidden_size)
    return [x]


def get_init_inputs():
    return [hidden_size, eps]
