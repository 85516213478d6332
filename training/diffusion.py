"""The block-diffusion training objective (BD3-LM / SDAR): each sample is laid out as a noisy copy x_t followed by
the clean copy x_0 (same position ids), attention follows the block-diffusion mask, and the loss is the 1/t-weighted
cross-entropy at masked answer positions. Blocks are SDAR's (training/blocks.py: counted from the sample's first
token, prompt included). Where a masked token is predicted follows the model's `prediction_shift`: at its own
position (SDAR), or from the hidden state one position earlier (a converted autoregressive model), which for a
block's first token is the last token of the clean copy's previous block, as in decoding. Samples are packed into
fixed-length rows.

Exact savings over the naive layout, none of which change the loss: a noisy block with no masked token (all prompt,
or no token drawn) is left out, since nothing attends to it and it scores nothing; the LM head is applied only to
the scored positions. `block_diffusion_mask_mod` states the mask from each position's sample, block and copy, and
builds the dense CPU mask; on the GPU the flex `BlockMask` (which 128x128 tiles are empty, partial or full) is
computed from the packed layout in O(row length) instead of evaluating the mask over the whole grid, and inside its
partial tiles flex evaluates the same mask in its cheaper interval form (`interval_mask_mod`: each query's two
visible key ranges, so nothing is loaded per key). Tile-aware packing (`tile=128`) tops each noisy
run up to a whole number of tiles with unscored noisy blocks (exact, like dropping them) and starts every segment on a
tile boundary, so the mask's block structure lines up with flex's tiles and fewer tiles are partial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.blocks import block_of, prediction_shift

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
    predictor_index: torch.Tensor  # flat indices of the hidden states predicting them (== scored_index unshifted)
    num_answer_tokens: int  # loss normaliser: all answer tokens of the packed samples, masked or not
    num_clean_tokens: int  # tokens of the samples themselves (throughput is counted in these)
    num_samples: int
    prediction_shift: int = 0  # the convention predictor_index follows: the model trained on it must share it

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
                 drop_unscored_blocks: bool = True, eps: float = 1e-3, shift: int = 0) -> NoisySegment:
    """SDAR's schedule: one t ~ U(eps, 1) for the sample, then each answer token masked with probability t (with
    `shift` 1 never the first token: nothing precedes it to predict it from).

    With `drop_unscored_blocks=False` the segment is the full `[x_t ; x_0]` of BD3-LM/SDAR (2L tokens)."""
    t = eps + (1.0 - eps) * torch.rand((), generator=generator).item()
    length = sample.input_ids.numel()
    maskable = sample.answer_mask & (torch.arange(length) >= shift)
    masked = (torch.rand(sample.input_ids.shape, generator=generator) < t) & maskable
    if not drop_unscored_blocks:
        return NoisySegment(sample, t, masked, torch.arange(length))
    blocks = block_of(torch.arange(length), block_size)
    scored_blocks = torch.zeros(int(blocks[-1]) + 1, dtype=torch.bool).index_fill_(0, blocks[masked], True)
    return NoisySegment(sample, t, masked, torch.nonzero(scored_blocks[blocks]).flatten())


def align_noisy_run(segment: NoisySegment, block_size: int, tile: int) -> NoisySegment:
    """Top the kept noisy blocks up to a whole number of `tile`-token tiles with unscored noisy blocks (exact: they
    score nothing and nothing attends to them). The gaps between kept blocks are filled first, in order, so each
    tile of the noisy run spans as few clean blocks as possible; then blocks after the last kept one, then before."""
    length = segment.sample.input_ids.numel()
    if tile % block_size or length % block_size:
        return segment  # blocks cannot tile exactly; leave the run as it is
    kept_blocks = torch.unique(block_of(segment.noisy_positions, block_size))
    missing = (-kept_blocks.numel() * block_size) % tile // block_size
    if missing == 0 or kept_blocks.numel() == 0:
        return segment
    dropped = torch.ones(length // block_size, dtype=torch.bool)
    dropped[kept_blocks] = False
    candidates = torch.nonzero(dropped).flatten()
    first = int(kept_blocks[0])
    order = torch.cat((candidates[candidates > first], candidates[candidates < first].flip(0)))
    blocks = torch.sort(torch.cat((kept_blocks, order[:missing]))).values
    positions = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()
    return NoisySegment(segment.sample, segment.t, segment.masked, positions)


def pack_segments(segments: Sequence[NoisySegment], mask_token_id: int, block_size: int, row_length: int,
                  max_rows: int | None = None, pad_token_id: int = 0, tile: int | None = None, shift: int = 0):
    """Pack segments into rows of `row_length` tokens, first-fit by decreasing length (little padding, since
    dropping blocks makes segment lengths vary). With `max_rows`, segments that do not fit are returned, still
    noised, for the next batch (re-noising them would bias t towards the short segments that fit).

    With `tile` (flex's 128), tile-aware packing: noisy runs are topped up to whole tiles (`align_noisy_run`) and
    every segment starts on a tile boundary (padding after a clean copy whose length is not a multiple of `tile`).

    Returns (batch, leftover segments)."""
    if tile:
        segments = [align_noisy_run(s, block_size, tile) for s in segments]

    def footprint(segment: NoisySegment) -> int:
        return -(-segment.length // tile) * tile if tile else segment.length

    rows: list[list[NoisySegment]] = []
    free: list[int] = []
    leftover: list[NoisySegment] = []
    for segment in sorted(segments, key=footprint, reverse=True):
        if segment.length > row_length:
            raise ValueError(f"a segment needs {segment.length} tokens, more than row_length={row_length}; "
                             f"truncate samples to at most {row_length // 2} tokens")
        row = next((i for i, space in enumerate(free) if space >= min(footprint(segment), row_length)), None)
        if row is None and (max_rows is None or len(rows) < max_rows):
            rows.append([])
            free.append(row_length)
            row = len(rows) - 1
        if row is None:
            leftover.append(segment)
            continue
        rows[row].append(segment)
        free[row] -= min(footprint(segment), row_length)
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
                batch["block_ids"][row_index, span] = block_of(positions, block_size)
                batch["is_noisy"][row_index, span] = noisy
                if noisy:
                    scored = masked[positions]
                    batch["targets"][row_index, span] = torch.where(scored, ids[positions], IGNORE_INDEX)
                    batch["loss_weights"][row_index, span] = scored.float() / segment.t
                cursor += positions.numel()
            segment_id += 1
            if tile:
                cursor = -(-cursor // tile) * tile
    packed = [segment.sample for row in rows for segment in row]
    scored_index = torch.nonzero(batch["targets"].flatten() != IGNORE_INDEX).flatten()
    return BlockDiffusionBatch(
        **batch,
        scored_index=scored_index,
        predictor_index=predictor_index(batch["position_ids"], batch["segment_ids"], batch["is_noisy"],
                                        scored_index, block_size, shift),
        num_answer_tokens=int(sum(int(s.answer_mask.sum()) for s in packed)),
        num_clean_tokens=int(sum(s.input_ids.numel() for s in packed)),
        num_samples=len(packed),
        prediction_shift=shift,
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
    tile: int | None = None,
    shift: int = 0,
) -> BlockDiffusionBatch:
    """Noise every sample and pack all of them (as many rows as needed). A segment longer than a row is an error."""
    segments = [noise_sample(s, block_size, generator, drop_unscored_blocks, eps, shift) for s in samples]
    batch, _ = pack_segments(segments, mask_token_id, block_size, row_length, pad_token_id=pad_token_id, tile=tile,
                             shift=shift)
    return batch


def predictor_index(position_ids: torch.Tensor, segment_ids: torch.Tensor, is_noisy: torch.Tensor,
                    scored_index: torch.Tensor, block_size: int, shift: int) -> torch.Tensor:
    """Flat indices of the hidden states that predict the scored (noisy) positions at `scored_index`. Unshifted:
    themselves. Shifted: position p - 1's state as the decoder has it, the noisy copy's token before it when p - 1
    is in p's block, else the clean copy's token at p - 1 (the end of the previous block, final by then). Needs
    the layouts diffusion.py and the RL replay build: each noisy block whole and in order, and each sample's clean
    copy contiguous from its position 0."""
    if shift == 0:
        return scored_index
    positions = position_ids.flatten()
    segments = segment_ids.flatten()
    flat = torch.arange(positions.numel(), device=positions.device)
    clean = (segments >= 0) & ~is_noisy.flatten()
    keys = torch.where(clean, segments, segments.max().clamp(min=0) + 1)  # everything else to a spare slot
    clean_first = torch.full((int(keys.max()) + 1,), positions.numel(), dtype=torch.long, device=flat.device)
    clean_first = clean_first.scatter_reduce(0, keys, flat, "amin")
    target = positions.index_select(0, scored_index)
    if bool((target < 1).any()):
        raise ValueError("a shifted model cannot predict a sequence's first token (nothing precedes it)")
    same_block = block_of(target - 1, block_size) == block_of(target, block_size)
    from_clean = clean_first.index_select(0, segments.index_select(0, scored_index)) + target - 1
    return torch.where(same_block, scored_index - 1, from_clean)


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


def visible_key_intervals(batch: BlockDiffusionBatch, block_size: int) -> torch.Tensor:
    """The keys each position may see, as two intervals of row indices, [R, C, 2 (intervals), 2 (start, end)]:
    a clean token sees its clean copy up to the end of its block; a noisy token its own noisy block and the clean
    copy before its block; padding only itself. Equals the mask_mod for any layout that `pack_segments` builds
    (each clean copy contiguous and in order, each noisy block contiguous). Adjacent intervals are merged."""
    segment, block, noisy = batch.segment_ids, batch.block_ids, batch.is_noisy
    rows, length = segment.shape
    index = torch.arange(length, device=segment.device).expand(rows, length)
    real, sample = segment >= 0, segment.clamp(min=0)

    def first_and_end(keys, selected, size):
        """Per key, the first row index of the selected positions and one past the last."""
        keys = torch.where(selected, keys, size).flatten()  # the rest go to a spare slot
        first = index.new_full((size + 1,), length).scatter_reduce(0, keys, index.flatten(), "amin")
        last = index.new_full((size + 1,), -1).scatter_reduce(0, keys, index.flatten(), "amax")
        return first, last + 1

    # Segment ids are unique over the batch, so they (and segment x block) index tables over all rows.
    clean_first, clean_end = first_and_end(sample, real & ~noisy, batch.num_samples)
    clean_first, clean_end = clean_first[sample], clean_end[sample]
    block_key = sample * (length // block_size + 1) + block
    noisy_first, noisy_end = first_and_end(block_key, real & noisy, batch.num_samples * (length // block_size + 1))
    noisy_first, noisy_end = noisy_first[block_key], noisy_end[block_key]

    clean_upto = torch.minimum(clean_first + (block + 1) * block_size, clean_end)
    first = torch.stack((torch.where(noisy, noisy_first, clean_first), torch.where(noisy, noisy_end, clean_upto)), -1)
    earlier_clean = clean_first + torch.where(noisy, block * block_size, 0)  # clean tokens: an empty interval
    second = torch.stack((clean_first, earlier_clean), -1)
    itself = torch.stack((index, index + 1), -1)
    first = torch.where(real[..., None], first, itself)
    second = torch.where(real[..., None], second, itself[..., :1])
    # The last noisy block of a segment sits right before its clean copy: one interval, so a tile can be full.
    touching = (first[..., 1] == second[..., 0]) & (second[..., 1] > second[..., 0])
    first = torch.where(touching[..., None], torch.stack((first[..., 0], second[..., 1]), -1), first)
    second = torch.where(touching[..., None], second[..., :1], second)
    return torch.stack((first, second), -2)


def interval_mask_mod(intervals: torch.Tensor):
    """The block-diffusion mask as a flex `mask_mod` read from `visible_key_intervals` ([R, C, 2, 2]): a key is
    visible when it lies in one of the query's two ranges. The same mask as `block_diffusion_mask_mod` for the layouts
    `pack_segments` builds, but every load is indexed by the query alone (four per query row of a tile) and the rest
    is four comparisons, where the segment form loads three tensors at every key and does a dozen operations: flex
    evaluates it element by element in every partial tile, forward and backward."""
    bounds = intervals.to(torch.int32)
    first_start, first_end = bounds[..., 0, 0].contiguous(), bounds[..., 0, 1].contiguous()
    second_start, second_end = bounds[..., 1, 0].contiguous(), bounds[..., 1, 1].contiguous()

    def mask_mod(b, h, q, kv):
        return (((kv >= first_start[b, q]) & (kv < first_end[b, q]))
                | ((kv >= second_start[b, q]) & (kv < second_end[b, q])))

    return mask_mod


def tile_structure(batch: BlockDiffusionBatch, block_size: int, tile: int = 128,
                   intervals: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full): bool [R, C/tile, C/tile] over flex's tiles (query tile, key tile). A tile is full when
    every query in it sees every key in it, partial when some (but not all) pairs are visible, else empty.

    Counted per query from its two key intervals (`visible_key_intervals`, computed here unless given) with
    difference arrays, so the cost is O(R x C + R x (C/tile)^2), not the O(R x C^2) of evaluating the mask on the
    grid."""
    rows, length = batch.segment_ids.shape
    if length % tile:
        raise ValueError(f"row length {length} must be a multiple of the tile size {tile}")
    tiles = length // tile
    if intervals is None:
        intervals = visible_key_intervals(batch, block_size)  # [R, C, 2, 2]
    start, end = intervals[..., 0], intervals[..., 1]
    device = start.device
    # Flat index of (row, query tile) for every (position, interval); edges index the key tiles of that line.
    line = (torch.arange(rows, device=device)[:, None] * tiles + torch.arange(length, device=device) // tile)
    line = line[..., None].expand_as(start)

    def tiles_covered(low, high):
        """How many (query, interval) pairs of each query tile have each key tile in [low, high). Empty intervals
        go to a spare column (no boolean indexing: that would sync with the GPU)."""
        counts = torch.zeros(rows * tiles, tiles + 1, dtype=torch.int32, device=device)
        empty = (high <= low) | (end <= start)
        for edge, sign in ((low, 1), (high, -1)):
            edge = torch.where(empty, tiles, edge)
            counts.view(-1).scatter_add_(0, (line * (tiles + 1) + edge).flatten(),
                                         torch.full((edge.numel(),), sign, dtype=torch.int32, device=device))
        return counts.cumsum(-1)[:, :tiles].view(rows, tiles, tiles)

    touched = tiles_covered(start // tile, (end - 1) // tile + 1) > 0
    full = tiles_covered(-(-start // tile), end // tile) == tile  # every query of the tile covers the key tile
    return touched & ~full, full


MASK_MOD_FORMS = ("intervals", "segments")


def block_mask_from_layout(batch: BlockDiffusionBatch, block_size: int, tile: int = 128,
                           mask_mod_form: str = "intervals"):
    """The flex `BlockMask` of a packed batch, built from its layout (see `tile_structure`): the same tile sets as
    `create_block_mask(mask_mod, ...)` gives, without evaluating mask_mod on the C x C grid. Partial tiles evaluate
    `interval_mask_mod` (default) or `block_diffusion_mask_mod` (`mask_mod_form="segments"`): the same mask."""
    from torch.nn.attention.flex_attention import BlockMask

    if mask_mod_form not in MASK_MOD_FORMS:
        raise ValueError(f"mask_mod_form must be one of {MASK_MOD_FORMS}, got {mask_mod_form!r}")
    intervals = visible_key_intervals(batch, block_size)
    partial, full = tile_structure(batch, block_size, tile, intervals)

    def as_indices(tiles_present):
        # Present tiles first, in increasing order (stable sort), as create_block_mask lays them out.
        order = torch.argsort(tiles_present.to(torch.int8), dim=-1, descending=True, stable=True)
        return tiles_present.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    length = batch.input_ids.shape[1]
    mask_mod = (interval_mask_mod(intervals) if mask_mod_form == "intervals" else
                block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy))
    return BlockMask.from_kv_blocks(*as_indices(partial), *as_indices(full), BLOCK_SIZE=tile, mask_mod=mask_mod,
                                    seq_lengths=(length, length))


def build_attention_mask(batch: BlockDiffusionBatch, backend: str = "auto", block_size: int | None = None,
                         mask_mod_form: str = "intervals"):
    """The attention mask for a packed batch: `flex` (a BlockMask; the GPU default), or `dense` (bool tensor).

    With `block_size` (and a row length that is a multiple of 128), the flex BlockMask is built from the layout
    (`block_mask_from_layout`, its partial tiles evaluating `mask_mod_form`); without, by `create_block_mask`
    evaluating `block_diffusion_mask_mod` tile by tile."""
    if backend == "auto":
        backend = "flex" if batch.input_ids.is_cuda else "dense"
    mask_mod = block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy)
    rows, length = batch.input_ids.shape
    if backend == "dense":
        return dense_mask_from_mask_mod(mask_mod, rows, length, batch.input_ids.device)
    if backend == "flex":
        if block_size is not None and length % 128 == 0:
            return block_mask_from_layout(batch, block_size, mask_mod_form=mask_mod_form)
        from torch.nn.attention.flex_attention import create_block_mask

        # Compiled mask building evaluates the mask tile by tile instead of materialising rows x L x L.
        return create_block_mask(mask_mod, B=rows, H=None, Q_LEN=length, KV_LEN=length,
                                 device=batch.input_ids.device, _compile=batch.input_ids.is_cuda)
    raise ValueError(f"backend must be 'auto', 'dense' or 'flex', got {backend!r}")


def scored_cross_entropy(model, input_ids: torch.Tensor, position_ids, attention_mask, flat_index: torch.Tensor,
                         targets: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy at the scored positions only (flat indices into the rows): the LM head never sees
    the rest. One call of the model's own forward, so a sharded (FSDP) model gathers its weights as it runs."""
    logits = model(input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_at=flat_index).logits
    return F.cross_entropy(logits.float(), targets, reduction="none")


def check_prediction_shift(model, batch: BlockDiffusionBatch) -> None:
    """A batch laid out for one prediction shift scores the other convention's model at the wrong positions."""
    if batch.prediction_shift != prediction_shift(model.config):
        raise ValueError(f"the batch was packed for prediction_shift={batch.prediction_shift}, the model predicts "
                         f"with prediction_shift={prediction_shift(model.config)}")


def block_diffusion_loss(model, batch: BlockDiffusionBatch, attention_mask=None) -> torch.Tensor:
    """Sum over masked answer tokens of CE / t, divided by the number of answer tokens (SDAR's normalisation)."""
    check_prediction_shift(model, batch)
    if attention_mask is None:
        attention_mask = build_attention_mask(batch)
    targets = batch.targets.flatten().index_select(0, batch.scored_index)
    weights = batch.loss_weights.flatten().index_select(0, batch.scored_index)
    ce = scored_cross_entropy(model, batch.input_ids, batch.position_ids, attention_mask, batch.predictor_index,
                              targets)
    return (ce * weights).sum() / max(batch.num_answer_tokens, 1)


def autoregressive_loss(model, input_ids: torch.Tensor, answer_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain next-token cross-entropy (causal attention, shifted targets), over answer tokens when given."""
    rows, length = input_ids.shape
    targets = input_ids[:, 1:]
    scored = torch.ones_like(targets, dtype=torch.bool) if answer_mask is None else answer_mask[:, 1:]
    positions = torch.nonzero(scored.flatten()).flatten()
    # Position j of a row (j < length - 1) predicts token j + 1: flat index row * length + j.
    flat_index = positions // (length - 1) * length + positions % (length - 1)
    ce = scored_cross_entropy(model, input_ids, None, None, flat_index, targets.flatten().index_select(0, positions))
    return ce.mean()
