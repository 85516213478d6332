"""Decoding for the block-diffusion LM: semi-autoregressive block decoding with a KV cache (SDAR's sampler, with
static top-k or dynamic confidence-threshold unmasking) and, for comparison, plain KV-cached autoregressive decoding
of the same model. Both take a batch of prompts of different lengths (left-padded, padding hidden by the mask).

One decoding forward covers [previous block, current block]: the previous block, now final, rewrites its keys/values
in the cache while the current block is denoised against it. This folds SDAR's extra "commit" forward per block
into the next block's first denoising step, so a block costs exactly its denoising steps.

Every decoding step of either decoder has fixed shapes (`StaticDecodingForward`: a few query tokens against the
whole preallocated cache), so on CUDA it is captured once as a CUDA graph and replayed; an eager forward of a small
model at batch 1 is launch-bound. On the CPU the same code runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from training.modeling_sdar import KVCache


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # [B, max_new_tokens] generated ids; after a row's EOS, pad_token_id
    lengths: torch.Tensor  # [B] tokens up to and including the first EOS (max_new_tokens if none)
    unmask_steps: torch.Tensor  # [B, max_new_tokens] index of the forward whose prediction committed each token
    num_forwards: int  # model forward passes, prefill included
    # The decoded blocks as the sampler left them, before EOS trimming: [B, blocks x block_size] ids (tokens after an
    # EOS inside its block kept; blocks never decoded = pad) and their unmask steps (-1 = never committed). The
    # states a block passed through are exactly these, so RL can replay the trace (training/rl.py).
    block_tokens: torch.Tensor | None = None
    block_unmask_steps: torch.Tensor | None = None


def _sequence_buffer(prompts: Sequence[Sequence[int]], prompt_length: int, total: int, fill_id: int,
                     pad_token_id: int, device):
    """ids [B, total]: prompts right-aligned at `prompt_length` (left padding), then `fill_id` to the end; and
    key_valid, False on the padding so no query attends to it."""
    ids = torch.full((len(prompts), total), fill_id, dtype=torch.long)
    key_valid = torch.ones((len(prompts), total), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {row} is empty")
        pad = prompt_length - len(prompt)
        ids[row, :pad] = pad_token_id
        key_valid[row, :pad] = False
        ids[row, pad:prompt_length] = torch.as_tensor(list(prompt), dtype=torch.long)
    return ids.to(device), key_valid.to(device)


def block_causal_mask(key_valid: torch.Tensor, start: int, end: int, block_size: int) -> torch.Tensor:
    """Bool [B, 1, end-start, end]: query q sees key k if k is real and in the same or an earlier block.
    block_size=1 is the causal mask. Column index is the position (RoPE is relative, so left padding is harmless)."""
    query = torch.arange(start, end, device=key_valid.device)[:, None]
    key = torch.arange(end, device=key_valid.device)[None, :]
    visible = (key // block_size <= query // block_size) & key_valid[:, None, None, :end]
    return visible | (key == query)  # a padding query sees itself rather than nothing (no NaN rows)


def model_logits(model, ids: torch.Tensor, key_valid: torch.Tensor, start: int, end: int, block_size: int,
                 cache: KVCache | None) -> torch.Tensor:
    """Logits [B, end-start, V] at positions [start, end). With a cache, only those positions are run (their keys
    and values are written); without, the whole prefix [0, end) is recomputed: the reference the cache must match."""
    if cache is None:
        mask = block_causal_mask(key_valid, 0, end, block_size)
        return model(ids[:, :end], attention_mask=mask).logits[:, start:]
    mask = block_causal_mask(key_valid, start, end, block_size)
    return model(ids[:, start:end], attention_mask=mask, cache=cache, cache_start=start).logits


class StaticDecodingForward:
    """A decoding step of fixed shape: `width` query tokens at given positions against all `total` cached positions
    (the block-causal mask hides keys not written yet), writing their keys/values into the cache, then
    `head(logits, ids, step_arg)` (the decoder's sampling and commit rule; `step_arg` is an int it needs per step).

    On CUDA (unless `cuda_graph=False`) the first call captures the step in a CUDA graph (the head too when
    `head_in_graph`: not for seeded random sampling) and later calls replay it, so a step is one launch. The graph
    reads its inputs from and writes its outputs to fixed buffers: what a call returns is valid until the next call.
    `prefill` runs a forward of any width eagerly and returns its logits."""

    def __init__(self, model, key_valid: torch.Tensor, block_size: int, width: int, head: Callable,
                 head_in_graph: bool = True, cuda_graph: bool = True):
        batch, total = key_valid.shape
        device = key_valid.device
        self.model, self.block_size, self.head, self.head_in_graph = model, block_size, head, head_in_graph
        self.cache = KVCache(model.config, batch, total, device, next(model.parameters()).dtype)
        self.key_valid = key_valid.clone()
        self.ids = torch.zeros(batch, width, dtype=torch.long, device=device)
        self.positions = torch.zeros(width, dtype=torch.long, device=device)
        self.step_arg = torch.zeros((), dtype=torch.long, device=device)
        self.use_graph = cuda_graph and key_valid.is_cuda
        self.graph, self.outputs = None, None

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        key = torch.arange(self.key_valid.shape[1], device=ids.device)
        visible = (key // self.block_size <= positions[:, None] // self.block_size) & self.key_valid[:, None, None, :]
        mask = visible | (key == positions[:, None])  # a padding query sees itself rather than nothing
        return self.model(ids, attention_mask=mask, cache=self.cache, cache_start=positions).logits

    def prefill(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.forward(ids, torch.arange(start, start + ids.shape[1], device=ids.device))

    def _step(self, ids, positions, step_arg):
        logits = self.forward(ids, positions)
        return self.head(logits, ids, step_arg) if self.head_in_graph else logits

    def __call__(self, ids: torch.Tensor, start: int, step_arg: int = 0):
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        if not self.use_graph:
            return self.head(self.forward(ids, positions), ids, step_arg)
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.step_arg.fill_(step_arg)
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


def _static_forward(model, key_valid, block_size: int, width: int, head: Callable, head_key: tuple,
                    head_in_graph: bool, cuda_graph: bool, graphs: dict | None) -> StaticDecodingForward:
    """A `StaticDecodingForward`, reused from `graphs` (a dict the caller keeps across calls) when one with the same
    shapes and head (`head_key` describes it) exists: every key a step reads is written earlier in the same call,
    so a reused cache needs no reset."""
    if graphs is None:
        return StaticDecodingForward(model, key_valid, block_size, width, head, head_in_graph, cuda_graph)
    key = (id(model), tuple(key_valid.shape), block_size, width, head_key, head_in_graph, cuda_graph)
    if key not in graphs:
        graphs[key] = StaticDecodingForward(model, key_valid, block_size, width, head, head_in_graph, cuda_graph)
    graphs[key].key_valid.copy_(key_valid)
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
              max_new_tokens: int, num_forwards: int, keep_blocks: bool = False) -> GenerationResult:
    raw = (generated.cpu(), unmask_steps.cpu()) if keep_blocks else (None, None)
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
    return GenerationResult(generated, lengths, unmask_steps, num_forwards, *raw)


@torch.no_grad()
def block_diffusion_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    block_size: int | None = None,
    steps: int | None = None,
    strategy: str = "dynamic",
    threshold: float = 0.9,
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
    """Semi-autoregressive block decoding (SDAR): blocks of `block_size` start all-MASK and are denoised in at most
    `steps` forwards each. `static` commits the scheduled number of most confident tokens a step; `dynamic` also
    commits every token above `threshold` (so a block may finish in fewer steps). Stops at EOS or max_new_tokens.
    `progress(n)` is called with the number of tokens each finished block adds. On CUDA the steps replay a CUDA
    graph (`cuda_graph=False`: eager); pass the same `graphs` dict to later calls of the same shapes to reuse it."""
    config = model.config
    block_size = block_size or config.block_size
    steps = min(steps or block_size, block_size)
    mask_token_id = config.mask_token_id if mask_token_id is None else mask_token_id
    if strategy not in ("static", "dynamic"):
        raise ValueError(f"strategy must be 'static' or 'dynamic', got {strategy!r}")
    device = next(model.parameters()).device
    eos_ids = _eos_ids(eos_token_id)
    schedule = transfer_schedule(block_size, steps)

    # Prompts end at a block boundary (extra left padding), so the prompt is prefilled in whole blocks.
    prompt_length = -(-max(len(p) for p in prompts) // block_size) * block_size
    num_blocks = -(-max_new_tokens // block_size)
    total = prompt_length + num_blocks * block_size
    ids, key_valid = _sequence_buffer(prompts, prompt_length, total, mask_token_id, pad_token_id, device)
    batch = len(prompts)
    unmask_steps = torch.full((batch, total), -1, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_tensor = torch.tensor(eos_ids, dtype=torch.long, device=device)

    def denoise(logits, window, commit_count):
        """One denoising step of the block (the window's last block_size tokens): (new block, committed)."""
        block, logits = window[:, -block_size:], logits[:, -block_size:]
        logits[..., mask_token_id] = float("-inf")  # the model must never "predict" the noise token
        tokens, confidence = sample_tokens(logits, temperature, top_k, top_p, generator)
        still_masked = block == mask_token_id
        confidence = confidence.masked_fill(~still_masked, float("-inf"))
        # The commit_count most confident, by rank rather than topk: the count may be a tensor (one graph, all steps).
        rank = torch.argsort(torch.argsort(confidence, dim=-1, descending=True, stable=True), dim=-1, stable=True)
        commit = rank < commit_count
        if strategy == "dynamic":
            commit |= confidence > threshold
        commit &= still_masked
        return torch.where(commit, tokens, block), commit

    step_forward = None
    if use_cache:  # each step: [previous block, current block], always 2 x block_size queries
        step_forward = _static_forward(model, key_valid, block_size, 2 * block_size, denoise,
                                       ("block", strategy, threshold, mask_token_id), temperature <= 0, cuda_graph,
                                       graphs)

    num_forwards = 0
    previous_start = prompt_length - block_size
    if use_cache and previous_start > 0:
        step_forward.prefill(ids[:, :previous_start], 0)  # prefill all but the last prompt block
        num_forwards += 1
    for block_index in range(num_blocks):
        start = prompt_length + block_index * block_size
        end = start + block_size
        block = ids[:, start:end]  # a view: commits land in `ids`
        block.masked_fill_(finished[:, None], pad_token_id)  # rows past their EOS ride along, decoding nothing
        for step in range(steps):
            if use_cache:
                new_block, commit = step_forward(ids[:, previous_start:end], previous_start, schedule[step])
            else:
                logits = model_logits(model, ids, key_valid, previous_start, end, block_size, None)
                new_block, commit = denoise(logits, ids[:, previous_start:end], schedule[step])
            block.copy_(new_block)  # torch.where/masked_fill, not boolean indexing, which waits for the GPU
            unmask_steps[:, start:end].masked_fill_(commit, num_forwards)
            num_forwards += 1
            if step + 1 < steps and not bool((block == mask_token_id).any()):  # the one sync a step
                break
        previous_start = start
        if progress is not None:
            progress(block_size)
        if eos_ids:
            finished |= torch.isin(block, eos_tensor).any(dim=1)
            if bool(finished.all()):
                break
    generated = ids[:, prompt_length:].masked_fill(ids[:, prompt_length:] == mask_token_id, pad_token_id)
    return _finalize(generated, unmask_steps[:, prompt_length:], eos_ids, pad_token_id, max_new_tokens, num_forwards,
                     keep_blocks=True)


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
    """KV-cached next-token decoding (position i's logits predict token i + 1): one token a forward. On CUDA the
    steps after the prompt replay a CUDA graph, as in `block_diffusion_generate`."""
    device = next(model.parameters()).device
    eos_ids = _eos_ids(eos_token_id)
    prompt_length = max(len(p) for p in prompts)
    total = prompt_length + max_new_tokens
    ids, key_valid = _sequence_buffer(prompts, prompt_length, total, pad_token_id, pad_token_id, device)
    batch = len(prompts)
    unmask_steps = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos_tensor = torch.tensor(eos_ids, dtype=torch.long, device=device)

    def next_token(logits, window, unused_step_arg):
        return sample_tokens(logits[:, -1], temperature, top_k, top_p, generator)[0]

    step_forward = _static_forward(model, key_valid, 1, 1, next_token, ("autoregressive",), temperature <= 0,
                                   cuda_graph, graphs)
    for index in range(max_new_tokens):
        end = prompt_length + index
        if index == 0:
            tokens = next_token(step_forward.prefill(ids[:, :end], 0), None, 0)
        else:  # the token written last step
            tokens = step_forward(ids[:, end - 1:end], end - 1)
        ids[:, end] = torch.where(finished, pad_token_id, tokens)
        unmask_steps[:, index] = index
        if progress is not None:
            progress(1)
        if eos_ids:
            finished |= torch.isin(tokens, eos_tensor)
            # Checking costs a device sync, so only every 16 tokens (the output is trimmed at EOS anyway).
            if index % 16 == 15 and bool(finished.all()):
                break
    return _finalize(ids[:, prompt_length:], unmask_steps, eos_ids, pad_token_id, max_new_tokens, index + 1)
