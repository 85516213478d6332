import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Causal scaled dot-product attention over (batch, heads, seq, head_dim) tensors, written out in eager ops.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq_len = q.size(-2)
        scale = 1.0 / math.sqrt(q.size(-1))
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        causal_mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(causal_mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


batch_size = 4
num_heads = 16
seq_len = 1024
head_dim = 64


def get_inputs():
    q = torch.randn(batch_size, num_heads, seq_len, head_dim)
    k = torch.randn(batch_size, num_heads, seq_len, head_dim)
    v = torch.randn(batch_size, num_heads, seq_len, head_dim)
    return [q, k, v]


def get_init_inputs():
    return []
