import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Causal softmax over attention scores: positions above the diagonal are masked out before the softmax.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        seq_len = scores.size(-1)
        mask = torch.triu(torch.ones(seq_len, seq_len, device=scores.device), diagonal=1).bool()
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


batch_size = 16
num_heads = 16
seq_len = 512


def get_inputs():
    scores = torch.randn(batch_size, num_heads, seq_len, seq_len)
    return [scores]


def get_init_inputs():
    return []
