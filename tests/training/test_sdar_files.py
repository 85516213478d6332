"""Compatibility with the real SDAR files (SDAR-4B-Chat and SDAR-8B-Chat: configs, weight index, tokenizer, chat
template; ../shared/data/sdar, or DICE_SDAR_FILES): a model built from each real config has exactly the published
weight names and shapes; a checkpoint we save loads back and carries SDAR's config fields; an SDAR folder's own
tokenizer, mask token and chat template are what our prompts, SFT answers and decoding stops use; and SFT, both RL
stages and evaluation-style decoding run on a tiny SDAR-shaped model with the real tokenizer (vocabulary 151,936)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dice_pipeline.prompts import format_kernel_response, kernel_generation_messages
from training import SDARConfig, SDARForCausalLM
from training.convert import load_base
from training.data import write_jsonl
from training.sft import tokenize_chat_rows
from training.tasks import RLTask
from training.tokenizer import stop_token_ids
from training.trace import prompt_ids_for

ROOT = Path(__file__).resolve().parents[2]
SDAR_FILES = Path(os.environ.get("DICE_SDAR_FILES", ROOT.parent / "shared" / "data" / "sdar"))
MODELS = ["SDAR-4B-Chat", "SDAR-8B-Chat"]
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
MASK, IM_START, IM_END, ENDOFTEXT = 151669, 151644, 151645, 151643

pytestmark = pytest.mark.skipif(not (SDAR_FILES / "tokenizer" / "vocab.json").is_file(),
                                reason=f"the SDAR files are not at {SDAR_FILES} (set DICE_SDAR_FILES)")


def _expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every weight of a Qwen3-architecture SDAR model and its shape, from the config's numbers alone."""
    hidden, heads, kv, head_dim = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim)
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes.update({
            layer + "input_layernorm.weight": (hidden,), layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            layer + "self_attn.k_proj.weight": (kv * head_dim, hidden),
            layer + "self_attn.v_proj.weight": (kv * head_dim, hidden),
            layer + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            layer + "self_attn.q_norm.weight": (head_dim,), layer + "self_attn.k_norm.weight": (head_dim,),
            layer + "mlp.gate_proj.weight": (config.intermediate_size, hidden),
            layer + "mlp.up_proj.weight": (config.intermediate_size, hidden),
            layer + "mlp.down_proj.weight": (hidden, config.intermediate_size)})
    return shapes


@pytest.mark.parametrize("name", MODELS)
def test_a_model_built_from_the_real_config_has_exactly_the_published_weights(name):
    folder = SDAR_FILES / name
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    config = AutoConfig.from_pretrained(folder)  # model_type "sdar" resolves to ours: no remote code runs
    assert isinstance(config, SDARConfig) and config.block_size == 4 and config.mask_token_id == MASK
    assert config.prediction_shift == 0 and not config.tie_word_embeddings  # SDAR predicts in place, untied head
    with torch.device("meta"):
        model = SDARForCausalLM(config)
    state = model.state_dict()
    assert set(state) == set(index["weight_map"])
    assert {k: tuple(v.shape) for k, v in state.items()} == _expected_shapes(config)
    # The published bf16 files hold exactly these tensors: 2 bytes an element.
    assert sum(2 * v.numel() for v in state.values()) == index["metadata"]["total_size"]


def _tiny_sdar_config(name="SDAR-4B-Chat"):
    """The real config with a tiny shape: SDAR's vocabulary, block size, mask and special ids, untied head."""
    config = AutoConfig.from_pretrained(SDAR_FILES / name)
    for field, value in TINY_SHAPE.items():
        setattr(config, field, value)
    return config


def _sdar_folder(path: Path, seed: int = 0) -> Path:
    """A from_pretrained folder as the DICE release ships one: a (tiny) SDAR model beside the real tokenizer files
    (linked, not copied)."""
    torch.manual_seed(seed)
    SDARForCausalLM(_tiny_sdar_config()).save_pretrained(path)
    for file in (SDAR_FILES / "tokenizer").iterdir():
        (path / file.name).symlink_to(file)
    return path


