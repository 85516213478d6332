"""Block-diffusion language model (SDAR-compatible): config and model, tokenizer, training objective, SFT and
semi-autoregressive decoding. GPU-side code: imports torch, transformers and the standard library only.
"""

from training.configuration_sdar import PRESETS, SDARConfig, preset_config, sdar_config_from
from training.modeling_sdar import KVCache, SDARForCausalLM, SDARModel, register_sdar

__all__ = ["PRESETS", "SDARConfig", "preset_config", "sdar_config_from", "KVCache", "SDARForCausalLM", "SDARModel",
           "register_sdar"]
