"""The block-diffusion language model in one file: a Qwen3/Qwen2/Llama decoder (same parameter names as the
published SDAR/DICE checkpoints, so `from_pretrained(dir)` loads them with no remote code) whose attention takes
whatever mask the caller builds: a dense boolean mask (CPU, SDPA), a flex-attention `BlockMask` (GPU training) or
plain causal. Block diffusion lives in the masks and the loss (training/diffusion.py) and in the decoder
(training/generate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from training.configuration_sdar import SDARConfig

try:  # flex_attention exists from torch 2.5; the dense path needs nothing from it.
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - older torch
    BlockMask, flex_attention = None, None

_compiled_flex_attention: dict = {}  # torch.compile mode -> compiled flex_attention
_flex_compile_mode: str | None = None


def set_flex_compile_mode(mode: str | None) -> None:
    """torch.compile mode for flex attention on the GPU: None (default kernels) or e.g.
    "max-autotune-no-cudagraphs" (benchmarks flex's kernel configurations for each shape at its first call: slower
    to start, often faster per step). Each mode is compiled once per process."""
    global _flex_compile_mode
    _flex_compile_mode = mode


def _flex_attention(q, k, v, block_mask):
    """flex_attention, compiled on GPU (uncompiled it materialises the full score matrix); eager on CPU, where it
    only serves to check the GPU path's maths against the dense mask."""
    if q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    if _flex_compile_mode not in _compiled_flex_attention:
        _compiled_flex_attention[_flex_compile_mode] = torch.compile(flex_attention, dynamic=False,
                                                                     mode=_flex_compile_mode)
    return _compiled_flex_attention[_flex_compile_mode](q, k, v, block_mask=block_mask, enable_gqa=True)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Scaled dot-product attention of q [B, H, Q, D] over k, v [B, Hkv, K, D] under any supported mask."""
    if BlockMask is not None and isinstance(mask, BlockMask):
        return _flex_attention(q, k, v, mask)
    if mask is None:
        if q.shape[-2] != k.shape[-2]:
            raise ValueError("a causal mask over a KV cache needs an explicit mask (the query is offset)")
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if mask.dtype != torch.bool:
        raise TypeError(f"dense attention masks must be bool (True = attend), got {mask.dtype}")
    if q.is_cuda and q.shape[1] != k.shape[1]:
        # Expanded kv heads keep a masked call eligible for the memory-efficient kernel (GQA + mask may fall
        # back to the math kernel, which materialises the scores).
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as Qwen3/Llama do, so bf16 checkpoints give the reference numbers.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables [B, T, head_dim] for RoPE at the given positions (computed on the fly: no buffers to save,
    nothing left uninitialised when weights load on the meta device)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    freqs = position_ids.float()[..., None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class KVCache:
    """Preallocated keys/values per layer, [B, Hkv, max_length, D]. A forward writes its tokens' keys/values at
    `start` and attends over everything up to its end; which of those keys a query may see is the mask's job, so
    the decoder can overwrite a block's provisional (noisy) keys with its final ones by simply writing again.

    `start` may also be a tensor of the positions written, [Q] shared by every row or [B, Q] one set a row (rows
    decoding different blocks): then the forward attends over the whole cache (its mask hides what is not written
    yet), so every decoding step has the same shapes and can be a CUDA graph."""

    def __init__(self, config: SDARConfig, batch_size: int, max_length: int, device, dtype) -> None:
        shape = (batch_size, config.num_key_value_heads, max_length, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.max_length = max_length

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor):
        if isinstance(start, torch.Tensor):
            if start.dim() == 1:
                self.keys[layer].index_copy_(2, start, k)
                self.values[layer].index_copy_(2, start, v)
            else:
                index = start[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
                self.keys[layer].scatter_(2, index, k)
                self.values[layer].scatter_(2, index, v)
            return self.keys[layer], self.values[layer]
        end = start + k.shape[-2]
        if end > self.max_length:
            raise ValueError(f"KV cache of length {self.max_length} cannot hold positions up to {end}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class Attention(nn.Module):
    def __init__(self, config: SDARConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        # Llama's `attention_bias` puts a bias on all four projections; Qwen2 (`qkv_bias`) on q, k and v only.
        qkv_bias = config.attention_bias or config.qkv_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_bias)
        # Qwen3 normalises each head's queries and keys before RoPE; Llama does not.
        if config.use_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache: KVCache | None, cache_start) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        # Under autocast the norms and RoPE tables promote q/k to float32; attention runs in the projections' dtype.
        q = apply_rotary(q.transpose(1, 2), cos, sin).to(v.dtype)
        k = apply_rotary(k.transpose(1, 2), cos, sin).to(v.dtype)
        if cache is not None:
            k, v = cache.write(self.layer_index, k, v, cache_start)
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: SDARConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: SDARConfig, layer_index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, cache_start):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, cache_start)
        return x + self.mlp(self.post_attention_layernorm(x))


class SDARPreTrainedModel(PreTrainedModel):
    config_class = SDARConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]
    # Published SDAR configs say `attn_implementation: flex_attention`; transformers refuses a model that does not
    # declare it. Attention here dispatches on the mask it is given (dense -> SDPA, BlockMask -> flex), so both hold.
    _supports_flex_attn = True
    _supports_sdpa = True
    # Weights are initialised by PreTrainedModel._init_weights (normal Linear/Embedding, ones for RMSNorm).


@dataclass
class ModelOutput:
    last_hidden_state: torch.Tensor


class SDARModel(SDARPreTrainedModel):
    """The decoder stack; returns the final normalised hidden states (the LM head is applied by the caller, so the
    training loss can project only the positions it scores)."""

    def __init__(self, config: SDARConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, attention_mask=None,
                cache: KVCache | None = None, cache_start: int | torch.Tensor = 0) -> ModelOutput:
        batch, length = input_ids.shape
        if position_ids is None:  # positions follow the cache slot written (a tensor: the slots themselves)
            position_ids = (cache_start if isinstance(cache_start, torch.Tensor) else
                            torch.arange(cache_start, cache_start + length, device=input_ids.device)).expand(batch, -1)
        mask = _as_attention_mask(attention_mask, length, cache_start)
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, None, 0, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, cache, cache_start)
        return ModelOutput(last_hidden_state=self.norm(x))


def _as_attention_mask(attention_mask, length: int, cache_start: int):
    """Accept HF's 2D padding mask [B, K] (1 = real token) too, turning it into a causal 4D bool mask."""
    if attention_mask is None and not isinstance(cache_start, torch.Tensor) and cache_start > 0:
        attention_mask = torch.ones(1, cache_start + length, dtype=torch.bool)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        keys = attention_mask.shape[1]
        query_pos = torch.arange(keys - length, keys, device=attention_mask.device)
        causal = torch.arange(keys, device=attention_mask.device)[None, :] <= query_pos[:, None]
        # A query always sees itself, so left-padding rows never produce an all-masked (NaN) softmax.
        diagonal = torch.arange(keys, device=attention_mask.device)[None, :] == query_pos[:, None]
        return ((causal & attention_mask.bool()[:, None, None, :]) | diagonal)
    return attention_mask


