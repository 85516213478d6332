"""One constructor for the generator backends, shared by the `KernelGeneratorResource` and `dice synthesize`."""

from __future__ import annotations

from dice_pipeline.synthesis.candidates import KernelGenerator

BACKENDS = ("templates", "openai", "checkpoint")


def make_generator(backend: str = "templates", *, base_url: str = "", model: str = "", api_key: str = "",
                   temperature: float = 1.0, top_p: float = 0.95, max_tokens: int = 4096,
                   requests_per_minute: float = 60.0, response_cache_dir: str = "",
                   checkpoint_path: str = "") -> KernelGenerator:
    """`templates`: the team's CUDA templates (offline). `openai`: an OpenAI-compatible chat endpoint (empty
    base_url/model fall back to DICE_GENERATOR_BASE_URL / _MODEL). `checkpoint`: a local transformers or
    block-diffusion checkpoint directory."""
    if backend == "templates":
        from dice_pipeline.synthesis.templates import TemplateGenerator

        return TemplateGenerator()
    if backend == "openai":
        from dice_pipeline.paths import cache_dir
        from dice_pipeline.synthesis.openai_compatible import OpenAICompatibleConfig, OpenAICompatibleGenerator

        config = OpenAICompatibleConfig.from_env(
            base_url=base_url, model=model, api_key=api_key, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, requests_per_minute=requests_per_minute,
            cache_dir=response_cache_dir or str(cache_dir() / "generator_responses"),
        )
        return OpenAICompatibleGenerator(config)
    if backend == "checkpoint":
        if not checkpoint_path:
            raise ValueError("backend=checkpoint needs checkpoint_path")
        from dice_pipeline.synthesis.local_model import TransformersGenerator

        return TransformersGenerator.from_pretrained(checkpoint_path, max_new_tokens=max_tokens,
                                                     temperature=temperature, top_p=top_p)
    raise ValueError(f"unknown generator backend {backend!r}; use one of {', '.join(BACKENDS)}")
