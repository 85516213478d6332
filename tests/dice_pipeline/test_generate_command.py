"""`dice generate`: the prompt it builds, and the command end to end on a tiny random checkpoint."""

from __future__ import annotations

import pytest
import torch

from dice_pipeline.cli import main
from dice_pipeline.commands.generate import build_prompt_ids
from dice_pipeline.prompts import kernel_generation_messages, render_chat
from training import SDARForCausalLM, preset_config
from training.generate import GenerationResult
from training.tokenizer import train_bpe_tokenizer

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(16, 1024)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("checkpoint")
    tokenizer = train_bpe_tokenizer([TASK, "```python\nclass ModelNew(nn.Module):\n    pass\n```"] * 5,
                                    vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    model = SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, tokenizer


@pytest.fixture()
def task_file(tmp_path):
    path = tmp_path / "relu.py"
    path.write_text(TASK)
    return path


def test_prompt_is_the_kernelbench_one_shot_prompt_in_the_chat_template(checkpoint):
    _, tokenizer = checkpoint
    ids = build_prompt_ids(tokenizer, TASK)
    assert tokenizer.decode(ids) == render_chat(kernel_generation_messages(TASK), add_generation_prompt=True)


def test_random_checkpoint_runs_end_to_end_and_says_it_wrote_no_code(checkpoint, task_file, tmp_path, capsys):
    directory, _ = checkpoint
    response = tmp_path / "response.txt"
    code = main(["generate", str(task_file), "--checkpoint", str(directory), "--max-new-tokens", "8",
                 "--response-output", str(response), "--quiet"])
    assert code == 1
    assert "no Python code block" in capsys.readouterr().err
    assert response.exists()


def test_extracted_kernel_is_written_to_output(checkpoint, task_file, tmp_path, monkeypatch):
    directory, tokenizer = checkpoint
    answer = "```python\nclass ModelNew(nn.Module):\n    pass\n```"
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def fake_generate(model, prompts, max_new_tokens, **kwargs):
        assert kwargs["strategy"] == "dynamic" and kwargs["confidence_threshold"] == 0.8 and kwargs["steps"] == 2
        kwargs["progress"](len(answer_ids))
        tokens = torch.tensor([answer_ids])
        return GenerationResult(tokens, torch.tensor([len(answer_ids)]), torch.zeros_like(tokens), 3)

    monkeypatch.setattr("training.generate.block_diffusion_generate", fake_generate)
    output = tmp_path / "kernel.py"
    code = main(["generate", str(task_file), "--checkpoint", str(directory), "--confidence-threshold", "0.8", "--steps", "2",
                 "--output", str(output), "--quiet"])
    assert code == 0
    assert output.read_text() == "class ModelNew(nn.Module):\n    pass\n"


def test_missing_task_file_is_a_clear_error(checkpoint, tmp_path, capsys):
    directory, _ = checkpoint
    assert main(["generate", str(tmp_path / "nope.py"), "--checkpoint", str(directory)]) == 2
    assert "not found" in capsys.readouterr().err
