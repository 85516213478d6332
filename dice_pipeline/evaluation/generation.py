"""Answers for evaluation with the paper's protocol: the KernelBench one-shot prompt in the model's chat template,
one greedy sample, block-diffusion decoding with block 4 and 4 steps (static unmasking), 4096 new tokens, the
answer's code block extracted. Checkpoints are decoded in batches of tasks; any `transformers` causal LM and any
OpenAI-compatible endpoint serve as comparison rows. pass@k: k samples at a temperature.
torch/transformers are imported inside the functions that need them (GPU hosts have them; the rest need not).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dice_pipeline.kernelbench import KernelBenchTask
from dice_pipeline.prompts import extract_code_block, kernel_generation_messages

DECODINGS = ("auto", "block_diffusion", "autoregressive")


@dataclass
class EvalGenerationSettings:
    """Defaults are the paper's evaluation protocol (NOTES.md section 1)."""

    decoding: str = "auto"  # auto: block_diffusion for a model with block_size + mask_token_id, else autoregressive
    block_size: int = 4
    steps: int = 4
    # the paper's "static decoding"; "dynamic" also commits every token more confident than `confidence_threshold`
    strategy: str = "static"
    confidence_threshold: float = 0.9
    max_new_tokens: int = 4096
    samples: int = 1  # k for pass@k; > 1 needs temperature > 0 to differ
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 16  # tasks decoded together (x samples each)
    dtype: str = "bfloat16"  # on CUDA; the CPU runs float32

    def __post_init__(self) -> None:
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {self.decoding!r}")
        if self.samples < 1:
            raise ValueError("samples must be >= 1")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError("pass@k with samples > 1 needs temperature > 0 (greedy samples are identical)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _token_bar(total: int):
    """A progress bar of the answer tokens a batch has committed (at most `total`: rows stopping early end short of
    it), shown only on a terminal: on a CPU a batch can take minutes, and the task bar moves once it is done."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with transformers; without it, no bar
        import contextlib

        return contextlib.nullcontext(type("NoBar", (), {"update": staticmethod(lambda n: None)})())
    return tqdm(total=total, desc="tokens of this batch", unit="tok", leave=False, disable=None)


def _sample_dict(text: str, *, backend: str, model: str, finish_reason: str, latency_s: float,
                 usage: dict[str, Any], settings: dict[str, Any], sample_index: int) -> dict[str, Any]:
    return {"text": text, "code": extract_code_block(text), "backend": backend, "model": model,
            "finish_reason": finish_reason, "latency_s": latency_s, "usage": usage, "settings": settings,
            "sample_index": sample_index}


class CheckpointGenerator:
    """A loaded model + tokenizer: block-diffusion checkpoints (ours, SDAR) through training.generate's block
    sampler, any other causal LM through `model.generate`. Call it with (tasks, seed)."""

    def __init__(self, model, tokenizer, settings: EvalGenerationSettings | None = None, model_name: str = ""):
        self.model, self.tokenizer = model, tokenizer
        self.settings = settings or EvalGenerationSettings()
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; the KernelBench prompt is a chat")
        decoding = self.settings.decoding
        if decoding == "auto":
            has_bd = all(getattr(model.config, k, None) is not None for k in ("block_size", "mask_token_id"))
            decoding = "block_diffusion" if has_bd else "autoregressive"
        self.decoding = decoding
        self.backend = "block_diffusion" if decoding == "block_diffusion" else "transformers"
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__

    @classmethod
    def from_pretrained(cls, path: str, settings: EvalGenerationSettings | None = None, device: str | None = None):
        """Any `from_pretrained` directory; SDAR/DICE checkpoints resolve through training's registration, and a
        plain causal LM can be decoded as a block-diffusion model by `decoding="block_diffusion"` (converted)."""
        import torch

        settings = settings or EvalGenerationSettings()
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, settings.dtype) if device.startswith("cuda") else torch.float32
        if settings.decoding == "block_diffusion" or settings.decoding == "auto" and _is_sdar(path):
            from training.convert import load_pretrained_as_block_diffusion

            model, tokenizer = load_pretrained_as_block_diffusion(path, block_size=settings.block_size, dtype=dtype)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model.to(device).eval(), tokenizer, settings, model_name=str(path))

    def _eos_ids(self) -> list[int]:
        from training.tokenizer import stop_token_ids  # the stops training's rollouts use

        return stop_token_ids(self.tokenizer, self.model)

    def _prompt_ids(self, task: KernelBenchTask) -> list[int]:
        text = self.tokenizer.apply_chat_template(kernel_generation_messages(task.code), tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __call__(self, tasks: Sequence[KernelBenchTask], seed: int) -> list[list[dict[str, Any]]]:
        import torch

        s = self.settings
        prompts = [self._prompt_ids(task) for task in tasks for _ in range(s.samples)]
        device = next(self.model.parameters()).device
        eos_ids = self._eos_ids()
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        generator = torch.Generator(device=device).manual_seed(seed)
        started = time.perf_counter()
        with torch.no_grad():
            if self.decoding == "block_diffusion":
                from training.generate import block_diffusion_generate

                with _token_bar(len(prompts) * s.max_new_tokens) as bar:
                    result = block_diffusion_generate(
                        self.model, prompts, s.max_new_tokens, block_size=s.block_size, steps=s.steps,
                        strategy=s.strategy, confidence_threshold=s.confidence_threshold,
                        temperature=s.temperature, top_p=s.top_p, eos_token_id=eos_ids or None, pad_token_id=pad_id,
                        generator=generator, progress=bar.update)
                rows, lengths = result.tokens.tolist(), result.lengths.tolist()
            else:
                rows, lengths = self._hf_generate(prompts, eos_ids, pad_id, seed)
        latency = (time.perf_counter() - started) / max(1, len(prompts))
        settings = {**s.to_dict(), "decoding": self.decoding}
        answers: list[list[dict[str, Any]]] = []
        for t, _task in enumerate(tasks):
            task_samples = []
            for k in range(s.samples):
                index = t * s.samples + k
                tokens = rows[index][: lengths[index]]
                stopped = bool(tokens) and tokens[-1] in eos_ids
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                task_samples.append(_sample_dict(
                    text, backend=self.backend, model=self.model_name, finish_reason="stop" if stopped else "length",
                    latency_s=latency, usage={"prompt_tokens": len(prompts[index]), "completion_tokens": len(tokens)},
                    settings=settings, sample_index=k))
            answers.append(task_samples)
        return answers

    def _hf_generate(self, prompts, eos_ids, pad_id, seed):
        import torch

        s = self.settings
        torch.manual_seed(seed)
        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "pad_token_id": pad_id, "attention_mask": mask,
                                  "do_sample": s.temperature > 0}
        if eos_ids:
            kwargs["eos_token_id"] = eos_ids
        if s.temperature > 0:
            kwargs.update(temperature=s.temperature, top_p=s.top_p)
        output = self.model.generate(ids, **kwargs)[:, width:].tolist()
        lengths = [next((i + 1 for i, tok in enumerate(row) if tok in eos_ids), len(row)) for row in output]
        return output, lengths


def _is_sdar(path: str) -> bool:
    import json
    from pathlib import Path

    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == "sdar"
    except (OSError, ValueError):
        return False


class EndpointGenerator:
    """An OpenAI-compatible chat endpoint as a comparison row (dice_pipeline/synthesis/openai_compatible.py: rate
    limit, retries and a response cache). One request per sample; temperature 0 for the greedy protocol."""

    def __init__(self, generator, settings: EvalGenerationSettings | None = None):
        self.inner = generator
        self.settings = settings or EvalGenerationSettings()
        self.backend = "openai_compatible"
        self.model_name = generator.model_name

    def __call__(self, tasks: Sequence[KernelBenchTask], seed: int) -> list[list[dict[str, Any]]]:
        answers = []
        for task in tasks:
            candidates = self.inner.generate(task.code, self.settings.samples, seed=seed)
            answers.append([_sample_dict(c.text, backend=self.backend, model=c.model, finish_reason=c.finish_reason,
                                         latency_s=c.latency_s, usage=c.usage, settings=self.settings.to_dict(),
                                         sample_index=c.sample_index) for c in candidates])
        return answers


def endpoint_generator(base_url: str, model: str, settings: EvalGenerationSettings | None = None, *,
                       api_key: str = "", cache_dir: str = "", requests_per_minute: float = 60.0) -> EndpointGenerator:
    from dice_pipeline.synthesis.openai_compatible import OpenAICompatibleConfig, OpenAICompatibleGenerator

    settings = settings or EvalGenerationSettings()
    overrides = {"cache_dir": cache_dir} if cache_dir else {}
    config = OpenAICompatibleConfig.from_env(base_url=base_url, model=model, api_key=api_key,
                                             temperature=settings.temperature, top_p=settings.top_p,
                                             max_tokens=settings.max_new_tokens,
                                             requests_per_minute=requests_per_minute, **overrides)
    return EndpointGenerator(OpenAICompatibleGenerator(config), settings)
