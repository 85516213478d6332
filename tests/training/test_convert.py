"""Converting an autoregressive model keeps its prediction shift: at t -> 0 the converted model reproduces the
autoregressive logits, decodes as the autoregressive model does, and starts block-diffusion training from the
autoregressive model's predictions (where an in-place conversion starts from noise). SDAR configs without the field
still load and decode as they were trained (in place). Qwen2 (bias on q/k/v, none on o, no qk-norm) converts too,
from a transformers model or a GGUF file, and its biases survive a save and a load."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from tests.training.conftest import CODE_SNIPPETS
from training import SDARForCausalLM
from training.configuration_sdar import sdar_config_from
from training.convert import convert_to_block_diffusion, load_pretrained_as_block_diffusion
from training.diffusion import NoisySegment, TokenizedSample, block_diffusion_loss, build_attention_mask, pack_segments
from training.generate import autoregressive_generate, block_diffusion_generate


def _tiny_ar_model(model_class, config_class, vocab_size, **extra):
    torch.manual_seed(0)
    config = config_class(**{**dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                                    tie_word_embeddings=True), **extra})
    model = model_class(config).eval()
    with torch.no_grad():  # biases start at zero; random ones make a dropped or misplaced bias show in the logits
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.5)
    return model


def _only_masked(sample: TokenizedSample, masked: torch.Tensor) -> NoisySegment:
    return NoisySegment(sample, 1.0, masked, torch.arange(sample.input_ids.numel()))


@pytest.mark.parametrize("model_class, config_class, extra", [
    (LlamaForCausalLM, LlamaConfig, {}),
    (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 16}),
    (Qwen2ForCausalLM, Qwen2Config, {}),
])
def test_at_t_to_zero_the_shifted_conversion_reproduces_the_autoregressive_logits(small_tokenizer, model_class,
                                                                                  config_class, extra):
    """Block size 1 makes the block-diffusion mask causal, so with only the target masked the converted model sees
    exactly the autoregressive context: its logits for the target (read one position earlier) must be the
    autoregressive model's next-token logits, for every position. (With larger blocks the clean copy attends within
    a block, which the autoregressive model never did: close, not equal.)"""
    tokenizer = copy.deepcopy(small_tokenizer)
    source = _tiny_ar_model(model_class, config_class, len(tokenizer), **extra)
    ids = torch.randint(4, len(tokenizer), (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        autoregressive = source(ids).logits[0]
    converted = convert_to_block_diffusion(source, tokenizer, block_size=1)
    assert converted.config.prediction_shift == 1
    sample = TokenizedSample(ids[0], torch.ones(14, dtype=torch.bool))
    for target in range(1, 14):
        masked = torch.arange(14) == target
        batch = pack_segments([_only_masked(sample, masked)], tokenizer.mask_token_id, 1, 28, shift=1)[0]
        with torch.no_grad():
            hidden = converted.model(batch.input_ids, batch.position_ids, build_attention_mask(batch))
            logits = converted.lm_head(hidden.last_hidden_state.reshape(-1, 64)[batch.predictor_index])
        torch.testing.assert_close(logits[0], autoregressive[target - 1], rtol=1e-4, atol=1e-4)


def test_decoding_the_shifted_conversion_one_token_a_block_is_the_autoregressive_greedy_decoding(small_tokenizer):
    tokenizer = copy.deepcopy(small_tokenizer)
    source = _tiny_ar_model(LlamaForCausalLM, LlamaConfig, len(tokenizer))
    prompt = [5, 9, 14, 30, 31, 7]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(8):
            logits = source(torch.tensor([ids])).logits[0, -1]
            logits[tokenizer.mask_token_id] = float("-inf")  # the decoders never produce the noise token
            ids.append(int(logits.argmax()))
    converted = convert_to_block_diffusion(source, tokenizer, block_size=4)
    result = block_diffusion_generate(converted, [prompt], 8, block_size=1, strategy="static")
    assert result.tokens[0].tolist() == ids[len(prompt):]
    assert autoregressive_generate(converted, [prompt], 8).tokens[0].tolist() == ids[len(prompt):]


def test_a_shift_keeping_conversion_starts_from_the_autoregressive_models_predictions(small_tokenizer):
    """An autoregressive model that has learnt a text: converted keeping the shift, its block-diffusion loss on that
    text with one token a block masked (blocks of 4, t -> 0) is about its next-token loss; converted to predict in
    place, the same weights score like noise (what SDAR's ~50B tokens of continued training re-learn)."""
    tokenizer = copy.deepcopy(small_tokenizer)
    source = _tiny_ar_model(LlamaForCausalLM, LlamaConfig, len(tokenizer))
    ids = torch.tensor(tokenizer(CODE_SNIPPETS[1] * 2, add_special_tokens=False)["input_ids"])[None]
    optimizer = torch.optim.AdamW(source.parameters(), lr=5e-3)
    source.train()
    for _ in range(100):
        loss = source(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    source.eval()
    with torch.no_grad():
        autoregressive_loss = source(ids, labels=ids).loss.item()
    assert autoregressive_loss < 0.5
    sample = TokenizedSample(ids[0], torch.ones(ids.shape[1], dtype=torch.bool))
    losses = {}
    for shift in (1, 0):
        model = convert_to_block_diffusion(copy.deepcopy(source), copy.deepcopy(tokenizer), 4, prediction_shift=shift)
        per_offset = []
        for offset in range(4):
            masked = (torch.arange(ids.shape[1]) % 4 == offset) & (torch.arange(ids.shape[1]) >= 1)
            batch = pack_segments([_only_masked(sample, masked)], tokenizer.mask_token_id, 4, 2 * ids.shape[1],
                                  shift=shift)[0]
            with torch.no_grad():  # the loss is a mean over all answer tokens with weight 1/t = 1
                per_offset.append(block_diffusion_loss(model, batch).item() * ids.shape[1] / int(masked.sum()))
        losses[shift] = sum(per_offset) / 4
    assert losses[1] < 2 * autoregressive_loss + 0.2
    assert losses[0] > 2.0 and losses[0] > 10 * losses[1]


def test_an_sdar_config_without_the_field_predicts_in_place_and_a_conversion_keeps_its_shift(tiny_model, tmp_path,
                                                                                           small_tokenizer):
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    before = block_diffusion_generate(tiny_model, prompts, 8, strategy="static")
    tiny_model.save_pretrained(tmp_path / "sdar")
    small_tokenizer.save_pretrained(tmp_path / "sdar")
    config = json.loads((tmp_path / "sdar" / "config.json").read_text())
    del config["prediction_shift"]  # a published SDAR/DICE config has no such field
    (tmp_path / "sdar" / "config.json").write_text(json.dumps(config))
    loaded, _ = load_pretrained_as_block_diffusion(tmp_path / "sdar")
    assert isinstance(loaded, SDARForCausalLM) and loaded.config.prediction_shift == 0
    assert torch.equal(block_diffusion_generate(loaded, prompts, 8, strategy="static").tokens, before.tokens)

    source = _tiny_ar_model(LlamaForCausalLM, LlamaConfig, len(small_tokenizer))
    source.save_pretrained(tmp_path / "llama")
    small_tokenizer.save_pretrained(tmp_path / "llama")
    converted, tokenizer = load_pretrained_as_block_diffusion(tmp_path / "llama")
    converted.save_pretrained(tmp_path / "converted")
    tokenizer.save_pretrained(tmp_path / "converted")
    reloaded, _ = load_pretrained_as_block_diffusion(tmp_path / "converted")
    assert converted.config.prediction_shift == reloaded.config.prediction_shift == 1


# ------------------------------------------------------------------------------------------------------ Qwen2
def test_a_qwen2_conversion_carries_the_qkv_biases_and_a_saved_checkpoint_keeps_them(small_tokenizer, tmp_path):
    tokenizer = copy.deepcopy(small_tokenizer)
    source = _tiny_ar_model(Qwen2ForCausalLM, Qwen2Config, len(tokenizer), tie_word_embeddings=False)
    converted = convert_to_block_diffusion(source, tokenizer)
    config = converted.config
    assert (config.qkv_bias, config.attention_bias, config.use_qk_norm, config.tie_word_embeddings) == (
        True, False, False, False)
    attention = converted.model.layers[1].self_attn
    assert attention.o_proj.bias is None and not hasattr(attention, "q_norm")
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(attention, name).bias, getattr(source.model.layers[1].self_attn, name).bias)
    ids = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)

    converted.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["qkv_bias"] is True
    reloaded, _ = load_pretrained_as_block_diffusion(tmp_path)
    assert reloaded.config.qkv_bias and not reloaded.config.attention_bias
    assert reloaded.state_dict().keys() == converted.state_dict().keys()
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in converted.state_dict().items())


