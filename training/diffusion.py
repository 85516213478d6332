"""The block-diffusion training objective (BD3-LM / SDAR): each sample is laid out as a noisy copy x_t followed by
the clean copy x_0 (same position ids), attention follows the block-diffusion mask, and the loss is the 1/t-weighted
cross-entropy at masked answer positions, with no logit shift. Samples are packed into fixed-length rows.

Exact savings over the naive layout, none of which change the loss: a noisy block with no masked token (all prompt,
or no token drawn) is left out, since nothing attends to it and it scores nothing; the LM head is applied only to
the scored positions. The same `mask_mod` builds the dense CPU mask and the flex `BlockMask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


@dataclass
class TokenizedSample:
    """One training example: token ids and which of them are the answer (scored; prompt tokens are never masked)."""

    input_ids: torch.Tensor  # [L] long
    answer_mask: torch.Tensor  # [L] bool

    def __post_init__(self) -> None:
        if self.input_ids.shape != self.answer_mask.shape or self.input_ids.dim() != 1:
            raise ValueError(f"input_ids {tuple(self.input_ids.shape)} and answer_mask "
                             f"{tuple(self.answer_mask.shape)} must be equal 1-D shapes")


@dataclass
class BlockDiffusionBatch:
    """Packed rows [R, C]. Per position: token fed in, position within its sample, sample (segment) id (-1 = padding),
    block id, whether it belongs to a noisy copy, the target (or IGNORE_INDEX) and the 1/t loss weight."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    block_ids: torch.Tensor
    is_noisy: torch.Tensor
    targets: torch.Tensor
    loss_weights: torch.Tensor
    scored_index: torch.Tensor  # flat indices (into R*C) of the scored positions, precomputed to avoid a sync
    num_answer_tokens: int  # loss normaliser: all answer tokens of the packed samples, masked or not
    num_clean_tokens: int  # tokens of the samples themselves (throughput is counted in these)
    num_samples: int

    def to(self, device) -> "BlockDiffusionBatch":
        moved = {name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                 for name, value in self.__dict__.items()}
        return BlockDiffusionBatch(**moved)


@dataclass
class NoisySegment:
    """A noised sample as it will sit in a row: its noisy blocks (positions kept) followed by its clean copy."""

    sample: TokenizedSample
    t: float
    masked: torch.Tensor  # [L] bool, answer tokens replaced by the mask token
    noisy_positions: torch.Tensor  # positions whose noisy copy is kept

    @property
    def length(self) -> int:
        return self.noisy_positions.numel() + self.sample.input_ids.numel()


def noise_sample(sample: TokenizedSample, block_size: int, generator: torch.Generator,
                 drop_unscored_blocks: bool = True, eps: float = 1e-3) -> NoisySegment:
    """SDAR's schedule: one t ~ U(eps, 1) for the sample, then each answer token masked with probability t.

    With `drop_unscored_blocks=False` the segment is the full `[x_t ; x_0]` of BD3-LM/SDAR (2L tokens)."""
    t = eps + (1.0 - eps) * torch.rand((), generator=generator).item()
    masked = (torch.rand(sample.input_ids.shape, generator=generator) < t) & sample.answer_mask
    length = sample.input_ids.numel()
    if not drop_unscored_blocks:
        return NoisySegment(sample, t, masked, torch.arange(length))
    blocks = torch.arange(length) // block_size
    scored_blocks = torch.zeros(int(blocks[-1]) + 1, dtype=torch.bool).index_fill_(0, blocks[masked], True)
    return NoisySegment(sample, t, masked, torch.nonzero(scored_blocks[blocks]).flatten())


