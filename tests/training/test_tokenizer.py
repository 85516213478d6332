"""The BPE tokenizer trained on our code corpus: exact round trips of code, the special tokens, and a chat template
that renders exactly what the prompt builder renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dice_pipeline.prompts import kernel_generation_messages, render_chat
from training.tokenizer import SPECIAL_TOKENS, iter_corpus_texts, train_bpe_tokenizer

KERNELBENCH_TASKS = Path("/work/shared/data/kernelbench/tasks.jsonl")


@pytest.fixture(scope="module")
def kernelbench_tokenizer():
    if not KERNELBENCH_TASKS.is_file():
        pytest.skip(f"{KERNELBENCH_TASKS} not present on this machine")
    return train_bpe_tokenizer(iter_corpus_texts([KERNELBENCH_TASKS]), vocab_size=2048)


def test_code_with_whitespace_runs_round_trips_exactly(kernelbench_tokenizer):
    code = json.loads(KERNELBENCH_TASKS.read_text().splitlines()[7])["code"] + "\n\t\tx  =  1   # odd   spacing\n"
    ids = kernelbench_tokenizer(code, add_special_tokens=False)["input_ids"]
    assert kernelbench_tokenizer.decode(ids) == code
    # Trained on this corpus, the BPE compresses it well below one token per character.
    assert len(ids) < len(code) / 2.5


def test_special_tokens_are_single_ids_and_roles_are_set(kernelbench_tokenizer):
    assert [kernelbench_tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert kernelbench_tokenizer.eos_token == "<|im_end|>"
    assert kernelbench_tokenizer.mask_token == "<|MASK|>"
    ids = kernelbench_tokenizer("a<|MASK|>b<|im_end|>", add_special_tokens=False)["input_ids"]
    assert 3 in ids and 2 in ids


def test_chat_template_renders_like_the_prompt_builder(kernelbench_tokenizer):
    messages = kernel_generation_messages("import torch\n")
    rendered = kernelbench_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == render_chat(messages, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")


def test_corpus_reader_refuses_unknown_files(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"code": "y = 2", "level": 1}) + "\n")
    assert sorted(iter_corpus_texts([tmp_path])) == ["x = 1\n", "y = 2"]
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a corpus file"):
        list(iter_corpus_texts([bad]))
