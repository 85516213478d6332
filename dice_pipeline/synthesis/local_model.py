"""Generator backend for a local checkpoint: any `transformers` causal LM decoded autoregressively with
`model.generate`, or the project's block-diffusion model (training/, `model_type: "sdar"`) decoded with its
semi-autoregressive block sampler. The prompt is the KernelBench one-shot prompt in the tokenizer's chat template.
torch and transformers are imported here only, so the package stays importable without them.
"""

from __future__ import annotations

import time
from typing import Any

from dice_pipeline.synthesis.candidates import GeneratedCandidate, check_sample_count

DECODINGS = ("autoregressive", "block_diffusion")


class TransformersGenerator:
    """`KernelGenerator` over a loaded model + tokenizer. `decoding="block_diffusion"` uses
    `training.generate.block_diffusion_generate` (needs a model with `config.block_size` and `mask_token_id`)."""

    def __init__(self, model, tokenizer, *, model_name: str = "", decoding: str = "autoregressive",
                 max_new_tokens: int = 4096, temperature: float = 1.0, top_p: float = 0.95, top_k: int = 0,
                 block_diffusion_options: dict[str, Any] | None = None, messages_fn=None, extract_fn=None):
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {decoding!r}")
        if decoding == "block_diffusion":
            missing = [k for k in ("block_size", "mask_token_id") if getattr(model.config, k, None) is None]
            if missing:
                raise ValueError(f"block_diffusion decoding needs a model config with {missing}")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; the kernel prompt is a chat")
        if messages_fn is None or extract_fn is None:
            from dice_pipeline import prompts

            messages_fn = messages_fn or prompts.kernel_generation_messages
            extract_fn = extract_fn or prompts.extract_code_block
        self.model = model
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.backend = "block_diffusion" if decoding == "block_diffusion" else "transformers"
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.block_diffusion_options = dict(block_diffusion_options or {})
        self._messages_fn = messages_fn
        self._extract_fn = extract_fn

    @classmethod
    def from_pretrained(cls, path: str, *, device: str | None = None, dtype: str = "auto", **kwargs: Any):
        """Load a checkpoint directory (an SDAR/DICE directory resolves through training's registration)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            import training.modeling_sdar  # noqa: F401 - registers model_type "sdar" with the Auto classes
        except ImportError:
            pass  # a plain transformers checkpoint needs no registration
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        if kwargs.get("decoding") is None and getattr(model.config, "model_type", "") == "sdar":
            kwargs["decoding"] = "block_diffusion"
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return cls(model, tokenizer, model_name=kwargs.pop("model_name", path), **kwargs)

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _eos_ids(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None) if hasattr(self.model, "generation_config") else None
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    def generate(self, task_pytorch_code: str, n: int, *, seed: int = 0) -> list[GeneratedCandidate]:
        """n samples in one batch; `seed` fixes the whole batch (the same seed and n give the same samples)."""
        check_sample_count(n)
        messages = self._messages_fn(task_pytorch_code)
        prompt_ids = self._prompt_ids(messages)
        device = next(self.model.parameters()).device
        eos_ids = self._eos_ids()
        started = time.perf_counter()
        if self.decoding == "block_diffusion":
            sequences, lengths = self._block_diffusion(prompt_ids, n, seed, eos_ids, device)
        else:
            sequences, lengths = self._autoregressive(prompt_ids, n, seed, eos_ids, device)
        latency = (time.perf_counter() - started) / n  # a batch: each sample's share
        candidates = []
        for index in range(n):
            tokens = sequences[index][: lengths[index]]
            stopped = bool(tokens) and tokens[-1] in eos_ids
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            candidates.append(
                GeneratedCandidate(
                    text=text,
                    code=self._extract_fn(text),
                    backend=self.backend,
                    model=self.model_name,
                    prompt_messages=messages,
                    finish_reason="stop" if stopped else "length",
                    latency_s=latency,
                    sample_index=index,
                    seed=seed,
                    usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens)},
                    variant=self._settings(),
                )
            )
        return candidates

    def _settings(self) -> dict[str, Any]:
        settings = {"decoding": self.decoding, "temperature": self.temperature, "top_p": self.top_p,
                    "top_k": self.top_k, "max_new_tokens": self.max_new_tokens}
        if self.decoding == "block_diffusion":
            settings.update(self.block_diffusion_options)
        return settings

    def _autoregressive(self, prompt_ids, n, seed, eos_ids, device):
        import torch

        torch.manual_seed(seed)
        input_ids = torch.tensor([prompt_ids] * n, dtype=torch.long, device=device)
        sampling = self.temperature > 0
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        kwargs: dict[str, Any] = {"do_sample": sampling, "max_new_tokens": self.max_new_tokens, "pad_token_id": pad_id,
                                  "attention_mask": torch.ones_like(input_ids)}
        if eos_ids:
            kwargs["eos_token_id"] = eos_ids
        if sampling:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None)
        with torch.no_grad():
            output = self.model.generate(input_ids, **kwargs)
        new_tokens = output[:, input_ids.shape[1]:].tolist()
        lengths = []
        for row in new_tokens:
            end = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
            lengths.append(end)
        return new_tokens, lengths

    def _block_diffusion(self, prompt_ids, n, seed, eos_ids, device):
        import torch
        from training.generate import block_diffusion_generate

        generator = torch.Generator(device=device).manual_seed(seed)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        options = {"strategy": "dynamic", "confidence_threshold": 0.9, **self.block_diffusion_options}
        result = block_diffusion_generate(
            self.model, [prompt_ids] * n, self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, eos_token_id=eos_ids or None, pad_token_id=pad_id, generator=generator, **options,
        )
        return result.tokens.tolist(), result.lengths.tolist()