def pack_segments(segments: Sequence[NoisySegment], mask_token_id: int, block_size: int, row_length: int,
                  max_rows: int | None = None, pad_token_id: int = 0):
    """Pack segments into rows of `row_length` tokens, first-fit by decreasing length (little padding, since
    dropping blocks makes segment lengths vary). With `max_rows`, segments that do not fit are returned, still
    noised, for the next batch (re-noising them would bias t towards the short segments that fit).

    Returns (batch, leftover segments)."""
    rows: list[list[NoisySegment]] = []
    free: list[int] = []
    leftover: list[NoisySegment] = []
    for segment in sorted(segments, key=lambda s: s.length, reverse=True):
        if segment.length > row_length:
            raise ValueError(f"a segment needs {segment.length} tokens, more than row_length={row_length}; "
                             f"truncate samples to at most {row_length // 2} tokens")
        row = next((i for i, space in enumerate(free) if space >= segment.length), None)
        if row is None and (max_rows is None or len(rows) < max_rows):
            rows.append([])
            free.append(row_length)
            row = len(rows) - 1
        if row is None:
            leftover.append(segment)
            continue
        rows[row].append(segment)
        free[row] -= segment.length
    if max_rows is not None:
        rows.extend([] for _ in range(max_rows - len(rows)))

    shape = (len(rows), row_length)
    batch = dict(
        input_ids=torch.full(shape, pad_token_id, dtype=torch.long),
        position_ids=torch.zeros(shape, dtype=torch.long),
        segment_ids=torch.full(shape, -1, dtype=torch.long),
        block_ids=torch.zeros(shape, dtype=torch.long),
        is_noisy=torch.zeros(shape, dtype=torch.bool),
        targets=torch.full(shape, IGNORE_INDEX, dtype=torch.long),
        loss_weights=torch.zeros(shape, dtype=torch.float32),
    )
    segment_id = 0
    for row_index, row in enumerate(rows):
        cursor = 0
        for segment in row:
            ids, masked = segment.sample.input_ids, segment.masked
            noisy_ids = torch.where(masked, torch.full_like(ids, mask_token_id), ids)
            for positions, tokens, noisy in ((segment.noisy_positions, noisy_ids[segment.noisy_positions], True),
                                             (torch.arange(ids.numel()), ids, False)):
                span = slice(cursor, cursor + positions.numel())
                batch["input_ids"][row_index, span] = tokens
                batch["position_ids"][row_index, span] = positions
                batch["segment_ids"][row_index, span] = segment_id
                batch["block_ids"][row_index, span] = positions // block_size
                batch["is_noisy"][row_index, span] = noisy
                if noisy:
                    scored = masked[positions]
                    batch["targets"][row_index, span] = torch.where(scored, ids[positions], IGNORE_INDEX)
                    batch["loss_weights"][row_index, span] = scored.float() / segment.t
                cursor += positions.numel()
            segment_id += 1
    packed = [segment.sample for row in rows for segment in row]
    scored_index = torch.nonzero(batch["targets"].flatten() != IGNORE_INDEX).flatten()
    return BlockDiffusionBatch(
        **batch,
        scored_index=scored_index,
        num_answer_tokens=int(sum(int(s.answer_mask.sum()) for s in packed)),
        num_clean_tokens=int(sum(s.input_ids.numel() for s in packed)),
        num_samples=len(packed),
    ), leftover


def pack_block_diffusion(
    samples: Sequence[TokenizedSample],
    mask_token_id: int,
    block_size: int,
    row_length: int,
    generator: torch.Generator,
    drop_unscored_blocks: bool = True,
    eps: float = 1e-3,
    pad_token_id: int = 0,
) -> BlockDiffusionBatch:
    """Noise every sample and pack all of them (as many rows as needed). A segment longer than a row is an error."""
    segments = [noise_sample(s, block_size, generator, drop_unscored_blocks, eps) for s in samples]
    batch, _ = pack_segments(segments, mask_token_id, block_size, row_length, pad_token_id=pad_token_id)
    return batch


