"""The block-diffusion objective: the mask against its definition (NOTES §4), the noise and the scored positions,
dense vs flex attention, the exactness of leaving unscored noisy blocks out, and the layout giving the decoder's
logits for the same state (one partition, one prediction shift)."""

from __future__ import annotations

import pytest
import torch

from training.diffusion import (IGNORE_INDEX, NoisySegment, TokenizedSample, block_diffusion_loss,
                                block_diffusion_mask_mod, block_mask_from_layout, build_attention_mask,
                                dense_mask_from_mask_mod, interval_mask_mod, noise_sample, pack_block_diffusion,
                                pack_segments, tile_structure, visible_key_intervals)
from training.generate import model_logits

MASK_ID = 3


def reference_mask(length: int, block_size: int) -> torch.Tensor:
    """[x_t ; x_0] mask written from the definition, one pair at a time."""
    mask = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for k in range(2 * length):
            q_noisy, k_noisy = q < length, k < length
            q_block, k_block = (q % length) // block_size, (k % length) // block_size
            if q_noisy and k_noisy:
                mask[q, k] = q_block == k_block  # bidirectional inside a noisy block
            elif q_noisy:
                mask[q, k] = k_block < q_block  # strictly earlier clean blocks
            elif not k_noisy:
                mask[q, k] = k_block <= q_block  # the clean half is block-causal
    return mask


def samples(lengths_and_prompts, vocab=300, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [TokenizedSample(torch.randint(4, vocab, (length,), generator=generator), torch.arange(length) >= prompt)
            for length, prompt in lengths_and_prompts]


def test_dense_mask_of_the_full_layout_matches_the_definition():
    batch = pack_block_diffusion(samples([(10, 0)]), MASK_ID, 4, 20, torch.Generator().manual_seed(0),
                                 drop_unscored_blocks=False)
    dense = build_attention_mask(batch, "dense")
    assert torch.equal(dense[0, 0], reference_mask(10, 4))


def test_prompt_tokens_are_never_masked_and_weights_are_one_over_t():
    sample = samples([(64, 24)])[0]
    segment = noise_sample(sample, 4, torch.Generator().manual_seed(5), drop_unscored_blocks=False)
    assert not segment.masked[:24].any() and segment.masked.any()
    batch, _ = pack_segments([segment], MASK_ID, 4, 128)
    noisy = batch.is_noisy[0]
    scored = batch.targets[0] != IGNORE_INDEX
    assert torch.equal(scored[noisy], segment.masked)
    assert torch.equal(batch.input_ids[0][noisy][segment.masked], torch.full((int(segment.masked.sum()),), MASK_ID))
    assert torch.equal(batch.targets[0][scored], sample.input_ids[segment.masked])  # no shift: token i at i
    torch.testing.assert_close(batch.loss_weights[0][scored], torch.full((int(scored.sum()),), 1 / segment.t))
    assert batch.num_answer_tokens == 40


@pytest.fixture()
def mixed_samples():
    return samples([(37, 10), (20, 5), (50, 0), (9, 8)])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_dense_and_flex_attention_give_the_same_loss(tiny_model, mixed_samples):
    batch = pack_block_diffusion(mixed_samples, MASK_ID, 4, 128, torch.Generator().manual_seed(1))
    with torch.no_grad():  # flex_attention has no CPU backward; the forward is what is compared
        dense = block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "dense"))
        flex = block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "flex"))
    torch.testing.assert_close(dense, flex, rtol=1e-5, atol=1e-5)


def test_dropping_unscored_noisy_blocks_leaves_the_loss_unchanged(tiny_model, mixed_samples):
    losses, lengths = [], []
    for drop in (False, True):
        batch = pack_block_diffusion(mixed_samples, MASK_ID, 4, 256, torch.Generator().manual_seed(2),
                                     drop_unscored_blocks=drop)
        losses.append(block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "dense")))
        lengths.append(int((batch.segment_ids >= 0).sum()))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    assert lengths[1] < lengths[0]  # the all-prompt sample (9, 8) alone saves two noisy blocks


def test_gradients_flow_and_packing_into_several_rows_keeps_samples_apart(tiny_model, mixed_samples):
    one_row = pack_block_diffusion(mixed_samples, MASK_ID, 4, 256, torch.Generator().manual_seed(3))
    rows = pack_block_diffusion(mixed_samples, MASK_ID, 4, 100, torch.Generator().manual_seed(3))
    assert rows.input_ids.shape[0] > 1
    loss_one = block_diffusion_loss(tiny_model, one_row, build_attention_mask(one_row, "dense"))
    loss_rows = block_diffusion_loss(tiny_model, rows, build_attention_mask(rows, "dense"))
    torch.testing.assert_close(loss_one, loss_rows, rtol=1e-5, atol=1e-6)
    loss_rows.backward()
    assert tiny_model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_rows_limit_returns_leftovers_still_noised_and_too_long_samples_fail():
    generator = torch.Generator().manual_seed(0)
    segments = [noise_sample(s, 4, generator) for s in samples([(40, 0)] * 6)]
    batch, leftover = pack_segments(segments, MASK_ID, 4, 100, max_rows=2)
    assert batch.input_ids.shape[0] == 2 and batch.num_samples + len(leftover) == 6
    assert all(any(s is kept for kept in segments) for s in leftover)
    with pytest.raises(ValueError, match="truncate samples"):
        pack_block_diffusion(samples([(80, 0)]), MASK_ID, 4, 100, generator, drop_unscored_blocks=False)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [None, 128])
