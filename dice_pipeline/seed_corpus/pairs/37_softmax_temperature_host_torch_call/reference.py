import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Temperature-scaled softmax over the last dimension, as used when sampling from logits.
    """

    def __init__(self, temperature):
        super(Model, self).__init__()
        self.temperature = temperature

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits / self.temperature, dim=-1)


batch_size = 4096
vocab_size = 8192
temperature = 0.7


def get_inputs():
    logits = torch.randn(batch_size, vocab_size)
    return [logits]


def get_init_inputs():
    return [temperature]
