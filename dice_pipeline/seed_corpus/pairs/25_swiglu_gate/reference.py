import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    SwiGLU gating of a fused gate/up projection output: silu(gate) * up, where the last dimension holds
    [gate | up].
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


num_tokens = 8192
intermediate_size = 4096


def get_inputs():
    gate_up = torch.randn(num_tokens, 2 * intermediate_size)
    return [gate_up]


def get_init_inputs():
    return []