@pytest.mark.parametrize("mask_from_layout", [None, "segments", "intervals"])
def test_compiled_flex_matches_dense_on_gpu_forward_and_backward(tiny_model, mixed_samples, tile, mask_from_layout):
    model = tiny_model.cuda()
    batch = pack_block_diffusion(mixed_samples, MASK_ID, 4, 128, torch.Generator().manual_seed(1), tile=tile).to("cuda")
    grads = []
    for backend in ("dense", "flex"):
        model.zero_grad()
        mask = build_attention_mask(batch, backend, block_size=4 if mask_from_layout else None,
                                    mask_mod_form=mask_from_layout or "intervals")
        loss = block_diffusion_loss(model, batch, mask)
        loss.backward()
        grads.append((loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-3, atol=1e-4)


def tile_sets(block_mask, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) bool [B, Q tiles, KV tiles] read back from a BlockMask's index lists."""
    def present(num_blocks, indices):
        listed = torch.arange(indices.shape[-1]) < num_blocks[:, 0, :, None]
        return torch.zeros(indices.shape[0], indices.shape[2], tiles + 1, dtype=torch.bool).scatter_(
            -1, torch.where(listed, indices[:, 0].long(), tiles), True)[..., :tiles]
    return (present(block_mask.kv_num_blocks, block_mask.kv_indices),
            present(block_mask.full_kv_num_blocks, block_mask.full_kv_indices))


def random_samples(count: int, max_length: int, generator) -> list[TokenizedSample]:
    lengths = torch.randint(1, max_length, (count,), generator=generator).tolist()
    return [TokenizedSample(torch.randint(4, 300, (length,), generator=generator),
                            torch.arange(length) >= int(torch.randint(0, length, (), generator=generator)))
            for length in lengths]


@pytest.mark.parametrize("block_size", [1, 4, 8])
@pytest.mark.parametrize("layout", ["full", "dropped", "tiled"])
def test_block_mask_from_layout_has_the_tiles_create_block_mask_finds(block_size, layout):
    from torch.nn.attention.flex_attention import create_block_mask

    generator = torch.Generator().manual_seed(block_size)
    seen_full = False
    for _ in range(3):
        long_sample = samples([(512, 100)])  # fills the first half-row: its clean copy has full tiles
        batch = pack_block_diffusion(random_samples(10, 400, generator) + long_sample, MASK_ID, block_size, 1024,
                                     generator,
                                     drop_unscored_blocks=layout != "full", tile=128 if layout == "tiled" else None)
        rows, length = batch.input_ids.shape
        mask_mod = block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy)
        reference = tile_sets(create_block_mask(mask_mod, B=rows, H=None, Q_LEN=length, KV_LEN=length,
                                                device="cpu"), length // 128)
        built = block_mask_from_layout(batch, block_size)
        for ours, theirs in zip(tile_sets(built, length // 128), reference):
            assert torch.equal(ours, theirs)
        partial, full = tile_structure(batch, block_size)
        assert torch.equal(partial, reference[0]) and torch.equal(full, reference[1])
        seen_full |= bool(full.any())
    assert seen_full  # the packings exercise full tiles, not only partial ones


@pytest.mark.parametrize("block_size", [1, 4, 8])
@pytest.mark.parametrize("layout", ["full", "dropped", "tiled"])
def test_interval_mask_mod_is_the_block_diffusion_mask(block_size, layout):
    generator = torch.Generator().manual_seed(10 + block_size)
    row_counts = []
    for row_length in (4096, 512):  # one row, then the same kind of samples over several rows
        batch = pack_block_diffusion(random_samples(9, 200, generator) + samples([(40, 0), (3, 1)]), MASK_ID,
                                     block_size, row_length, generator, drop_unscored_blocks=layout != "full",
                                     tile=128 if layout == "tiled" else None)
        rows, length = batch.input_ids.shape
        row_counts.append(rows)
        reference = dense_mask_from_mask_mod(
            block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy), rows, length, "cpu")
        ours = dense_mask_from_mask_mod(interval_mask_mod(visible_key_intervals(batch, block_size)), rows, length,
                                        "cpu")
        assert ours.shape == reference.shape and torch.equal(ours, reference)
        assert (batch.segment_ids < 0).any()  # padding is part of the comparison
    assert row_counts[0] == 1 and row_counts[1] > 1


def test_tile_aware_packing_keeps_the_loss_and_aligns_segments(tiny_model):
    generator = torch.Generator().manual_seed(4)
    samples_ = random_samples(6, 300, generator)
    losses = []
    for drop, tile in ((False, None), (True, None), (True, 128)):
        batch = pack_block_diffusion(samples_, MASK_ID, 4, 2048, torch.Generator().manual_seed(5),
                                     drop_unscored_blocks=drop, tile=tile)
        with torch.no_grad():
            losses.append(block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "dense")))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[0], losses[2], rtol=1e-5, atol=1e-6)
    # Every segment starts on a tile boundary and every noisy run that can be is a whole number of tiles.
    segment = batch.segment_ids[0]
    starts = torch.nonzero(torch.diff(segment, prepend=segment.new_tensor([-2])) != 0).flatten()
    assert all(int(s) % 128 == 0 for s in starts if segment[s] >= 0)
    for sample_id in range(batch.num_samples):
        noisy = int(((segment == sample_id) & batch.is_noisy[0]).sum())
        length = int(((segment == sample_id) & ~batch.is_noisy[0]).sum())
        assert noisy % 128 == 0 or length % 4 or noisy == length


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_loss_with_the_layout_block_mask_equals_the_dense_loss(tiny_model, mixed_samples):
    batch = pack_block_diffusion(mixed_samples, MASK_ID, 4, 256, torch.Generator().manual_seed(1), tile=128)
    with torch.no_grad():
        dense = block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "dense"))
        flex = block_diffusion_loss(tiny_model, batch, build_attention_mask(batch, "flex", block_size=4))
    torch.testing.assert_close(dense, flex, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prompt_length", range(4, 12))  # every residue mod 4, prompt block whole or not
def test_the_training_layout_gives_the_decoders_logits_for_every_state_of_every_block(any_tiny_model,
                                                                                      prompt_length):
    """SFT and decoding share one partition and one prediction shift: for each block of an answer, with some of
    its tokens masked, the logits the loss reads at the masked positions (noisy copy + clean copy, packed) equal the
    logits the decoder reads for that state (the clean prefix, then the block as it is)."""
    model, block = any_tiny_model, 4
    shift = model.config.prediction_shift
    ids = torch.randint(4, 300, (prompt_length + 10,), generator=torch.Generator().manual_seed(prompt_length))
    sample = TokenizedSample(ids, torch.arange(ids.numel()) >= prompt_length)
    for k in range(prompt_length // block, (ids.numel() - 1) // block + 1):
        positions = torch.arange(k * block, min((k + 1) * block, ids.numel()))
        masked = torch.zeros(ids.numel(), dtype=torch.bool)
        masked[positions] = sample.answer_mask[positions] & (torch.arange(positions.numel()) % 2 == k % 2)
        masked[positions[-1]] = True  # at least one masked token a block
        segment = NoisySegment(sample, 0.5, masked, positions)
        batch = pack_segments([segment], MASK_ID, block, 2 * ids.numel(), shift=shift)[0]
        with torch.no_grad():
            hidden = model.model(batch.input_ids, batch.position_ids, build_attention_mask(batch)).last_hidden_state
            trained = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[batch.predictor_index])
            state = torch.where(masked, MASK_ID, ids)[: int(positions[-1]) + 1]
            decoded = model_logits(model, state[None], 0, state.numel(), block, None)[0]
        assert torch.equal(batch.targets.flatten()[batch.scored_index], ids[masked])
        torch.testing.assert_close(trained, decoded[torch.nonzero(masked).flatten() - shift], rtol=1e-5, atol=1e-5)


def test_a_shifted_loss_predicts_each_token_from_the_position_before_it():
    sample = samples([(23, 6)])[0]
    segment = noise_sample(sample, 4, torch.Generator().manual_seed(0), drop_unscored_blocks=False)
    batch = pack_segments([segment], MASK_ID, 4, 64, shift=1)[0]
    positions, noisy = batch.position_ids.flatten(), batch.is_noisy.flatten()
    targets, sources = positions[batch.scored_index], positions[batch.predictor_index]
    assert torch.equal(sources, targets - 1)
    # Inside its block a token is predicted from the noisy copy; a block's first token from the clean copy's
    # previous block (final by then, as in decoding).
    assert torch.equal(noisy[batch.predictor_index], targets % 4 != 0)
    assert (targets % 4 == 0).any() and (targets % 4 != 0).any()
    unshifted = pack_segments([segment], MASK_ID, 4, 64)[0]
    assert torch.equal(unshifted.predictor_index, unshifted.scored_index)


def test_a_shifted_model_never_masks_the_first_token_and_refuses_a_batch_packed_for_the_other_shift(tiny_model):
    windows = samples([(12, 0)] * 40)
    for seed in range(40):
        assert not noise_sample(windows[seed], 4, torch.Generator().manual_seed(seed), shift=1).masked[0]
    batch = pack_block_diffusion(windows[:2], MASK_ID, 4, 64, torch.Generator().manual_seed(0), shift=1)
    with pytest.raises(ValueError, match="prediction_shift"):
        block_diffusion_loss(tiny_model, batch)  # the tiny model predicts in place
