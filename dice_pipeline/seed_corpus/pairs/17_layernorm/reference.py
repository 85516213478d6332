import torch
import torch.nn as nn


class Model(nn.Module):
    """
    LayerNorm over the hidden dimension of a (tokens, hidden) activation.
    """

    def __init__(self, hidden_size):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(hidden_size, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


num_tokens = 16384
hidden_size = 4096


def get_inputs():
    x = torch.randn(num_tokens, hidden_size) * 2.0 + 0.5
    return [x]


def get_init_inputs():
    return [hidden_size]
