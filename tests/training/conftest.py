"""Fixtures shared by the training tests: a small tokenizer and tiny random models built in a few lines."""

from __future__ import annotations

import pytest
import torch

from training import SDARForCausalLM, preset_config
from training.tokenizer import train_bpe_tokenizer

CODE_SNIPPETS = [
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n",
    "__global__ void relu_kernel(const float* x, float* y, int n) {\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;\n}\n",
    "def get_inputs():\n    return [torch.rand(16, 16384)]\n\ndef get_init_inputs():\n    return []\n",
]


@pytest.fixture(scope="session")
def small_tokenizer():
    return train_bpe_tokenizer(CODE_SNIPPETS * 4, vocab_size=400, min_frequency=1)


@pytest.fixture()
def tiny_model(small_tokenizer):
    torch.manual_seed(0)
    config = preset_config("tiny", vocab_size=len(small_tokenizer), mask_token_id=small_tokenizer.mask_token_id)
    return SDARForCausalLM(config).eval()


@pytest.fixture(params=[0, 1], ids=["in_place", "shifted"])
def any_tiny_model(small_tokenizer, request):
    """The tiny model under both prediction conventions: in place (SDAR) and shifted (converted AR models)."""
    torch.manual_seed(0)
    config = preset_config("tiny", vocab_size=len(small_tokenizer), mask_token_id=small_tokenizer.mask_token_id,
                           prediction_shift=request.param)
    return SDARForCausalLM(config).eval()