def test_a_checkpoint_we_save_loads_back_and_carries_sdars_config_fields(tmp_path):
    real = json.loads((SDAR_FILES / "SDAR-4B-Chat" / "config.json").read_text())
    torch.manual_seed(0)
    model = SDARForCausalLM(_tiny_sdar_config())
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "sdar" and saved["architectures"] == ["SDARForCausalLM"]
    assert saved["block_size"] == 4 and saved["mask_token_id"] == MASK
    for field in ("vocab_size", "bos_token_id", "eos_token_id", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
                  "max_position_embeddings", "hidden_act", "attention_bias"):
        assert saved[field] == real[field], field
    assert {k: saved[k] for k in TINY_SHAPE} == TINY_SHAPE
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is SDARForCausalLM and loaded.config.mask_token_id == MASK
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_an_sdar_folder_brings_its_tokenizer_mask_and_chat_template_to_our_prompts_answers_and_stops(tmp_path):
    model, tokenizer = load_base(str(_sdar_folder(tmp_path / "sdar")))
    assert model.config.model_type == "sdar" and model.config.mask_token_id == tokenizer.mask_token_id == MASK
    assert tokenizer.convert_ids_to_tokens(MASK) == "<|MASK|>"
    assert model.get_input_embeddings().num_embeddings == 151936  # nothing added, nothing resized
    assert tokenizer.chat_template == (SDAR_FILES / "tokenizer" / "chat_template.jinja").read_text()

    messages = kernel_generation_messages("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    ids = prompt_ids_for(tokenizer, RLTask("t", messages, ""))
    text = tokenizer.decode(ids)
    assert ids[0] == IM_START and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert text == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # SFT answers end the turn as SDAR's template does (<|im_end|>; its tokenizer's eos is <|endoftext|>), and
    # decoding stops at either, as SDAR's generation config says.
    rows = tokenize_chat_rows(tokenizer, [{"prompt": messages, "response": "```python\nx = 1\n```"}])
    sample = rows.samples[0]
    assert sample.input_ids[-1].item() == IM_END and sample.input_ids[:len(ids)].tolist() == ids
    assert tokenizer.eos_token_id == ENDOFTEXT and stop_token_ids(tokenizer, model)[:2] == [IM_END, ENDOFTEXT]


def test_sft_both_rl_stages_and_evaluation_run_on_a_tiny_sdar_shaped_model_with_the_real_tokenizer(
        tmp_path, pair_factory):
    from dice_pipeline.evaluation.generation import CheckpointGenerator, EvalGenerationSettings
    from dice_pipeline.kernelbench import KernelBenchTask
    from training.stages import run_stage

    base = _sdar_folder(tmp_path / "sdar")
    pairs = [pair_factory(i) for i in range(3)]
    sft_rows = [{"prompt_messages": json.dumps(kernel_generation_messages(p["pytorch_code"])),
                 "response": format_kernel_response(p["generated_code"])} for p in pairs]
    sft = run_stage("sft", str(base), tmp_path / "sft", write_jsonl(sft_rows, tmp_path / "sft.jsonl"),
                    dict(epochs=1, samples_per_step=2, learning_rate=1e-3, save_every=None))
    assert sft["step"] == 2 and sft["prediction_shift"] == 0 and sft["dropped_too_long"] == 0
    assert all(r["loss"] > 0 for r in sft["history"])

    infilling = [{"task_id": f"f{i}", "prompt_messages": json.dumps([{"role": "user", "content": f"Fill {i}."}]),
                  "pytorch_code": p["pytorch_code"], "prefix": "import torch\n", "suffix": "\n", "difficulty": i}
                 for i, p in enumerate(pairs[:2])]
    end_to_end = [{"schedule_position": i, "task_id": f"t{i}", "pytorch_code": p["pytorch_code"], "difficulty": i}
                  for i, p in enumerate(pairs[:2])]
    rl = dict(samples_per_task=2, tasks_per_step=2, steps=1, max_new_tokens=8, learning_rate=1e-4,
              rollout_batch_size=4)
    stage1 = run_stage("rl_infilling", sft["checkpoint"], tmp_path / "rl1",
                       write_jsonl(infilling, tmp_path / "infilling.jsonl"), rl)
    stage2 = run_stage("rl_end_to_end", stage1["checkpoint"], tmp_path / "rl2",
                       write_jsonl(end_to_end, tmp_path / "tasks.jsonl"), rl)
    for result in (stage1, stage2):
        assert result["step"] == 1 and result["history"][0]["samples"] == 4
        assert result["history"][0]["tokens_generated"] > 0

    # Every checkpoint is an SDAR folder: SDAR's config fields, its tokenizer; the evaluation decodes from it.
    final = Path(stage2["checkpoint"])
    saved = json.loads((final / "config.json").read_text())
    assert saved["model_type"] == "sdar" and saved["mask_token_id"] == MASK and saved["vocab_size"] == 151936
    generator = CheckpointGenerator.from_pretrained(str(final), EvalGenerationSettings(max_new_tokens=8,
                                                                                        batch_size=2))
    assert generator.decoding == "block_diffusion" and generator.tokenizer.mask_token_id == MASK
    answers = generator([KernelBenchTask(level=1, problem_id=1, name="1_t", code=pairs[0]["pytorch_code"])], seed=0)
    assert answers[0][0]["usage"]["completion_tokens"] > 0 and answers[0][0]["backend"] == "block_diffusion"
