"""SFT data preparation (over-length rows dropped, max_length from the data), the recipes, and the training loop's
batching, learning-rate schedule and optimizer."""

from __future__ import annotations

import itertools

import pytest
import torch

from training.sft import (SFT_RECIPES, SFTConfig, block_diffusion_batches, text_windows, tokenize_chat_rows,
                          train_block_diffusion)


def test_chat_rows_score_the_response_and_end_of_turn_only_and_over_length_rows_are_dropped(small_tokenizer):
    rows = [dict(prompt="write relu", response="y = x.clamp(min=0)"),
            dict(prompt="x " * 200, response="too long a prompt"),
            dict(prompt="empty", response="  "),
            dict(prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "add"}],
                 response="a + b " * 50)]
    result = tokenize_chat_rows(small_tokenizer, rows, max_length=64)

    assert [(s.row, s.reason) for s in result.skipped] == [(1, "too_long"), (2, "empty_response"), (3, "too_long")]
    assert result.skipped_by_reason() == {"too_long": 2, "empty_response": 1} and result.max_length == 64
    (first,) = result.samples  # the long answer is dropped whole, never cut into an answer that does not close
    answer_text = small_tokenizer.decode(first.input_ids[first.answer_mask])
    prompt_text = small_tokenizer.decode(first.input_ids[~first.answer_mask])
    assert answer_text == "y = x.clamp(min=0)<|im_end|>"
    assert prompt_text.endswith("<|im_start|>assistant\n")


def test_max_length_is_the_longest_row_rounded_to_a_block_and_capped(small_tokenizer):
    rows = [dict(prompt="write relu", response="y = x.clamp(min=0)"), dict(prompt="add", response="a + b " * 20)]
    lengths = [s.input_ids.numel() for s in tokenize_chat_rows(small_tokenizer, rows, max_length=10**6).samples]
    chosen = tokenize_chat_rows(small_tokenizer, rows, block_size=4)
    assert chosen.max_length == -(-max(lengths) // 4) * 4 and len(chosen.samples) == 2 and not chosen.skipped
    capped = tokenize_chat_rows(small_tokenizer, rows, max_length_cap=max(lengths) - 1, block_size=4)
    assert capped.max_length == max(lengths) - 1
    assert [s.reason for s in capped.skipped] == ["too_long"] and len(capped.samples) == 1


def test_the_small_model_recipe_is_the_default_and_the_papers_is_a_named_preset():
    small, paper = SFTConfig(), SFTConfig.from_dict({"recipe": "dice_8b", "max_seconds": 60})
    assert (small.learning_rate, small.adam_betas, small.final_lr_ratio) == (1e-4, (0.9, 0.95), 0.1)
    assert (paper.learning_rate, paper.adam_betas, paper.final_lr_ratio) == (1e-5, (0.9, 0.999), 1.0)
    assert paper.recipe == "dice_8b" and paper.max_seconds == 60 and set(SFT_RECIPES) == {"small", "dice_8b"}
    assert SFTConfig.from_dict({"recipe": "dice_8b", "learning_rate": 2e-5}).learning_rate == 2e-5
    with pytest.raises(ValueError, match="unknown SFT recipe"):
        SFTConfig.from_dict({"recipe": "huge"})
    with pytest.raises(ValueError, match="unknown SFT config keys"):
        SFTConfig.from_dict({"lr": 1.0})


def test_the_loop_trains_with_the_configs_betas_and_saves_them_in_its_checkpoint(tiny_model, small_tokenizer,
                                                                                 tmp_path):
    windows = text_windows(small_tokenizer, ["def f(x):\n    return x * 2\n"] * 20, window=16)
    config = SFTConfig.from_dict({"recipe": "dice_8b", "max_steps": 2, "samples_per_step": 4})
    result = train_block_diffusion(tiny_model, windows, config, tokenizer=small_tokenizer, out_dir=tmp_path)
    optimizer = torch.load(tmp_path / "step-2" / "optimizer.pt")
    assert optimizer["param_groups"][0]["betas"] == (0.9, 0.999) and result["stopped_by"] == "max_steps"
    assert result["history"][0]["lr"] == pytest.approx(1e-5)  # 3 % of 2 steps: warm from the first step


def test_text_windows_cover_the_stream_in_full_windows(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f():\n    return 1\n"] * 10, window=16)
    assert windows and all(w.input_ids.numel() == 16 and w.answer_mask.all() for w in windows)


def test_fixed_row_batches_keep_one_shape_and_lose_no_sample(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f(x):\n    return x * 2\n"] * 40, window=16)
    config = SFTConfig(epochs=1, rows_per_step=2, row_length=64)
    batches = list(block_diffusion_batches(windows, config, block_size=4, mask_token_id=3))
    assert {tuple(b.input_ids.shape) for _, b, _ in batches} == {(2, 64)}
    assert sum(b.num_samples for _, b, _ in batches) == len(windows)


def test_a_few_training_steps_lower_the_loss(tiny_model, small_tokenizer):
    windows = text_windows(small_tokenizer, ["for i in range(n):\n    y[i] = x[i] * 2\n"] * 30, window=16)
    torch.manual_seed(0)
    history = train_block_diffusion(tiny_model, windows, SFTConfig(
        learning_rate=3e-3, epochs=20, max_steps=30, samples_per_step=8, row_length=64))["history"]
    assert len(history) == 30
    assert sum(r["loss"] for r in history[-5:]) < sum(r["loss"] for r in history[:5])


def test_learning_rate_warms_up_then_decays_to_the_final_ratio(tiny_model, small_tokenizer):
    windows = text_windows(small_tokenizer, ["for i in range(n):\n    y[i] = x[i] * 2\n"] * 30, window=16)
    history = train_block_diffusion(tiny_model, windows, SFTConfig(
        learning_rate=1e-3, warmup_steps=3, final_lr_ratio=0.1, epochs=20, max_steps=12, samples_per_step=8,
        row_length=64))["history"]
    lrs = [r["lr"] for r in history]  # the learning rate each step trained at
    assert lrs[0] < lrs[1] < lrs[2] and max(lrs) <= 1e-3
    assert all(a >= b for a, b in itertools.pairwise(lrs[2:])) and lrs[-1] < 0.3 * max(lrs)


def test_tile_aware_batches_start_every_sample_on_a_tile(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f(x):\n    return x * 2\n"] * 80, window=40)
    config = SFTConfig(epochs=1, rows_per_step=2, row_length=512, tile=128)
    batches = [b for _, b, _ in block_diffusion_batches(windows, config, block_size=4, mask_token_id=3)]
    assert sum(b.num_samples for b in batches) == len(windows)
    for batch in batches:
        segment = batch.segment_ids
        starts = (segment >= 0) & (torch.diff(segment, dim=1, prepend=segment[:, :1] - 1) != 0)
        assert (torch.nonzero(starts)[:, 1] % 128 == 0).all()