def test_a_llama_attention_bias_still_means_a_bias_on_all_four_projections(small_tokenizer):
    source = _tiny_ar_model(LlamaForCausalLM, LlamaConfig, len(small_tokenizer), attention_bias=True)
    converted = convert_to_block_diffusion(source, copy.deepcopy(small_tokenizer))
    assert converted.config.attention_bias and not converted.config.qkv_bias
    assert converted.model.layers[0].self_attn.o_proj.bias is not None
    ids = torch.randint(0, len(small_tokenizer), (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_qwen2_config_with_sliding_window_attention_is_refused():
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                         max_window_layers=0)
    with pytest.raises(ValueError, match="sliding-window"):
        sdar_config_from(config, mask_token_id=63)


def _byte_level_vocabulary(words: list[str]) -> tuple[list[str], list[str]]:
    """A GPT-2-style byte-level vocabulary: the 256 byte symbols, then one token per merge spelling out `words`."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    tokens, merges = [spelling[b] for b in range(256)], []
    for word in words:
        word = "".join(spelling[b] for b in word.encode())
        for end in range(2, len(word) + 1):
            if word[:end] not in tokens:
                merges.append(f"{word[:end - 1]} {word[end - 1]}")
                tokens.append(word[:end])
    return tokens, merges


# llama.cpp's tensor names for a Qwen2 model (convert_hf_to_gguf.py); qwen2 q/k are stored unpermuted.
_GGUF_NAMES = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _gguf_name(name: str) -> str:
    module, kind = name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, layer, rest = module.split(".", 3)
        return f"blk.{layer}.{_GGUF_NAMES[rest]}.{kind}"
    return f"{_GGUF_NAMES[module]}.{kind}"


def _write_tiny_qwen2_gguf(path, source, tokens: list[str], merges: list[str], specials: list[str]) -> None:
    gguf = pytest.importorskip("gguf")
    config = source.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens + specials)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(specials))
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) + specials.index("<|im_end|>"))
    writer.add_pad_token_id(len(tokens) + specials.index("<|endoftext|>"))
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for name, tensor in source.state_dict().items():
        writer.add_tensor(_gguf_name(name), tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_tiny_qwen2_gguf_loads_converted_with_its_biases_and_tokenizer(tmp_path):
    """A qwen2 GGUF as llama.cpp writes one (F32 tensors, a byte-level BPE in the metadata) goes through the path a
    real Qwen2.5-Coder file takes: the converted model computes the written model's logits, biases included."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens, merges = _byte_level_vocabulary(["def", " return", " x", "__global__", " void", " float"])
    source = _tiny_ar_model(Qwen2ForCausalLM, Qwen2Config, len(tokens) + len(specials), tie_word_embeddings=False,
                            max_position_embeddings=64, rms_norm_eps=1e-6)
    _write_tiny_qwen2_gguf(tmp_path / "tiny-qwen2.gguf", source, tokens, merges, specials)

    model, tokenizer = load_pretrained_as_block_diffusion(tmp_path / "tiny-qwen2.gguf", block_size=4)
    assert (model.config.qkv_bias, model.config.attention_bias, model.config.use_qk_norm) == (True, False, False)
    assert not model.config.tie_word_embeddings and model.config.prediction_shift == 1
    vocab = len(tokens) + len(specials)
    assert tokenizer.mask_token_id == vocab == model.config.mask_token_id  # <|MASK|> appended after the file's
    text = "def f(x):\n    return x\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) < len(text.encode())  # the file's merges are used
    assert tokenizer.convert_ids_to_tokens(vocab - 1) == "<|im_end|>"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[..., :vocab]
        torch.testing.assert_close(logits, source(torch.tensor([ids])).logits, rtol=1e-4, atol=1e-4)
