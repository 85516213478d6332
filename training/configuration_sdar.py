"""Configuration of the block-diffusion LM: a Qwen3 config plus the two keys SDAR checkpoints add (`block_size`,
`mask_token_id`), size presets, and conversion of a Llama, Qwen2 or Qwen3 config so an autoregressive model can be
turned into a block-diffusion one (SDAR's recipe: keep the weights, continue training with the block-diffusion
objective).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

# Qwen3's tokenizer appends <|MASK|> at this id in the published SDAR checkpoints (NOTES §4).
SDAR_MASK_TOKEN_ID = 151669


class SDARConfig(PretrainedConfig):
    """Qwen3 fields + `block_size` (tokens decoded together) + `mask_token_id` (the noise token).

    `use_qk_norm=False` describes a Llama-architecture model (no per-head RMSNorm on queries and keys), which is
    the only difference that matters between the two families for this module. `qkv_bias=True` describes Qwen2
    (a bias on the query, key and value projections, none on the output one, no qk-norm); `attention_bias` keeps
    its Llama meaning, a bias on all four.

    `prediction_shift` says where a masked token is predicted: 0 = at its own position (SDAR and DICE, and the
    default for their configs, which lack the field), 1 = from the hidden state one position earlier (Dream,
    Fast-dLLM v2: what an autoregressive head already does, so a converted model starts from its predictions).
    The loss, the decoders and the RL replay read it through training.blocks.
    """

    model_type = "sdar"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1_000_000.0,
        attention_bias: bool = False,
        qkv_bias: bool = False,
        mlp_bias: bool = False,
        use_qk_norm: bool = True,
        tie_word_embeddings: bool = True,
        block_size: int = 4,
        mask_token_id: int = SDAR_MASK_TOKEN_ID,
        prediction_shift: int = 0,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        # Published configs carry `rope_scaling: null` (and v5 configs `rope_parameters`); only plain RoPE is
        # implemented, so anything else is refused rather than silently computed wrongly.
        rope_scaling = kwargs.pop("rope_scaling", None)
        rope_parameters = kwargs.pop("rope_parameters", None) or {}
        for scaling in (rope_scaling, rope_parameters):
            if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
                raise ValueError(f"only default RoPE is supported, got rope scaling {scaling}")
        rope_theta = float(rope_parameters.get("rope_theta", rope_theta))
        if hidden_act != "silu":
            raise ValueError(f"only the SiLU-gated MLP of Qwen3/Llama is implemented, got hidden_act={hidden_act!r}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if prediction_shift not in (0, 1):
            raise ValueError(f"prediction_shift must be 0 (in place, SDAR) or 1 (shifted, Dream), "
                             f"got {prediction_shift}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.attention_bias = attention_bias
        self.qkv_bias = qkv_bias
        self.mlp_bias = mlp_bias
        self.use_qk_norm = use_qk_norm
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.prediction_shift = prediction_shift
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )


# Shapes of the Qwen3 models SDAR/DICE start from (hub config.json files); `tiny` and `small` are for CPU tests
# and short GPU demos with our own BPE tokenizer (vocab set by the caller).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, vocab_size=8192, max_position_embeddings=4096),
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}


def preset_config(name: str, **overrides: Any) -> SDARConfig:
    """An `SDARConfig` of a named size; `overrides` (e.g. `vocab_size`, `mask_token_id`) win over the preset.

    Without an explicit `mask_token_id`, a vocabulary too small for SDAR's id uses its last id as the mask."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    fields = {**PRESETS[name], **overrides}
    vocab_size = fields.get("vocab_size", SDARConfig().vocab_size)
    if "mask_token_id" not in fields and vocab_size <= SDAR_MASK_TOKEN_ID:
        fields["mask_token_id"] = vocab_size - 1
    return SDARConfig(**fields)


def sdar_config_from(config: PretrainedConfig, block_size: int = 4, mask_token_id: int | None = None,
                     prediction_shift: int | None = None) -> SDARConfig:
    """The `SDARConfig` describing an existing Llama, Qwen2 or Qwen3 (or SDAR) config, for converting its weights.

    The weight names of all four families are the same, so the converted model loads the original state dict.
    `prediction_shift` defaults to the config's own (0 for SDAR configs without the field) for an SDAR config and
    to 1 for an autoregressive one: a conversion keeps the next-token head's alignment (see SDARConfig).
    """
    family = getattr(config, "model_type", None)
    if family not in ("llama", "qwen2", "qwen3", "sdar"):
        raise ValueError(f"can convert llama, qwen2, qwen3 or sdar configs, got model_type={family!r}")
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in (getattr(config, "layer_types", None)
                                                                                 or ()):
        raise ValueError("sliding-window attention is not implemented; only configs with full attention convert")
    rope_parameters = getattr(config, "rope_parameters", None) or {}
    rope_theta = rope_parameters.get("rope_theta", getattr(config, "rope_theta", 10_000.0))
    if mask_token_id is None:
        mask_token_id = getattr(config, "mask_token_id", None)
    if mask_token_id is None:
        raise ValueError("mask_token_id is required: add a mask token to the tokenizer first (training.tokenizer)")
    if prediction_shift is None:
        prediction_shift = getattr(config, "prediction_shift", 0) if family == "sdar" else 1
    return SDARConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=getattr(config, "num_key_value_heads", None),
        head_dim=getattr(config, "head_dim", None),
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=rope_theta,
        rope_parameters=rope_parameters or None,
        attention_bias=getattr(config, "attention_bias", False),
        # Qwen2's attention has q/k/v biases whatever its config says (transformers hard-codes them).
        qkv_bias=family == "qwen2" or getattr(config, "qkv_bias", False),
        mlp_bias=getattr(config, "mlp_bias", False),
        use_qk_norm=family not in ("llama", "qwen2") and getattr(config, "use_qk_norm", True),
        tie_word_embeddings=getattr(config, "tie_word_embeddings", False),
        block_size=block_size,
        mask_token_id=mask_token_id,
        prediction_shift=prediction_shift,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
