"""Supervised fine-tuning with the block-diffusion objective, readable top to bottom: chat rows (prompt, response)
become token ids with an answer mask, are noised and packed, and trained with AdamW at a constant learning rate
after warm-up (DICE: lr 1e-5, 3 % warm-up, 3 epochs, bf16). Plain text windows (every token an answer) give the
continued-training mode used to convert an autoregressive model into a block-diffusion one.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from training.diffusion import (BlockDiffusionBatch, NoisySegment, TokenizedSample, block_diffusion_loss,
                                build_attention_mask, noise_sample, pack_segments)
from training.modeling_sdar import set_flex_compile_mode


@dataclass
class SkippedRow:
    row: int
    reason: str  # e.g. "prompt_too_long", "empty_response"
    message: str


@dataclass
class TokenizedRows:
    samples: list[TokenizedSample]
    skipped: list[SkippedRow] = field(default_factory=list)
    truncated: int = 0  # rows kept with their response cut at max_length


def _messages(prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def tokenize_chat_rows(tokenizer, rows: Iterable[dict], max_length: int) -> TokenizedRows:
    """`rows` have `prompt` (a user string or a list of chat messages) and `response`; the answer is the response
    plus the end-of-turn token. Rows whose prompt leaves no room for an answer are skipped with a reason."""
    result = TokenizedRows(samples=[])
    eos = tokenizer.eos_token_id
    for index, row in enumerate(rows):
        response = row.get("response")
        if not isinstance(response, str) or not response.strip():
            result.skipped.append(SkippedRow(index, "empty_response", "response is missing or blank"))
            continue
        prompt_text = tokenizer.apply_chat_template(_messages(row["prompt"]), tokenize=False,
                                                    add_generation_prompt=True)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        if len(prompt_ids) >= max_length:
            result.skipped.append(SkippedRow(index, "prompt_too_long",
                                             f"prompt has {len(prompt_ids)} tokens, max_length is {max_length}"))
            continue
        if len(prompt_ids) + len(answer_ids) > max_length:
            answer_ids = answer_ids[: max_length - len(prompt_ids)]
            result.truncated += 1
        ids = torch.tensor(prompt_ids + answer_ids, dtype=torch.long)
        answer = torch.arange(ids.numel()) >= len(prompt_ids)
        result.samples.append(TokenizedSample(ids, answer))
    return result


def text_windows(tokenizer, texts: Iterable[str], window: int) -> list[TokenizedSample]:
    """Continued-training samples: the texts joined by end-of-text and cut into `window`-token pieces, every token
    scored (how SDAR converts a pretrained autoregressive model)."""
    separator = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:  # one batched call: runs in parallel
        stream.extend(ids + [separator])
    return [TokenizedSample(torch.tensor(stream[i:i + window]), torch.ones(window, dtype=torch.bool))
            for i in range(0, len(stream) - window + 1, window)]


@dataclass
class SFTConfig:
    learning_rate: float = 1e-5
    warmup_ratio: float = 0.03
    warmup_steps: int | None = None  # overrides warmup_ratio (time-boxed runs do not know their step count)
    epochs: int = 3
    max_steps: int | None = None  # stop early
    max_seconds: float | None = None  # stop after this much training time (time-boxed runs)
    samples_per_step: int = 8  # used when rows_per_step is None
    rows_per_step: int | None = None  # fixed batch shape: fill this many rows per step (token-budget batching)
    row_length: int = 4096  # packed row length; a sample of L tokens needs up to 2L
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    attention_backend: str = "auto"  # "dense" (CPU), "flex" (GPU), "auto" picks by device
    drop_unscored_blocks: bool = True
    tile: int | None = None  # 128: tile-aware packing for flex attention (exact; see diffusion.pack_segments)
    # torch.compile mode of flex attention on the GPU. "max-autotune-no-cudagraphs" benchmarks its kernels once per
    # row shape (about 100 s at 32k tokens on an H200) and made a 0.6B step 1-2% faster there (benchmarks/RESULTS.md):
    # worth it for long runs with fixed rows (rows_per_step), not for short ones.
    flex_compile_mode: str | None = None
    # After warm-up, cosine decay to this fraction of the learning rate over the run (its steps, or max_seconds
    # when set); 1.0 keeps it constant (DICE's recipe). Short time-boxed runs reach a lower loss with decay.
    final_lr_ratio: float = 1.0


def continued_training_config(learning_rate: float, max_seconds: float, window: int, rows_per_step: int = 8,
                              warmup_steps: int = 50) -> SFTConfig:
    """SDAR's conversion step as a time-boxed run on `text_windows` of `window` tokens: fixed rows of 8 windows
    (one attention shape), cosine decay to a tenth over `max_seconds`, dense SDPA (no compile time out of a short
    budget). benchmarks/decode_throughput.py and train_pipeline_gpu.py --convert-seconds train this way."""
    return SFTConfig(learning_rate=learning_rate, warmup_steps=warmup_steps, final_lr_ratio=0.1, epochs=1000,
                     max_seconds=max_seconds, rows_per_step=rows_per_step, row_length=8 * window,
                     attention_backend="dense")


def block_diffusion_batches(samples: Sequence[TokenizedSample], config: SFTConfig, block_size: int,
                            mask_token_id: int) -> Iterator[tuple[int, BlockDiffusionBatch]]:
    """(epoch, batch) pairs over shuffled epochs. With `rows_per_step`, each batch is exactly that many rows, filled
    from the stream of noised samples (those that do not fit wait, noised, for the next batch), so the attention
    kernels see one shape; otherwise each batch packs `samples_per_step` samples into as many rows as they need."""
    noise = torch.Generator().manual_seed(config.seed)
    shuffler = random.Random(config.seed)
    order = list(range(len(samples)))
    capacity = (config.rows_per_step or 0) * config.row_length
    pending: list[NoisySegment] = []

    def pack() -> BlockDiffusionBatch:
        batch, pending[:] = pack_segments(pending, mask_token_id, block_size, config.row_length,
                                          max_rows=config.rows_per_step, tile=config.tile)
        return batch

    for epoch in range(config.epochs):
        shuffler.shuffle(order)
        for index in order:
            pending.append(noise_sample(samples[index], block_size, noise, config.drop_unscored_blocks))
            full = sum(s.length for s in pending) >= capacity if capacity else len(pending) >= config.samples_per_step
            if full:
                yield epoch, pack()
        if not capacity and pending:
            yield epoch, pack()
    while pending:  # the tail of the last epoch
        yield config.epochs - 1, pack()


def train_block_diffusion(
    model,
    samples: Sequence[TokenizedSample],
    config: SFTConfig,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train `model` in place; returns one record per optimizer step (step, epoch, loss, lr, clean_tokens, seconds)."""
    if not samples:
        raise ValueError("no training samples")
    device = next(model.parameters()).device
    if config.rows_per_step:
        tokens_per_epoch = sum(2 * s.input_ids.numel() for s in samples)
        steps_per_epoch = math.ceil(tokens_per_epoch / (config.rows_per_step * config.row_length))
    else:
        steps_per_epoch = math.ceil(len(samples) / config.samples_per_step)
    total_steps = steps_per_epoch * config.epochs  # an estimate with token budgets; only sets the warm-up length
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    warmup_steps = config.warmup_steps or max(1, round(config.warmup_ratio * total_steps))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=config.weight_decay, fused=device.type == "cuda")

    def set_learning_rate(step: int, seconds: float) -> float:
        """Linear warm-up over `warmup_steps`, then constant, or a cosine decay to `final_lr_ratio` over the run."""
        progress = seconds / config.max_seconds if config.max_seconds else step / max(total_steps, 1)
        decay = config.final_lr_ratio + (1 - config.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1)))
        lr = config.learning_rate * min(1.0, (step + 1) / warmup_steps) * decay
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    set_learning_rate(0, 0.0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    set_flex_compile_mode(config.flex_compile_mode)
    model.train()
    history: list[dict] = []
    started = time.perf_counter()
    for step, (epoch, batch) in enumerate(
            block_diffusion_batches(samples, config, model.config.block_size, model.config.mask_token_id), 1):
        batch = batch.to(device)
        with autocast:
            mask = build_attention_mask(batch, config.attention_backend, block_size=model.config.block_size)
            loss = block_diffusion_loss(model, batch, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        next_lr = set_learning_rate(step, time.perf_counter() - started)
        record = dict(step=step, epoch=epoch, loss=loss.item(), lr=next_lr,
                      clean_tokens=batch.num_clean_tokens, seconds=time.perf_counter() - started)
        history.append(record)
        if on_step is not None:
            on_step(record)
        if (config.max_steps is not None and step >= config.max_steps) or (
                config.max_seconds is not None and record["seconds"] >= config.max_seconds):
            break
    model.eval()
    return history
