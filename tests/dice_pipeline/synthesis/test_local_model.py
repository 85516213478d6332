"""The local-checkpoint backend with tiny random-initialised models built here (no hub): a Llama decoded by
transformers' generate, and the project's block-diffusion model decoded by its block sampler."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dice_pipeline.prompts import kernel_generation_messages
from dice_pipeline.synthesis.local_model import TransformersGenerator
from training.configuration_sdar import preset_config
from training.modeling_sdar import SDARForCausalLM
from training.tokenizer import train_bpe_tokenizer

TASK = "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n"


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [TASK, "class ModelNew(nn.Module):\n    pass\n", "```python\nimport torch\n```"] * 20
    corpus += [m["content"] for m in kernel_generation_messages(TASK)]
    return train_bpe_tokenizer(corpus, vocab_size=400, min_frequency=1)


def tiny_llama(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


def test_transformers_backend_samples_n_candidates_reproducibly(tokenizer):
    generator = TransformersGenerator(tiny_llama(tokenizer), tokenizer, model_name="tiny-llama", max_new_tokens=12,
                                      temperature=1.0, top_p=1.0)
    first = generator.generate(TASK, 3, seed=7)
    again = generator.generate(TASK, 3, seed=7)
    assert len(first) == 3
    assert [c.text for c in first] == [c.text for c in again]
    assert len({c.text for c in first}) > 1  # sampling, not three copies of one answer
    for index, c in enumerate(first):
        assert c.backend == "transformers" and c.model == "tiny-llama" and c.sample_index == index
        assert c.finish_reason in {"stop", "length"}
        assert 0 < c.usage["completion_tokens"] <= 12
        assert c.prompt_messages == kernel_generation_messages(TASK)
        assert c.code is None or isinstance(c.code, str)  # an untrained model rarely writes a code block


def test_transformers_backend_prompt_uses_the_chat_template(tokenizer):
    generator = TransformersGenerator(tiny_llama(tokenizer), tokenizer, max_new_tokens=2)
    ids = generator._prompt_ids(kernel_generation_messages(TASK))
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_extracts_code_when_the_model_writes_a_block(tokenizer, monkeypatch):
    answer = "```python\nclass ModelNew(nn.Module):\n    pass\n```"
    generator = TransformersGenerator(tiny_llama(tokenizer), tokenizer, max_new_tokens=4)
    # Whatever the untrained model samples decodes to a fixed answer with a code block.
    monkeypatch.setattr(generator.tokenizer, "decode", lambda ids, skip_special_tokens=True: answer)
    [candidate] = generator.generate(TASK, 1, seed=0)
    assert candidate.code == "class ModelNew(nn.Module):\n    pass\n"


def test_block_diffusion_backend_decodes_with_the_block_sampler(tokenizer):
    config = preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = SDARForCausalLM(config).eval()
    generator = TransformersGenerator(model, tokenizer, decoding="block_diffusion", max_new_tokens=8,
                                      temperature=1.0, top_p=1.0, block_diffusion_options={"steps": 2})
    candidates = generator.generate(TASK, 2, seed=3)
    assert [c.backend for c in candidates] == ["block_diffusion"] * 2
    assert candidates[0].variant["decoding"] == "block_diffusion" and candidates[0].variant["steps"] == 2
    assert all(0 < c.usage["completion_tokens"] <= 8 for c in candidates)
    assert [c.text for c in generator.generate(TASK, 2, seed=3)] == [c.text for c in candidates]


def test_rejects_bad_settings(tokenizer):
    with pytest.raises(ValueError, match="decoding"):
        TransformersGenerator(tiny_llama(tokenizer), tokenizer, decoding="beam")
    with pytest.raises(ValueError, match="block_size"):
        TransformersGenerator(tiny_llama(tokenizer), tokenizer, decoding="block_diffusion")
