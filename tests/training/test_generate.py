"""Block decoding: the cache changes nothing, batching prompts of different lengths changes nothing, the sampler's
filters, EOS handling, and (slow) a tiny model trained on a few strings reproduces them, with dynamic unmasking
taking fewer forwards than static for the same output."""

from __future__ import annotations

import pytest
import torch

from training import SDARForCausalLM, preset_config
from training.generate import (autoregressive_generate, block_diffusion_generate, sample_tokens,
                               transfer_schedule)
from training.sft import SFTConfig, tokenize_chat_rows, train_block_diffusion
from training.tokenizer import train_bpe_tokenizer

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 33))]


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_cached_decoding_gives_the_uncached_tokens(tiny_model, strategy):
    cached = block_diffusion_generate(tiny_model, PROMPTS, 10, strategy=strategy, threshold=0.002)
    uncached = block_diffusion_generate(tiny_model, PROMPTS, 10, strategy=strategy, threshold=0.002,
                                        use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert torch.equal(cached.unmask_steps - 1, uncached.unmask_steps)  # the cached run has one prefill forward more


def test_cached_autoregressive_decoding_is_greedy_decoding_without_a_cache(tiny_model):
    result = autoregressive_generate(tiny_model, PROMPTS[:1], 6)
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert result.tokens[0].tolist() == ids[len(PROMPTS[0]):] and result.num_forwards == 6


@pytest.mark.parametrize("decode", [
    lambda model, graphs: block_diffusion_generate(model, PROMPTS, 10, strategy="dynamic", threshold=0.002,
                                                   graphs=graphs),
    lambda model, graphs: autoregressive_generate(model, PROMPTS, 10, graphs=graphs)])
def test_reusing_a_decoding_cache_across_calls_changes_nothing(tiny_model, decode):
    graphs: dict = {}
    first, again = decode(tiny_model, graphs), decode(tiny_model, graphs)  # the second call finds a used cache
    assert len(graphs) == 1
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.tokens, decode(tiny_model, None).tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_cuda_graph_decoding_gives_the_eager_tokens(tiny_model, strategy):
    model = tiny_model.cuda()
    graphs: dict = {}
    for run in range(2):  # capture, then replay a graph captured by an earlier call
        graphed = block_diffusion_generate(model, PROMPTS, 12, strategy=strategy, threshold=0.002, graphs=graphs)
        eager = block_diffusion_generate(model, PROMPTS, 12, strategy=strategy, threshold=0.002, cuda_graph=False)
        assert torch.equal(graphed.tokens, eager.tokens) and graphed.num_forwards == eager.num_forwards
        assert torch.equal(autoregressive_generate(model, PROMPTS, 8, graphs=graphs).tokens,
                           autoregressive_generate(model, PROMPTS, 8, cuda_graph=False).tokens)


def test_prompts_of_different_lengths_decode_as_they_would_alone(tiny_model):
    together = block_diffusion_generate(tiny_model, PROMPTS, 8, strategy="static")
    for row, prompt in enumerate(PROMPTS):
        alone = block_diffusion_generate(tiny_model, [prompt], 8, strategy="static")
        assert torch.equal(alone.tokens[0], together.tokens[row])
    ar_together = autoregressive_generate(tiny_model, PROMPTS, 6)
    assert torch.equal(autoregressive_generate(tiny_model, PROMPTS[1:2], 6).tokens[0], ar_together.tokens[1])


def test_step_map_records_one_commit_per_scheduled_slot(tiny_model):
    result = block_diffusion_generate(tiny_model, PROMPTS[:1], 8, strategy="static", steps=2)
    assert transfer_schedule(4, 2) == [2, 2] and transfer_schedule(4, 3) == [2, 1, 1]
    # prefill is forward 0; each block of 4 takes 2 forwards committing 2 tokens each
    assert sorted(result.unmask_steps[0].tolist()) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert result.num_forwards == 5


def test_eos_stops_a_row_and_pads_after_it(tiny_model):
    free = block_diffusion_generate(tiny_model, PROMPTS, 12, strategy="static")
    eos = int(free.tokens[0, 5])
    stopped = block_diffusion_generate(tiny_model, PROMPTS, 12, strategy="static", eos_token_id=eos, pad_token_id=0)
    first = int((free.tokens[0] == eos).nonzero()[0])
    assert int(stopped.lengths[0]) == first + 1
    assert stopped.tokens[0, first] == eos and (stopped.tokens[0, first + 1:] == 0).all()
    assert (stopped.unmask_steps[0, first + 1:] == -1).all()


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
    data = tokenize_chat_rows(tokenizer, rows, max_length=64)
    torch.manual_seed(0)
    model = SDARForCausalLM(preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id))
    history = train_block_diffusion(model, data.samples, SFTConfig(
        learning_rate=3e-3, epochs=1000, max_steps=150, samples_per_step=4, row_length=128))
    assert history[-1]["loss"] < 0.5 < history[0]["loss"]

    prompts = [s.input_ids[~s.answer_mask].tolist() for s in data.samples]
    outputs = {}
    for strategy in ("static", "dynamic"):
        result = block_diffusion_generate(model, prompts, 40, strategy=strategy, threshold=0.9,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts = [tokenizer.decode(result.tokens[i, : result.lengths[i]], skip_special_tokens=True)
                 for i in range(len(rows))]
        assert texts == list(STRINGS.values())
        outputs[strategy] = result
    assert torch.equal(outputs["dynamic"].tokens, outputs["static"].tokens)
    assert outputs["dynamic"].num_forwards < outputs["static"].num_forwards
