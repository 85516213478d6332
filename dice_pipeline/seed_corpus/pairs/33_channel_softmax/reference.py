import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Softmax over the channel dimension of an NCHW feature map (per-pixel class probabilities).
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 32
channels = 64
height = 128
width = 128


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return []
