import torch
import torch.nn as nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


class Model(nn.Module):
    """
    Applies rotary position embeddings (rotate-half convention) to a (batch, heads, seq, head_dim) tensor,
    with cos and sin tables of shape (seq, head_dim).
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return q * cos + rotate_half(q) * sin


batch_size = 8
num_heads = 32
seq_len = 1024
head_dim = 128


def get_inputs():
    q = torch.randn(batch_size, num_heads, seq_len, head_dim)
    angles = torch.rand(seq_len, head_dim) * 6.283185307179586
    return [q, torch.cos(angles), torch.sin(angles)]


def get_init_inputs():
    return []
