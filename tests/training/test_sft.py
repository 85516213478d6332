"""SFT data preparation and the training loop's batching."""

from __future__ import annotations

import itertools

import torch

from training.sft import SFTConfig, block_diffusion_batches, text_windows, tokenize_chat_rows, train_block_diffusion


def test_chat_rows_score_the_response_and_end_of_turn_only(small_tokenizer):
    rows = [dict(prompt="write relu", response="y = x.clamp(min=0)"),
            dict(prompt="x " * 200, response="too long a prompt"),
            dict(prompt="empty", response="  "),
            dict(prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "add"}],
                 response="a + b " * 50)]
    result = tokenize_chat_rows(small_tokenizer, rows, max_length=64)

    assert [(s.row, s.reason) for s in result.skipped] == [(1, "prompt_too_long"), (2, "empty_response")]
    assert len(result.samples) == 2 and result.truncated == 1
    first = result.samples[0]
    answer_text = small_tokenizer.decode(first.input_ids[first.answer_mask])
    prompt_text = small_tokenizer.decode(first.input_ids[~first.answer_mask])
    assert answer_text == "y = x.clamp(min=0)<|im_end|>"
    assert prompt_text.endswith("<|im_start|>assistant\n")
    assert result.samples[1].input_ids.numel() == 64


def test_text_windows_cover_the_stream_in_full_windows(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f():\n    return 1\n"] * 10, window=16)
    assert windows and all(w.input_ids.numel() == 16 and w.answer_mask.all() for w in windows)


def test_fixed_row_batches_keep_one_shape_and_lose_no_sample(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f(x):\n    return x * 2\n"] * 40, window=16)
    config = SFTConfig(epochs=1, rows_per_step=2, row_length=64)
    batches = list(block_diffusion_batches(windows, config, block_size=4, mask_token_id=3))
    assert {tuple(b.input_ids.shape) for _, b in batches} == {(2, 64)}
    assert sum(b.num_samples for _, b in batches) == len(windows)


def test_a_few_training_steps_lower_the_loss(tiny_model, small_tokenizer):
    windows = text_windows(small_tokenizer, ["for i in range(n):\n    y[i] = x[i] * 2\n"] * 30, window=16)
    torch.manual_seed(0)
    history = train_block_diffusion(tiny_model, windows, SFTConfig(
        learning_rate=3e-3, epochs=20, max_steps=30, samples_per_step=8, row_length=64))
    assert len(history) == 30
    assert sum(r["loss"] for r in history[-5:]) < sum(r["loss"] for r in history[:5])


def test_learning_rate_warms_up_then_decays_to_the_final_ratio(tiny_model, small_tokenizer):
    windows = text_windows(small_tokenizer, ["for i in range(n):\n    y[i] = x[i] * 2\n"] * 30, window=16)
    history = train_block_diffusion(tiny_model, windows, SFTConfig(
        learning_rate=1e-3, warmup_steps=3, final_lr_ratio=0.1, epochs=20, max_steps=12, samples_per_step=8,
        row_length=64))
    lrs = [r["lr"] for r in history]  # the learning rate set for the step after each record (warm at step 2)
    assert lrs[0] < lrs[1] and max(lrs) <= 1e-3
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:])) and lrs[-1] < 0.3 * max(lrs)


def test_tile_aware_batches_start_every_sample_on_a_tile(small_tokenizer):
    windows = text_windows(small_tokenizer, ["def f(x):\n    return x * 2\n"] * 80, window=40)
    config = SFTConfig(epochs=1, rows_per_step=2, row_length=512, tile=128)
    batches = [b for _, b in block_diffusion_batches(windows, config, block_size=4, mask_token_id=3)]
    assert sum(b.num_samples for b in batches) == len(windows)
    for batch in batches:
        segment = batch.segment_ids
        starts = (segment >= 0) & (torch.diff(segment, dim=1, prepend=segment[:, :1] - 1) != 0)
        assert (torch.nonzero(starts)[:, 1] % 128 == 0).all()