def block_diffusion_mask_mod(segment_ids: torch.Tensor, block_ids: torch.Tensor, is_noisy: torch.Tensor):
    """The block-diffusion mask as a flex `mask_mod(b, h, q, kv)`, for packed rows of any layout.

    Within one sample: a noisy token sees its own noisy block (bidirectionally) and strictly earlier clean blocks;
    a clean token sees clean blocks up to and including its own. Every token sees itself, so padding never yields an
    all-masked softmax row."""

    def mask_mod(b, h, q, kv):
        same_sample = (segment_ids[b, q] == segment_ids[b, kv]) & (segment_ids[b, q] >= 0)
        q_block, kv_block = block_ids[b, q], block_ids[b, kv]
        q_noisy, kv_noisy = is_noisy[b, q], is_noisy[b, kv]
        noisy_own_block = q_noisy & kv_noisy & (q_block == kv_block)
        noisy_sees_earlier_clean = q_noisy & ~kv_noisy & (kv_block < q_block)
        clean_block_causal = ~q_noisy & ~kv_noisy & (kv_block <= q_block)
        return (same_sample & (noisy_own_block | noisy_sees_earlier_clean | clean_block_causal)) | (q == kv)

    return mask_mod


def dense_mask_from_mask_mod(mask_mod, batch_size: int, length: int, device) -> torch.Tensor:
    """Evaluate a mask_mod on the full grid: the bool [B, 1, L, L] mask SDPA takes (CPU path, and the reference
    the flex path is tested against)."""
    b = torch.arange(batch_size, device=device)[:, None, None, None]
    positions = torch.arange(length, device=device)
    return mask_mod(b, torch.zeros((), dtype=torch.long, device=device), positions[None, None, :, None],
                    positions[None, None, None, :])


def build_attention_mask(batch: BlockDiffusionBatch, backend: str = "auto"):
    """The attention mask for a packed batch: `flex` (a BlockMask; the GPU default), or `dense` (bool tensor)."""
    if backend == "auto":
        backend = "flex" if batch.input_ids.is_cuda else "dense"
    mask_mod = block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy)
    rows, length = batch.input_ids.shape
    if backend == "dense":
        return dense_mask_from_mask_mod(mask_mod, rows, length, batch.input_ids.device)
    if backend == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        # Compiled mask building evaluates the mask tile by tile instead of materialising rows x L x L.
        return create_block_mask(mask_mod, B=rows, H=None, Q_LEN=length, KV_LEN=length,
                                 device=batch.input_ids.device, _compile=batch.input_ids.is_cuda)
    raise ValueError(f"backend must be 'auto', 'dense' or 'flex', got {backend!r}")


def scored_cross_entropy(model, hidden: torch.Tensor, flat_index: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy at the scored positions only: the LM head never sees the rest."""
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat_index)
    logits = model.lm_head(picked).float()
    return F.cross_entropy(logits, targets, reduction="none")


def block_diffusion_loss(model, batch: BlockDiffusionBatch, attention_mask=None) -> torch.Tensor:
    """Sum over masked answer tokens of CE / t, divided by the number of answer tokens (SDAR's normalisation)."""
    if attention_mask is None:
        attention_mask = build_attention_mask(batch)
    hidden = model.model(batch.input_ids, batch.position_ids, attention_mask).last_hidden_state
    targets = batch.targets.flatten().index_select(0, batch.scored_index)
    weights = batch.loss_weights.flatten().index_select(0, batch.scored_index)
    ce = scored_cross_entropy(model, hidden, batch.scored_index, targets)
    return (ce * weights).sum() / max(batch.num_answer_tokens, 1)


def autoregressive_loss(model, input_ids: torch.Tensor, answer_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain next-token cross-entropy (causal attention, shifted targets), over answer tokens when given."""
    hidden = model.model(input_ids).last_hidden_state[:, :-1]
    targets = input_ids[:, 1:]
    scored = torch.ones_like(targets, dtype=torch.bool) if answer_mask is None else answer_mask[:, 1:]
    flat_index = torch.nonzero(scored.flatten()).flatten()
    ce = scored_cross_entropy(model, hidden, flat_index, targets.flatten().index_select(0, flat_index))
    return ce.mean()