class SDARForCausalLM(SDARPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: SDARConfig) -> None:
        super().__init__(config)
        self.model = SDARModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(self, input_ids: torch.Tensor, attention_mask=None, position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None, cache_start: int | torch.Tensor = 0, logits_to_keep: int = 0,
                logits_at: torch.Tensor | None = None, **unused) -> CausalLMOutputWithPast:
        """Logits for every position (or the last `logits_to_keep`), position i's from position i's hidden state.
        Which token they predict is the config's `prediction_shift`: i's own (0, SDAR) or i + 1's (1, converted
        autoregressive models); callers align them through training.blocks.

        `logits_at` (flat indices into the [B * T] positions) projects only those positions: logits [N, V]. The
        losses use it so the LM head never sees unscored positions, and so every training forward is one call of
        this module (FSDP gathers the root's weights, head included, in this module's forward hook)."""
        hidden = self.model(input_ids, position_ids, attention_mask, cache, cache_start).last_hidden_state
        if logits_at is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, logits_at)
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))


def register_sdar() -> None:
    """Make `AutoConfig`/`AutoModel(ForCausalLM).from_pretrained(dir)` resolve `model_type: "sdar"` to this
    module (published SDAR configs point at remote code instead; we never run it)."""
    try:
        AutoConfig.register("sdar", SDARConfig)
    except ValueError:  # already registered in this process
        pass
    for auto_class, model_class in ((AutoModel, SDARModel), (AutoModelForCausalLM, SDARForCausalLM)):
        try:
            auto_class.register(SDARConfig, model_class)
        except ValueError:
            pass


register_sdar()
