import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Depthwise 3x3 convolution (one filter per channel), stride 1, padding 1, no bias.
    """

    def __init__(self, channels, kernel_size):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
channels = 64
height = 256
width = 256
kernel_size = 3


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [channels, kernel_size]
