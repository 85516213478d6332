"""The SDAR model: checkpoint round-trips through the Auto classes, equivalence with transformers' own Llama and
Qwen3 implementations (so converted and published weights mean the same thing), and the KV cache."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from training import SDARConfig, SDARForCausalLM, preset_config
from training.convert import convert_to_block_diffusion
from training.generate import model_logits


def test_published_style_checkpoint_loads_through_auto_classes_without_remote_code(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    # What a published SDAR config carries besides ours: remote-code pointers and a null rope_scaling.
    config["auto_map"] = {"AutoConfig": "configuration_sdar.SDARConfig",
                          "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}
    config["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()

    assert isinstance(loaded, SDARForCausalLM)
    assert loaded.config.block_size == 4 and loaded.config.mask_token_id == tiny_model.config.mask_token_id
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, tiny_model(ids).logits)


def test_config_refuses_rope_scaling_it_does_not_implement():
    with pytest.raises(ValueError, match="only default RoPE"):
        SDARConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert AutoConfig.for_model("sdar").model_type == "sdar"


def test_presets_have_the_published_qwen3_shapes():
    config = preset_config("1.7B")
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (2048, 28, 6144)
    with pytest.raises(ValueError, match="unknown preset"):
        preset_config("3B")


@pytest.mark.parametrize("model_class, config_class, extra", [
    (LlamaForCausalLM, LlamaConfig, {}),
    (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 16}),
])
def test_converted_model_computes_what_transformers_computes(small_tokenizer, model_class, config_class, extra):
    torch.manual_seed(0)
    config = config_class(vocab_size=len(small_tokenizer), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                          tie_word_embeddings=True, **extra)
    source = model_class(config).eval()
    converted = convert_to_block_diffusion(source, small_tokenizer)
    ids = torch.randint(0, config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)
    assert converted.config.use_qk_norm == (model_class is Qwen3ForCausalLM)


def test_mask_token_is_added_and_embeddings_grow_when_the_tokenizer_lacks_one():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "x": 1, "=": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    torch.manual_seed(0)
    source = LlamaForCausalLM(LlamaConfig(vocab_size=3, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    ids = torch.tensor([[1, 2, 1]])
    with torch.no_grad():
        before = source(ids).logits

    converted = convert_to_block_diffusion(source, tokenizer)

    assert tokenizer.mask_token == "<|MASK|>" and tokenizer.mask_token_id == 3
    assert converted.config.mask_token_id == 3
    assert converted.get_input_embeddings().num_embeddings == 4 and converted.lm_head.weight.shape[0] == 4
    # The original rows are untouched: the model still computes what it computed on the old vocabulary.
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits[..., :3], before, rtol=1e-5, atol=1e-5)


def test_kv_cached_forwards_give_the_uncached_logits(tiny_model):
    block = tiny_model.config.block_size
    ids = torch.randint(4, tiny_model.config.vocab_size, (2, 5 * block))
    reference = model_logits(tiny_model, ids, 0, ids.shape[1], block, cache=None)

    from training.modeling_sdar import KVCache

    cache = KVCache(tiny_model.config, 2, ids.shape[1], "cpu", torch.float32)
    with torch.no_grad():
        pieces = [model_logits(tiny_model, ids, 0, 2 * block, block, cache)]
        for start in range(2 * block, ids.shape[1], block):
            pieces.append(model_logits(tiny_model, ids, start, start + block, block, cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), reference.detach(), rtol=1e-5, atol=1e-5)


def test_static_decoding_forwards_at_each_rows_own_positions_give_the_uncached_logits(tiny_model):
    """Rows of a decoding batch sit at different blocks: each forward writes and reads every row at its own
    positions, against the whole preallocated cache."""
    from training.generate import StaticDecodingForward

    block = tiny_model.config.block_size
    total = 7 * block
    ids = torch.randint(4, tiny_model.config.vocab_size, (2, total))
    reference = model_logits(tiny_model, ids, 0, total, block, cache=None)
    forward = StaticDecodingForward(tiny_model, 2, total, block, 2 * block, head=lambda logits, ids, _: logits)
    no_arg = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        # the prefill projects only the positions asked for, a row's own
        picked = forward.prefill(ids[:, :block], 0, logits_at=torch.tensor([[block - 1], [1]]))
        torch.testing.assert_close(picked, torch.stack((reference[0, [block - 1]], reference[1, [1]])).detach(),
                                   rtol=1e-5, atol=1e-5)
        # row 0 walks blocks 1, 2, ...; row 1 is a block behind and starts by writing block 0 again
        for index in range(5):
            starts = torch.tensor([(index + 1) * block, index * block])
            positions = starts[:, None] + torch.arange(2 * block)  # [that block, the next]
            logits = forward(ids.gather(1, positions), positions, no_arg)
            expected = reference.gather(1, positions[..., None].expand(-1, -1, reference.shape[-1]))
            torch.testing.assert_close(logits, expected.detach(), rtol=1e-5, atol=1e-5)
