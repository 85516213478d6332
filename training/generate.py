"""Decoding for the block-diffusion LM: semi-autoregressive block decoding with a KV cache (SDAR's sampler, with
static top-k or dynamic confidence-threshold unmasking) and, for comparison, KV-cached autoregressive decoding of
the same model. Both take a batch of prompts of different lengths.

Blocks follow SDAR's partition (training/blocks.py): counted from each sequence's first token, the prompt's whole
blocks prefilled, decoding starting in the block that holds the prompt's last tokens (given, never masked). Every row
keeps its own block offsets and moves on its own: a row whose block is finished commits it and starts its next block
at the next forward, whatever the other rows are doing, so a batch decodes as each of its rows would alone.

One decoding forward covers, for every row, [previous block, current block]: the previous block, now final, rewrites
its keys/values in the cache while the current block is denoised against it. This folds SDAR's extra "commit"
forward per block into the next block's first denoising step, so a block costs exactly its denoising steps; the
previous block's last hidden state is also what a shifted model (`prediction_shift` 1) predicts the block's first
token from. Rows with no previous block, or finished, point that half (or both) at two spare blocks past the end of
the buffer that no real query can see.

Every decoding step of either decoder has fixed shapes (`StaticDecodingForward`: a few query tokens a row against
the whole preallocated cache), so on CUDA it is captured once as a CUDA graph and replayed; an eager forward of a
small model at batch 1 is launch-bound. On the CPU the same code runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from training.blocks import (block_of, decoded_span_end, first_decoded_block, last_decoded_block, prediction_shift,
                             whole_prompt_blocks)
from training.modeling_sdar import KVCache


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # [B, max_new_tokens] generated ids; after a row's EOS, pad_token_id
    lengths: torch.Tensor  # [B] tokens up to and including the first EOS (max_new_tokens if none)
    unmask_steps: torch.Tensor  # [B, max_new_tokens] index of the forward whose prediction committed each token
    num_forwards: int  # model forward passes, prefill included
    # What the sampler left in the blocks it decoded, from the answer's first position to the end of the row's last
    # decoded block: [B, W] ids (tokens after an EOS inside its block kept; never decoded or past the row's blocks =
    # pad) and their unmask steps (-1 = never committed). The states a block passed through are exactly these, so
    # RL can replay the trace (training/trace.py).
    block_tokens: torch.Tensor | None = None
    block_unmask_steps: torch.Tensor | None = None


def _prompt_buffer(prompts: Sequence[Sequence[int]], total: int, fill_id: int, device):
    """ids [B, total]: each prompt from column 0 (a column is a position: no padding before a prompt), `fill_id`
    after it; and the prompt lengths [B]."""
    ids = torch.full((len(prompts), total), fill_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {row} is empty")
        ids[row, :len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
    return ids.to(device), torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)


def block_causal_mask(query_positions: torch.Tensor, total: int, block_size: int) -> torch.Tensor:
    """Bool mask over keys 0..total-1 for queries at `query_positions` ([Q] shared, or [B, Q] a row): a query sees
    the keys of its own and earlier blocks (block_size=1: the causal mask), and itself. [1, 1, Q, total] or
    [B, 1, Q, total]."""
    key = torch.arange(total, device=query_positions.device)
    query = query_positions[..., None]
    visible = (block_of(key, block_size) <= block_of(query, block_size)) | (key == query)
    return visible[None, None] if query_positions.dim() == 1 else visible[:, None]


def model_logits(model, ids: torch.Tensor, start: int, end: int, block_size: int,
                 cache: KVCache | None) -> torch.Tensor:
    """Logits [B, end-start, V] of positions [start, end) (raw: position p's own hidden state) under the
    block-causal mask. With a cache, only those positions are run (their keys and values are written); without, the
    whole prefix [0, end) is recomputed: the reference the cache must match."""
    if cache is None:
        mask = block_causal_mask(torch.arange(end, device=ids.device), end, block_size)
        return model(ids[:, :end], attention_mask=mask).logits[:, start:]
    mask = block_causal_mask(torch.arange(start, end, device=ids.device), end, block_size)
    return model(ids[:, start:end], attention_mask=mask, cache=cache, cache_start=start).logits


class StaticDecodingForward:
    """A decoding step of fixed shape: `width` query tokens a row, at positions given per row, against all `total`
    cached positions (the block-causal mask hides keys not written yet), writing their keys/values into the cache,
    then `head(logits, ids, step_arg)` (the decoder's sampling and commit rule; `step_arg` is a [B] long tensor it
    needs per step and row).

    On CUDA (unless `cuda_graph=False`) the first call captures the step in a CUDA graph (the head too when
    `head_in_graph`: not for seeded random sampling) and later calls replay it, so a step is one launch. The graph
    reads its inputs from and writes its outputs to fixed buffers: what a call returns is valid until the next call.
    `prefill` runs a forward of any width eagerly, writing the cache; it projects to logits only the positions
    asked for (a batch of long prompts' logits would be batch x length x vocabulary)."""

    def __init__(self, model, batch: int, total: int, block_size: int, width: int, head: Callable,
                 head_in_graph: bool = True, cuda_graph: bool = True):
        device = next(model.parameters()).device
        self.model, self.block_size, self.head, self.head_in_graph = model, block_size, head, head_in_graph
        self.total = total
        self.cache = KVCache(model.config, batch, total, device, next(model.parameters()).dtype)
        self.ids = torch.zeros(batch, width, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, width, dtype=torch.long, device=device)
        self.step_arg = torch.zeros(batch, dtype=torch.long, device=device)
        self.use_graph = cuda_graph and device.type == "cuda"
        self.graph, self.outputs = None, None

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        mask = block_causal_mask(positions, self.total, self.block_size)
        return self.model(ids, attention_mask=mask, cache=self.cache, cache_start=positions,
                          position_ids=positions.expand(ids.shape[0], -1)).logits

    def prefill(self, ids: torch.Tensor, start: int, logits_at: torch.Tensor | None = None) -> torch.Tensor | None:
        """Writes the keys/values of `ids` at positions start...; returns the logits at the window indices
        `logits_at` ([B, k], a row's own), or None."""
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        hidden = self.model.model(ids, positions.expand(ids.shape[0], -1),
                                  block_causal_mask(positions, self.total, self.block_size), self.cache,
                                  positions).last_hidden_state
        if logits_at is None:
            return None
        picked = hidden.gather(1, logits_at[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.model.lm_head(picked)

    def _step(self, ids, positions, step_arg):
        logits = self.forward(ids, positions)
        return self.head(logits, ids, step_arg) if self.head_in_graph else logits

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, step_arg: torch.Tensor):
        if not self.use_graph:
            return self.head(self.forward(ids, positions), ids, step_arg)
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.step_arg.copy_(step_arg)
        if self.graph is None:
            # Warm up on a side stream (as CUDA graph capture requires), then capture. The warm-up runs compute
            # exactly what the replay below computes (same inputs, same cache), so they change nothing.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step(self.ids, self.positions, self.step_arg)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = self._step(self.ids, self.positions, self.step_arg)
        self.graph.replay()
        return self.outputs if self.head_in_graph else self.head(self.outputs, ids, step_arg)


def _static_forward(model, batch: int, total: int, block_size: int, width: int, head: Callable, head_key: tuple,
                    head_in_graph: bool, cuda_graph: bool, graphs: dict | None) -> StaticDecodingForward:
    """A `StaticDecodingForward`, reused from `graphs` (a dict the caller keeps across calls) when one with the same
    shapes and head (`head_key` describes it) exists: every key a step reads is written earlier in the same call,
    so a reused cache needs no reset."""
    if graphs is None:
        return StaticDecodingForward(model, batch, total, block_size, width, head, head_in_graph, cuda_graph)
    key = (id(model), batch, total, block_size, width, head_key, head_in_graph, cuda_graph)
    if key not in graphs:
        graphs[key] = StaticDecodingForward(model, batch, total, block_size, width, head, head_in_graph, cuda_graph)
    graphs[key].head = head  # this call's sampler (a captured head is fixed by head_key)
    return graphs[key]


def sample_tokens(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  generator: torch.Generator | None = None):
    """Draw a token per position; returns (tokens, confidence = its probability under the filtered distribution).
    temperature 0 is greedy."""
    logits = logits.float()
    if temperature <= 0:
        probs = torch.softmax(logits, dim=-1)
        confidence, tokens = probs.max(dim=-1)
        return tokens, confidence
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the most likely one always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    tokens = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(probs.shape[:-1])
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)


def transfer_schedule(block_size: int, steps: int) -> list[int]:
    """Tokens committed at each of `steps` static steps: an even split, the remainder on the first steps (SDAR)."""
    base, extra = divmod(block_size, steps)
    return [base + (1 if step < extra else 0) for step in range(steps)]


def _eos_ids(eos_token_id) -> list[int]:
    if eos_token_id is None:
        return []
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)


def _finalize(generated: torch.Tensor, unmask_steps: torch.Tensor, eos_ids: list[int], pad_token_id: int,
              max_new_tokens: int, num_forwards: int, block_tokens=None, block_steps=None) -> GenerationResult:
    generated, unmask_steps = generated[:, :max_new_tokens].cpu(), unmask_steps[:, :max_new_tokens].cpu()
    lengths = torch.full((generated.shape[0],), max_new_tokens, dtype=torch.long)
    if eos_ids:
        is_eos = torch.isin(generated, torch.tensor(eos_ids))
        has_eos = is_eos.any(dim=1)
        first = is_eos.float().argmax(dim=1)
        lengths = torch.where(has_eos, first + 1, lengths)
        after = torch.arange(max_new_tokens)[None, :] >= lengths[:, None]
        generated = generated.masked_fill(after, pad_token_id)
        unmask_steps = unmask_steps.masked_fill(after, -1)
    return GenerationResult(generated, lengths, unmask_steps, num_forwards,
                            None if block_tokens is None else block_tokens.cpu(),
                            None if block_steps is None else block_steps.cpu())


@torch.no_grad()
def block_diffusion_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    block_size: int | None = None,
    steps: int | None = None,
    strategy: str = "dynamic",
    confidence_threshold: float = 0.9,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    mask_token_id: int | None = None,
    use_cache: bool = True,
    cuda_graph: bool = True,
    graphs: dict | None = None,
    generator: torch.Generator | None = None,
    progress: Callable[[int], None] | None = None,
) -> GenerationResult:
    """Semi-autoregressive block decoding (SDAR): blocks of `block_size` start all-MASK (but for the prompt tokens
    the first one holds) and are denoised in at most `steps` forwards each. `static` commits the scheduled number of
    most confident masked tokens a step; `dynamic` also commits every one above `confidence_threshold` (so a
    block may finish in fewer steps). A row stops at its EOS (checked when its block is finished) or when its answer
    reaches max_new_tokens; the call returns when every row has stopped. `progress(n)` is called after each forward
    with the number of answer tokens it committed. On CUDA the steps replay a CUDA graph (`cuda_graph=False`:
    eager); pass the same `graphs` dict to later calls of the same shapes to reuse it. Logits are aligned by the
    model's `prediction_shift`."""
    config = model.config
    block_size = block_size or config.block_size
    steps = min(steps or block_size, block_size)
    mask_token_id = config.mask_token_id if mask_token_id is None else mask_token_id
    shift = prediction_shift(config)
    if strategy not in ("static", "dynamic"):
        raise ValueError(f"strategy must be 'static' or 'dynamic', got {strategy!r}")
    if pad_token_id == mask_token_id:
        raise ValueError("pad_token_id must differ from the mask token (a finished row must never look masked)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = next(model.parameters()).device
    eos_ids = _eos_ids(eos_token_id)
    prompt_lengths = [len(p) for p in prompts]
    first_blocks = [first_decoded_block(length, block_size) for length in prompt_lengths]
    last_blocks = [last_decoded_block(length, max_new_tokens, block_size) for length in prompt_lengths]
    # Two spare blocks past every row's last: the "previous" half of a row at block 0, and both halves of a
    # finished row, point there; being the last blocks, no real query sees them.
    park = max(decoded_span_end(length, max_new_tokens, block_size) for length in prompt_lengths)
    total = park + 2 * block_size
    ids, prompt_length = _prompt_buffer(prompts, total, mask_token_id, device)
    ids[:, park:] = pad_token_id
    batch = len(prompts)
    unmask_steps = torch.full((batch, total), -1, dtype=torch.long, device=device)
    current = torch.tensor(first_blocks, dtype=torch.long, device=device)
    last_block = torch.tensor(last_blocks, dtype=torch.long, device=device)
    step_in_block = torch.zeros(batch, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    schedule = torch.tensor(transfer_schedule(block_size, steps), dtype=torch.long, device=device)
    eos_tensor = torch.tensor(eos_ids, dtype=torch.long, device=device)
    offsets = torch.arange(block_size, device=device)

    def denoise(logits, window, commit_count):
        """One denoising step of every row's current block (the window's last block_size tokens), from the logits
        that predict them: (new blocks, committed)."""
        block = window[:, block_size:]
        logits = logits[:, block_size - shift:2 * block_size - shift]
        logits[..., mask_token_id] = float("-inf")  # the model must never "predict" the noise token
        tokens, confidence = sample_tokens(logits, temperature, top_k, top_p, generator)
        still_masked = block == mask_token_id
        confidence = confidence.masked_fill(~still_masked, float("-inf"))
        # The commit_count most confident, by rank rather than topk: counts differ by row (one graph, all steps).
        rank = torch.argsort(torch.argsort(confidence, dim=-1, descending=True, stable=True), dim=-1, stable=True)
        commit = rank < commit_count[:, None]
        if strategy == "dynamic":
            commit |= confidence > confidence_threshold
        commit &= still_masked  # given prompt tokens and parked rows are never overwritten
        return torch.where(commit, tokens, block), commit

    step_forward = None
    if use_cache:  # each step: [previous block, current block] a row, always 2 x block_size queries
        step_forward = _static_forward(model, batch, total, block_size, 2 * block_size, denoise,
                                       ("block", strategy, confidence_threshold, mask_token_id, shift),
                                       temperature <= 0, cuda_graph, graphs)
    num_forwards = 0
    # Whole prompt blocks but the last are prefilled; the last is each row's first "previous" block. Rows with
    # shorter prompts get keys of later columns written too: each is rewritten before any query of theirs sees it.
    prefill_end = max(0, max(whole_prompt_blocks(length, block_size) for length in prompt_lengths) - 1) * block_size
    if use_cache and prefill_end > 0:
        step_forward.prefill(ids[:, :prefill_end], 0)
        num_forwards += 1
    max_forwards = num_forwards + steps * (max(b - a for a, b in zip(first_blocks, last_blocks)) + 1)
    while True:
        if num_forwards >= max_forwards:
            raise RuntimeError("block decoding did not finish within its forward budget")
        active = ~finished
        previous_start = torch.where(active & (current > 0), (current - 1) * block_size, park)
        current_start = torch.where(active, current * block_size, park + block_size)
        positions = torch.cat((previous_start[:, None] + offsets, current_start[:, None] + offsets), dim=1)
        window = ids.gather(1, positions)
        commit_count = schedule[step_in_block.clamp(max=steps - 1)]
        if use_cache:
            new_block, commit = step_forward(window, positions, commit_count)
        else:  # the reference: the whole sequence recomputed every step
            logits = model_logits(model, ids, 0, total, block_size, None)
            logits = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
            new_block, commit = denoise(logits, window, commit_count)
        block_positions = positions[:, block_size:]
        ids.scatter_(1, block_positions, new_block)  # scatter, not boolean indexing, which waits for the GPU
        unmask_steps.scatter_(1, block_positions,
                              torch.where(commit, num_forwards, unmask_steps.gather(1, block_positions)))
        num_forwards += 1
        step_in_block += active.long()
        block_done = active & ~(new_block == mask_token_id).any(dim=1)
        in_answer = (block_positions >= prompt_length[:, None]) & (block_positions < prompt_length[:, None]
                                                                    + max_new_tokens)
        stop = block_done & (current >= last_block)
        if eos_ids:
            stop |= block_done & (torch.isin(new_block, eos_tensor) & in_answer).any(dim=1)
        finished |= stop
        current += (block_done & ~finished).long()
        step_in_block.masked_fill_(block_done, 0)
        if progress is not None:
            all_done, committed = torch.stack((finished.all().long(), (commit & in_answer).sum())).tolist()
            progress(committed)
        else:
            all_done = bool(finished.all())  # the one sync a step
        if all_done:
            break

    answer = prompt_length[:, None] + torch.arange(max_new_tokens, device=device)
    generated = ids.gather(1, answer)
    generated = generated.masked_fill(generated == mask_token_id, pad_token_id)
    span_end = (last_block + 1) * block_size
    width = int((span_end - prompt_length).max())
    span = prompt_length[:, None] + torch.arange(width, device=device)
    outside = span >= span_end[:, None]
    block_tokens = ids.gather(1, span.clamp(max=total - 1))
    block_tokens = block_tokens.masked_fill(outside | (block_tokens == mask_token_id), pad_token_id)
    block_steps = unmask_steps.gather(1, span.clamp(max=total - 1)).masked_fill(outside, -1)
    return _finalize(generated, unmask_steps.gather(1, answer), eos_ids, pad_token_id, max_new_tokens, num_forwards,
                     block_tokens, block_steps)


@torch.no_grad()
def autoregressive_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    cuda_graph: bool = True,
    graphs: dict | None = None,
    generator: torch.Generator | None = None,
    progress: Callable[[int], None] | None = None,
) -> GenerationResult:
    """KV-cached decoding of one token a forward. A shifted model (`prediction_shift` 1, like the autoregressive
    model it was converted from) reads the next token off the last token's logits: one query a step. A model that
    predicts in place (SDAR) has no next-token head: it decodes blocks of one token, one step each (the block
    decoder at block_size 1: the token's MASK beside the previous token). On CUDA the steps replay a CUDA graph, as in
    `block_diffusion_generate`."""
    common = dict(temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
                  pad_token_id=pad_token_id, cuda_graph=cuda_graph, graphs=graphs, generator=generator,
                  progress=progress)
    if prediction_shift(model.config) == 0:
        return block_diffusion_generate(model, prompts, max_new_tokens, block_size=1, steps=1, strategy="static",
                                        **common)
    device = next(model.parameters()).device
    eos_ids = _eos_ids(eos_token_id)
    longest = max(len(p) for p in prompts)
    total = longest + max_new_tokens
    ids, prompt_length = _prompt_buffer(prompts, total, pad_token_id, device)
    batch = len(prompts)
    unmask_steps = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_tensor = torch.tensor(eos_ids, dtype=torch.long, device=device)

    def next_token(logits, window, unused_step_arg):
        return sample_tokens(logits[:, -1], temperature, top_k, top_p, generator)[0]

    step_forward = _static_forward(model, batch, total, 1, 1, next_token, ("autoregressive",), temperature <= 0,
                                   cuda_graph, graphs)
    no_arg = torch.zeros(batch, dtype=torch.long, device=device)
    # Each row's prompt is prefilled from column 0; columns past a shorter prompt are rewritten before it sees them.
    logits = step_forward.prefill(ids[:, :longest], 0, logits_at=(prompt_length - 1)[:, None])
    tokens = next_token(logits, None, no_arg)
    for index in range(max_new_tokens):
        position = (prompt_length + index)[:, None]
        if index > 0:  # the token written last step, at its row's own position
            tokens = step_forward(ids.gather(1, position - 1), position - 1, no_arg)
        ids.scatter_(1, position, torch.where(finished, pad_token_id, tokens)[:, None])
        unmask_steps[:, index] = index
        if progress is not None:
            progress(1)
        if eos_ids:
            finished |= torch.isin(tokens, eos_tensor)
            # Checking costs a device sync, so only every 16 tokens (the output is trimmed at EOS anyway).
            if index % 16 == 15 and bool(finished.all()):
                break
    answer = prompt_length[:, None] + torch.arange(max_new_tokens, device=device)
    return _finalize(ids.gather(1, answer.clamp(max=total - 1)), unmask_steps, eos_ids, pad_token_id,
                     max_new_tokens, index + 1)
