"""Evaluation generation with tiny random models built here: the paper's protocol for a block-diffusion checkpoint
saved and loaded from disk, a plain transformers causal LM as a comparison row, pass@k samples, and an endpoint."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dice_pipeline.evaluation.generation import CheckpointGenerator, EndpointGenerator, EvalGenerationSettings
from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.synthesis.candidates import GeneratedCandidate
from training.configuration_sdar import preset_config
from training.modeling_sdar import SDARForCausalLM
from training.tokenizer import train_bpe_tokenizer

CODE = "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n"
TASKS = [KernelBenchTask(1, 1, "1_a", CODE), KernelBenchTask(1, 2, "2_b", CODE + "\n# longer prompt\n" * 3)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer([CODE, "```python\nclass ModelNew(nn.Module):\n    pass\n```"] * 20, vocab_size=300,
                               min_frequency=1)


def test_paper_protocol_defaults():
    settings = EvalGenerationSettings()
    assert (settings.block_size, settings.steps, settings.strategy, settings.max_new_tokens, settings.temperature,
            settings.samples) == (4, 4, "static", 4096, 0.0, 1)
    with pytest.raises(ValueError, match="temperature"):
        EvalGenerationSettings(samples=4)


def test_block_diffusion_checkpoint_from_disk_decodes_a_batch_of_tasks(tokenizer, tmp_path):
    torch.manual_seed(0)
    SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
                    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = CheckpointGenerator.from_pretrained(str(tmp_path), EvalGenerationSettings(max_new_tokens=8))
    assert generator.decoding == "block_diffusion"
    answers = generator(TASKS, seed=0)
    assert [len(a) for a in answers] == [1, 1]
    sample = answers[0][0]
    assert sample["backend"] == "block_diffusion" and sample["settings"]["steps"] == 4
    assert sample["usage"]["completion_tokens"] <= 8 and sample["finish_reason"] in ("stop", "length")
    again = generator(TASKS, seed=0)  # greedy: the same answers again
    assert [a[0]["text"] for a in again] == [a[0]["text"] for a in answers]


def test_causal_lm_comparison_row_with_k_samples(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    settings = EvalGenerationSettings(max_new_tokens=6, samples=3, temperature=1.0)
    generator = CheckpointGenerator(LlamaForCausalLM(config).eval(), tokenizer, settings, model_name="tiny-llama")
    assert generator.decoding == "autoregressive" and generator.backend == "transformers"
    answers = generator(TASKS, seed=1)
    assert [len(a) for a in answers] == [3, 3] and [s["sample_index"] for s in answers[1]] == [0, 1, 2]
    assert all(s["model"] == "tiny-llama" and s["usage"]["completion_tokens"] <= 6 for a in answers for s in a)


def test_endpoint_rows_extract_the_code_block():
    class FakeEndpoint:
        model_name = "served-model"

        def generate(self, code, n, *, seed):
            return [GeneratedCandidate(text="here:\n```python\nclass ModelNew:\n    pass\n```", code=None,
                                       backend="openai_compatible", model="served-model", prompt_messages=[],
                                       finish_reason="stop", latency_s=0.1, sample_index=i) for i in range(n)]

    answers = EndpointGenerator(FakeEndpoint())(TASKS, seed=0)
    assert [a[0]["code"] for a in answers] == ["class ModelNew:\n    pass\n"] * 2
    assert answers[0][0]["backend"] == "openai_compatible"


def test_the_confidence_threshold_rename_keeps_an_evaluations_state_directory():
    from dice_pipeline.evaluation.runner import state_key, state_key_settings

    # The key an evaluation with the default settings had before `threshold` became `confidence_threshold`.
    identity = {"name": "sft", "path": "/ckpt/sft", "settings": state_key_settings(EvalGenerationSettings())}
    assert state_key("sft", identity) == "sft-f237c580511d"
    assert EvalGenerationSettings().confidence_threshold == 0.9 and "threshold" not in EvalGenerationSettings().to_dict()
