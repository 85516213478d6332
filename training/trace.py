"""Rollouts and their trace replay for TraceRL (training/rl.py). The block-diffusion sampler records the forward that
committed each token (the trace); the replay scores every committed token under the state the sampler saw then:
earlier blocks clean, the tokens of its block committed at earlier steps (and the prompt tokens a first block
holds) revealed, the rest MASK. One replay forward per denoising-step index covers every block of every response in
a micro-batch, in the `[x_t ; x_0]` training layout of diffusion.py (the noisy copies are the trace states), with
the same block partition (training/blocks.py) and prediction shift as the sampler and SFT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from training.blocks import block_of, decoded_span_end, first_decoded_block, last_decoded_block, prediction_shift
from training.diffusion import (IGNORE_INDEX, BlockDiffusionBatch, build_attention_mask, check_prediction_shift,
                                predictor_index)
from training.generate import block_diffusion_generate
from training.tasks import RLTask
from training.tokenizer import stop_token_ids


@dataclass
class Rollout:
    """One sampled completion and its trace. `block_tokens`/`block_steps` are what the sampler left from the answer's
    first position to the end of its last decoded block (tokens after an EOS inside its block kept: they were part
    of the states) and the forward index that committed each (-1 never); the response is the first `length`."""

    task_index: int  # into the step's task list
    sample_index: int
    prompt_ids: list[int]
    block_tokens: torch.Tensor  # [decoded_span_end(L, length) - L] long, CPU
    block_steps: torch.Tensor  # same shape
    length: int
    text: str = ""


def prompt_ids_for(tokenizer, task: RLTask) -> list[int]:
    """The chat prompt as token ids, as SFT tokenizes it (the tokenizer's template, generation prompt added)."""
    text = tokenizer.apply_chat_template(task.messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def rollouts_from_generation(result, prompts: Sequence[Sequence[int]], block_size: int, jobs: Sequence[tuple],
                             texts: Sequence[str] | None = None) -> list[Rollout]:
    """One `Rollout` per row of a `GenerationResult`; `jobs[row]` = (task index, sample index)."""
    rollouts = []
    for row, (t, g) in enumerate(jobs):
        length = int(result.lengths[row])
        span = decoded_span_end(len(prompts[row]), length, block_size) - len(prompts[row])
        rollouts.append(Rollout(t, g, list(prompts[row]), result.block_tokens[row, :span].clone(),
                                result.block_unmask_steps[row, :span].clone(), length,
                                texts[row] if texts is not None else ""))
    return rollouts


@torch.no_grad()
def generate_rollouts(model, tokenizer, tasks: Sequence[RLTask], config,
                      generator: torch.Generator | None = None,
                      on_batch: Callable[[list[Rollout]], None] | None = None) -> list[Rollout]:
    """G samples of every task (task-major order), `rollout_batch_size` prompts per sampler call (an RLConfig);
    `on_batch` gets each call's rollouts as soon as they exist."""
    model.eval()
    prompts = [prompt_ids_for(tokenizer, task) for task in tasks]
    jobs = [(t, g) for t in range(len(tasks)) for g in range(config.samples_per_task)]
    rollouts: list[Rollout] = []
    for start in range(0, len(jobs), config.rollout_batch_size):
        chunk = jobs[start:start + config.rollout_batch_size]
        chunk_prompts = [prompts[t] for t, _ in chunk]
        result = block_diffusion_generate(
            model, chunk_prompts, config.max_new_tokens, block_size=config.block_size,
            steps=config.denoising_steps, strategy=config.strategy,
            confidence_threshold=config.confidence_threshold, temperature=config.temperature,
            eos_token_id=stop_token_ids(tokenizer, model),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            mask_token_id=model.config.mask_token_id, generator=generator)
        texts = [tokenizer.decode(result.tokens[row, :int(result.lengths[row])], skip_special_tokens=True)
                 for row in range(len(chunk))]
        rollouts.extend(rollouts_from_generation(result, chunk_prompts, config.block_size, chunk, texts))
        if on_batch is not None:
            on_batch(rollouts[-len(chunk):])
    return rollouts


@dataclass
class TraceBatch:
    """The replay forward of one denoising-step index for a few rollouts: packed `[noisy blocks ; clean prefix]`
    rows (a `BlockDiffusionBatch`: its `targets` at `scored_index` are the tokens committed at that step), and for
    each scored position the index of its token in the flat list of all rollouts' response tokens."""

    batch: BlockDiffusionBatch
    token_index: torch.Tensor  # [num scored] long, aligned with batch.scored_index

    def to(self, device) -> "TraceBatch":
        return TraceBatch(self.batch.to(device), self.token_index.to(device))


def token_offsets(rollouts: Sequence[Rollout]) -> list[int]:
    """Start of each rollout's response tokens in the flat token list (rollout-major, then position)."""
    offsets, total = [], 0
    for rollout in rollouts:
        offsets.append(total)
        total += rollout.length
    return offsets + [total]


def trace_batches(rollouts: Sequence[Rollout], block_size: int, steps: int, mask_token_id: int,
                  pad_token_id: int = 0, offsets: Sequence[int] | None = None, row_multiple: int = 1,
                  shift: int = 0) -> Iterator[TraceBatch]:
    """For s = 0..steps-1, the replay batch of denoising step s (skipped when no token was committed at step s).

    Row of a rollout: for every decoded block with a token committed at its step s, a noisy copy of the block (the
    prompt tokens it holds and the tokens committed at earlier steps revealed, the rest MASK; scored: the tokens
    committed at step s), then the clean sequence (prompt and response) up to its last decoded block. Positions and
    blocks are the sequence's own (SDAR's partition, as the sampler decoded it), so the block-diffusion mask of
    diffusion.py gives exactly the sampler's visibility, and `shift` picks the hidden states it predicted from."""
    offsets = token_offsets(rollouts) if offsets is None else offsets
    for step in range(steps):
        rows = []
        for r, rollout in enumerate(rollouts):
            row = _trace_row(rollout, step, block_size, mask_token_id, offsets[r])
            if row is not None:
                rows.append(row)
        if not rows:
            continue
        length = max(row["input_ids"].numel() for row in rows)
        length = -(-length // row_multiple) * row_multiple
        shape = (len(rows), length)
        fields = dict(input_ids=torch.full(shape, pad_token_id, dtype=torch.long),
                      position_ids=torch.zeros(shape, dtype=torch.long),
                      segment_ids=torch.full(shape, -1, dtype=torch.long),
                      block_ids=torch.zeros(shape, dtype=torch.long),
                      is_noisy=torch.zeros(shape, dtype=torch.bool),
                      targets=torch.full(shape, IGNORE_INDEX, dtype=torch.long),
                      token_index=torch.full(shape, -1, dtype=torch.long))
        for i, row in enumerate(rows):
            n = row["input_ids"].numel()
            for name, value in row.items():
                fields[name][i, :n] = value
            fields["segment_ids"][i, :n] = i
        token_index = fields.pop("token_index").flatten()
        scored_index = torch.nonzero(token_index >= 0).flatten()
        scored = scored_index.numel()
        batch = BlockDiffusionBatch(**fields, loss_weights=(fields["targets"] != IGNORE_INDEX).float(),
                                    scored_index=scored_index,
                                    predictor_index=predictor_index(fields["position_ids"], fields["segment_ids"],
                                                                    fields["is_noisy"], scored_index, block_size,
                                                                    shift),
                                    num_answer_tokens=scored,
                                    num_clean_tokens=int((~fields["is_noisy"] & (fields["segment_ids"] >= 0)).sum()),
                                    num_samples=len(rows), prediction_shift=shift)
        yield TraceBatch(batch, token_index[scored_index])


def _trace_row(rollout: Rollout, step: int, block_size: int, mask_token_id: int, offset: int) -> dict | None:
    prompt = torch.as_tensor(rollout.prompt_ids, dtype=torch.long)
    prompt_length = prompt.numel()
    first = first_decoded_block(prompt_length, block_size)
    last = last_decoded_block(prompt_length, rollout.length, block_size)
    blocks_count = last - first + 1
    span_start = first * block_size
    given = prompt[span_start:]  # the prompt tokens the first decoded block holds
    sequence = torch.cat((prompt, rollout.block_tokens))
    tokens = sequence[span_start:(last + 1) * block_size].view(blocks_count, block_size)
    forwards = torch.cat((torch.full((given.numel(),), -1, dtype=torch.long),
                          rollout.block_steps))[:blocks_count * block_size].view(blocks_count, block_size)
    positions = torch.arange(span_start, (last + 1) * block_size).view(blocks_count, block_size)
    in_response = (positions >= prompt_length) & (positions < prompt_length + rollout.length)
    is_given = positions < prompt_length
    committed = forwards >= 0
    if bool((in_response & ~committed).any()):
        raise ValueError("a response token has no recorded unmask step: the trace is incomplete")
    # A block's denoising step s is its first forward + s (each step commits at least one token until it is done).
    first_forward = torch.where(committed, forwards, torch.iinfo(torch.long).max).min(dim=1, keepdim=True).values
    this_step = first_forward + step
    scored = (forwards == this_step) & in_response
    blocks = torch.nonzero(scored.any(dim=1)).flatten()
    if blocks.numel() == 0:
        return None
    revealed = is_given | (committed & (forwards < this_step))
    noisy_tokens = torch.where(revealed, tokens, mask_token_id)[blocks].flatten()
    noisy_positions = positions[blocks].flatten()
    noisy_scored = scored[blocks].flatten()
    clean = sequence[:last * block_size]  # everything before the last decoded block
    all_positions = torch.cat((noisy_positions, torch.arange(clean.numel())))
    return dict(
        input_ids=torch.cat((noisy_tokens, clean)),
        position_ids=all_positions,
        block_ids=block_of(all_positions, block_size),
        is_noisy=torch.arange(all_positions.numel()) < noisy_tokens.numel(),
        targets=torch.cat((torch.where(noisy_scored, tokens[blocks].flatten(), IGNORE_INDEX),
                           torch.full((clean.numel(),), IGNORE_INDEX, dtype=torch.long))),
        token_index=torch.cat((torch.where(noisy_scored, offset + noisy_positions - prompt_length, -1),
                               torch.full((clean.numel(),), -1, dtype=torch.long))),
    )


def trace_forward(model, trace: TraceBatch, temperature: float, attention_backend: str = "auto") -> torch.Tensor:
    """Log-probs [num scored] of the committed tokens under the states of `trace`, at the sampling temperature and
    with the MASK token excluded, as the sampler drew them (generate.sample_tokens)."""
    batch = trace.batch
    check_prediction_shift(model, batch)
    mask = build_attention_mask(batch, "dense" if attention_backend == "auto" else attention_backend)
    # One call of the model's forward (logits at the predicting positions only): a sharded model gathers as it runs.
    logits = model(batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                   logits_at=batch.predictor_index).logits.float()
    logits[:, model.config.mask_token_id] = float("-inf")
    targets = batch.targets.flatten().index_select(0, batch.scored_index)
    return -torch.nn.functional.cross_entropy(logits / temperature, targets, reduction="none")


def row_multiple(device) -> int:
    """Replay rows are padded to a multiple of this: flex's 128-token tiles, aligned masks for SDPA's kernels."""
    return 128 if torch.device(device).type == "cuda" else 1


def model_trace_batches(model, rollouts: Sequence[Rollout], config, offsets: Sequence[int]) -> Iterator[TraceBatch]:
    """`trace_batches` with the model's mask token and prediction shift, on its device's row multiple."""
    device = next(model.parameters()).device
    for trace in trace_batches(rollouts, config.block_size, config.denoising_steps, model.config.mask_token_id,
                               offsets=offsets, row_multiple=row_multiple(device),
                               shift=prediction_shift(model.config)):
        yield trace.to(device)


def trace_log_probs(model, rollouts: Sequence[Rollout], config) -> torch.Tensor:
    """Log-probs of every response token of `rollouts` (flat, rollout-major) by replaying the traces, without
    gradients, `micro_batch_size` rollouts a forward (an RLConfig)."""
    device = next(model.parameters()).device
    offsets = token_offsets(rollouts)
    out = torch.zeros(offsets[-1], dtype=torch.float32, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with torch.no_grad(), autocast:
        for start in range(0, len(rollouts), config.micro_batch_size):
            micro = rollouts[start:start + config.micro_batch_size]
            for trace in model_trace_batches(model, micro, config, offsets[start:start + len(micro)]):
                out[trace.token_index] = trace_forward(model, trace, config.temperature, config.attention_backend)
    return out
