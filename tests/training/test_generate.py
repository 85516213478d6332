"""Block decoding: SDAR's block partition (the same as training's, for prompts of every length modulo the block
size), rows of a batch advancing on their own and decoding as they would alone, the cache changing nothing, the
prediction shift followed, the sampler's filters, EOS handling, and (slow) a tiny model trained on a few strings
reproducing them, with dynamic unmasking taking fewer forwards than static for the same output."""

from __future__ import annotations

import pytest
import torch

from training import SDARForCausalLM, preset_config
from training.diffusion import TokenizedSample, noise_sample, pack_segments
from training.generate import (autoregressive_generate, block_causal_mask, block_diffusion_generate, sample_tokens,
                               transfer_schedule)
from training.sft import SFTConfig, tokenize_chat_rows, train_block_diffusion
from training.tokenizer import train_bpe_tokenizer

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 33)), [40, 41, 42, 43]]  # lengths 3, 2, 1, 0 mod 4


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_cached_decoding_gives_the_uncached_tokens(any_tiny_model, strategy):
    cached = block_diffusion_generate(any_tiny_model, PROMPTS, 10, strategy=strategy, confidence_threshold=0.02)
    uncached = block_diffusion_generate(any_tiny_model, PROMPTS, 10, strategy=strategy, confidence_threshold=0.02,
                                        use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert torch.equal(cached.unmask_steps - 1, uncached.unmask_steps)  # the cached run has one prefill forward more


def test_the_decoders_blocks_are_the_training_partition_for_prompts_of_every_length(any_tiny_model):
    """One static step a block commits the whole block at once: the answer positions one forward commits are one
    block of the decoder's partition, which must be SFT's (blocks counted from the prompt's first token)."""
    prompts = [list(range(50, 50 + length)) for length in range(4, 12)]  # every residue mod 4, twice, batched
    result = block_diffusion_generate(any_tiny_model, prompts, 9, strategy="static", steps=1)
    for row, prompt in enumerate(prompts):
        ids = torch.tensor(prompt + result.tokens[row].tolist())
        sample = TokenizedSample(ids, torch.arange(ids.numel()) >= len(prompt))
        segment = noise_sample(sample, 4, torch.Generator().manual_seed(0), drop_unscored_blocks=False)
        training = pack_segments([segment], 3, 4, 2 * ids.numel())[0]
        clean = ~training.is_noisy[0] & (training.segment_ids[0] >= 0)
        training_blocks = training.block_ids[0, clean][len(prompt):]
        decoder_steps = result.unmask_steps[row]
        same_forward = decoder_steps[:, None] == decoder_steps[None, :]
        same_block = training_blocks[:, None] == training_blocks[None, :]
        assert torch.equal(same_forward, same_block), len(prompt)
        # The first answer block is the one holding the prompt's last len % 4 tokens: it has 4 - len % 4 answers.
        assert int((decoder_steps == decoder_steps[0]).sum()) == 4 - len(prompt) % 4


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_rows_of_a_batch_decode_as_they_would_alone_and_advance_on_their_own(any_tiny_model, strategy):
    prompts = PROMPTS + [list(range(60, 69)), [70]]
    together = block_diffusion_generate(any_tiny_model, prompts, 11, strategy=strategy, confidence_threshold=0.02)
    alone = [block_diffusion_generate(any_tiny_model, [prompt], 11, strategy=strategy, confidence_threshold=0.02)
             for prompt in prompts]
    for row, result in enumerate(alone):
        assert torch.equal(result.tokens[0], together.tokens[row]), row
    # No row waits for another: the batch takes as many decoding forwards as its slowest row alone.
    prefill = [int(len(p) >= 8) for p in prompts]  # a second whole prompt block is prefilled in one forward
    decoding = [result.num_forwards - p for result, p in zip(alone, prefill)]
    assert together.num_forwards == max(prefill) + max(decoding)
    if strategy == "dynamic":
        assert len(set(decoding)) > 1  # rows did need different numbers of forwards: lockstep would cost more


def test_autoregressive_rows_decode_as_they_would_alone(any_tiny_model):
    together = autoregressive_generate(any_tiny_model, PROMPTS, 6)
    for row, prompt in enumerate(PROMPTS):
        assert torch.equal(autoregressive_generate(any_tiny_model, [prompt], 6).tokens[0], together.tokens[row])


def test_autoregressive_decoding_follows_the_prediction_shift(any_tiny_model):
    model = any_tiny_model
    result = autoregressive_generate(model, PROMPTS[:1], 6)
    ids, mask = list(PROMPTS[0]), model.config.mask_token_id
    with torch.no_grad():
        for _ in range(6):
            if model.config.prediction_shift:  # the next token's logits are the last token's
                logits = model(torch.tensor([ids])).logits[0, -1]
            else:  # in place: a block of one MASK after the sequence, predicted where it stands
                logits = model(torch.tensor([ids + [mask]])).logits[0, -1]
                logits[mask] = float("-inf")
            ids.append(int(logits.argmax()))
    assert result.tokens[0].tolist() == ids[len(PROMPTS[0]):]
    assert result.num_forwards == (6 if model.config.prediction_shift else 7)  # in place: + a prefill forward


@pytest.mark.parametrize("decode", [
    lambda model, graphs: block_diffusion_generate(model, PROMPTS, 10, strategy="dynamic", confidence_threshold=0.02,
                                                   graphs=graphs),
    lambda model, graphs: autoregressive_generate(model, PROMPTS, 10, graphs=graphs)])
def test_reusing_a_decoding_cache_across_calls_changes_nothing(any_tiny_model, decode):
    graphs: dict = {}
    first, again = decode(any_tiny_model, graphs), decode(any_tiny_model, graphs)  # the second finds a used cache
    assert len(graphs) == 1
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.tokens, decode(any_tiny_model, None).tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_cuda_graph_decoding_gives_the_eager_tokens(any_tiny_model, strategy):
    model = any_tiny_model.cuda()
    graphs: dict = {}
    for run in range(2):  # capture, then replay a graph captured by an earlier call
        graphed = block_diffusion_generate(model, PROMPTS, 12, strategy=strategy,
                                           confidence_threshold=0.02, graphs=graphs)
        eager = block_diffusion_generate(model, PROMPTS, 12, strategy=strategy,
                                         confidence_threshold=0.02, cuda_graph=False)
        assert torch.equal(graphed.tokens, eager.tokens) and graphed.num_forwards == eager.num_forwards
        assert torch.equal(autoregressive_generate(model, PROMPTS, 8, graphs=graphs).tokens,
                           autoregressive_generate(model, PROMPTS, 8, cuda_graph=False).tokens)


def test_step_map_follows_the_schedule_and_a_first_block_holding_prompt_tokens_decodes_only_its_masks(tiny_model):
    assert transfer_schedule(4, 2) == [2, 2] and transfer_schedule(4, 3) == [2, 1, 1]
    whole = block_diffusion_generate(tiny_model, [list(range(5, 13))], 8, strategy="static", steps=2)
    # 8 prompt tokens: block 0 prefilled (forward 0), block 1 is the first "previous" block; each answer block of 4
    # takes 2 forwards committing 2 tokens each
    assert sorted(whole.unmask_steps[0].tolist()) == [1, 1, 2, 2, 3, 3, 4, 4] and whole.num_forwards == 5
    partial = block_diffusion_generate(tiny_model, [list(range(5, 12))], 8, strategy="static", steps=2)
    # 7 prompt tokens: block 1 holds 3 of them and one masked answer token (one forward), then two whole blocks
    steps = partial.unmask_steps[0].tolist()
    assert steps[0] == 0 and sorted(steps[1:5]) == [1, 1, 2, 2] and set(steps[5:]) <= {3, 4}
    assert partial.num_forwards == 5


def test_eos_stops_its_row_and_pads_after_it_while_the_others_go_on(tiny_model):
    free = block_diffusion_generate(tiny_model, PROMPTS, 12, strategy="static")
    eos = int(free.tokens[0, 5])
    stopped = block_diffusion_generate(tiny_model, PROMPTS, 12, strategy="static", eos_token_id=eos, pad_token_id=0)
    first = int((free.tokens[0] == eos).nonzero()[0])
    assert int(stopped.lengths[0]) == first + 1
    assert stopped.tokens[0, first] == eos and (stopped.tokens[0, first + 1:] == 0).all()
    assert (stopped.unmask_steps[0, first + 1:] == -1).all()
    for row in range(1, len(PROMPTS)):
        if eos not in free.tokens[row].tolist():
            assert torch.equal(stopped.tokens[row], free.tokens[row]) and int(stopped.lengths[row]) == 12


def test_block_causal_mask_takes_one_set_of_positions_per_row():
    shared = block_causal_mask(torch.tensor([4, 5]), 8, 4)
    per_row = block_causal_mask(torch.tensor([[4, 5], [0, 1]]), 8, 4)
    assert shared.shape == (1, 1, 2, 8) and per_row.shape == (2, 1, 2, 8)
    assert per_row[0, 0].tolist() == shared[0, 0].tolist() == [[True] * 8] * 2
    assert per_row[1, 0].tolist() == [[True] * 4 + [False] * 4] * 2


def test_sampler_filters_reduce_to_greedy_at_their_limits():
    logits = torch.randn(3, 5, 50)
    greedy, confidence = sample_tokens(logits)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(sample_tokens(logits, temperature=1.0, top_k=1, generator=generator)[0], greedy)
    assert torch.equal(sample_tokens(logits, temperature=1.0, top_p=1e-6, generator=generator)[0], greedy)
    torch.testing.assert_close(confidence, torch.softmax(logits, -1).max(-1).values)


STRINGS = {"relu": "y = torch.relu(x)", "add": "__global__ void add(float* a) { a[i] += 1; }",
           "softmax": "out = x.exp() / x.exp().sum(-1, keepdim=True)", "matmul": "c = a @ b  # tiled in shared memory"}


@pytest.mark.slow
def test_tiny_model_trained_on_a_few_strings_reproduces_them_with_block_decoding():
    rows = [dict(prompt=prompt, response=response) for prompt, response in STRINGS.items()]
    tokenizer = train_bpe_tokenizer([f"{p} {r}" for p, r in STRINGS.items()] * 20, vocab_size=300, min_frequency=1)
    data = tokenize_chat_rows(tokenizer, rows)
    torch.manual_seed(0)
    model = SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id))
    history = train_block_diffusion(model, data.samples, SFTConfig(
        learning_rate=3e-3, final_lr_ratio=1.0, epochs=1000, max_steps=150, samples_per_step=4,
        row_length=128))["history"]
    assert history[-1]["loss"] < 0.5 < history[0]["loss"]

    prompts = [s.input_ids[~s.answer_mask].tolist() for s in data.samples]
    outputs = {}
    for strategy in ("static", "dynamic"):
        result = block_diffusion_generate(model, prompts, 40, strategy=strategy, confidence_threshold=0.9,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts = [tokenizer.decode(result.tokens[i, : result.lengths[i]], skip_special_tokens=True)
                 for i in range(len(rows))]
        assert texts == list(STRINGS.values())
        outputs[strategy] = result
    assert torch.equal(outputs["dynamic"].tokens, outputs["static"].tokens)
    assert outputs["dynamic"].num_forwards < outputs["static"].num_forwards
