"""Tokenizers for the block-diffusion models. Random-initialised models get a byte-level BPE trained with
`tokenizers` on our own code corpus (no vocabulary ships offline), with Qwen3's special tokens and chat template;
a loaded checkpoint keeps its own tokenizer and only gains a `<|MASK|>` token (and embedding row) if it lacks one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dice_pipeline.prompts import QWEN3_CHAT_TEMPLATE

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]

# Qwen2/3's split pattern: letters, single digits, punctuation runs, newlines and whitespace runs stay separate, so
# code indentation becomes a few reusable tokens rather than being merged into words.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS_SUFFIXES = {".py", ".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp", ".txt", ".md"}


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """A byte-level BPE over `texts` with the four special tokens at ids 0-3 and the Qwen3 chat template.

    Byte-level means every string encodes (no unknown token) and decodes back exactly."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return wrap_tokenizer(tokenizer)


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """`PreTrainedTokenizerFast` with the chat roles' specials: eos `<|im_end|>` (ends an assistant turn, where
    generation stops), pad `<|endoftext|>`, mask `<|MASK|>`."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
        chat_template=QWEN3_CHAT_TEMPLATE,
        padding_side="left",
    )


def ensure_mask_token(tokenizer, model=None) -> int:
    """The id of `tokenizer`'s mask token, adding `<|MASK|>` first if it has none; a `model` given is resized to
    the new vocabulary and its config's `mask_token_id` set. Returns the mask id."""
    if tokenizer.mask_token is None:
        if MASK in tokenizer.get_vocab():
            tokenizer.mask_token = MASK
        else:
            tokenizer.add_special_tokens({"mask_token": MASK})
    mask_id = tokenizer.mask_token_id
    if model is not None:
        if model.get_input_embeddings().num_embeddings < len(tokenizer):
            # Rows for new tokens start at the mean embedding (a neutral start, not a random outlier).
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        model.config.mask_token_id = mask_id
    return mask_id


def end_of_turn_id(tokenizer) -> int:
    """The token that closes an assistant turn, which SFT appends to every answer: `<|im_end|>` where the chat
    template is ChatML's (ours, SmolLM2's, Qwen's, SDAR's), else the tokenizer's eos. SDAR's tokenizer names
    `<|endoftext|>` as eos, but its chat template and generation config end a turn with `<|im_end|>`."""
    vocab = tokenizer.get_vocab()
    return vocab[IM_END] if IM_END in vocab else tokenizer.eos_token_id


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Where decoding stops: the end of turn, the tokenizer's eos and the eos ids of the model's generation config
    (SDAR's: `<|im_end|>` and `<|endoftext|>`), in that order, each once."""
    ids = [end_of_turn_id(tokenizer), tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += [configured] if isinstance(configured, int) else list(configured or [])
    return list(dict.fromkeys(i for i in ids if i is not None))


def iter_corpus_texts(paths: Iterable[str | Path]) -> Iterator[str]:
    """Texts of a code corpus: source files (recursively under directories), and the string fields of JSON/JSONL
    records (KernelBench task files, ConCuR-style seed corpora). Unreadable files raise, not vanish."""
    for root in map(Path, paths):
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            if path.suffix == ".jsonl":
                for line in path.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        yield from _string_fields(json.loads(line))
            elif path.suffix == ".json":
                yield from _string_fields(json.loads(path.read_text(encoding="utf-8")))
            elif path.suffix in _CORPUS_SUFFIXES:
                yield path.read_text(encoding="utf-8", errors="replace")
            elif not root.is_dir():
                raise ValueError(f"{path}: not a corpus file (expected .jsonl, .json or one of {sorted(_CORPUS_SUFFIXES)})")


def _string_fields(record) -> Iterator[str]:
    if isinstance(record, str):
        yield record
    elif isinstance(record, dict):
        for value in record.values():
            yield from _string_fields(value)
    elif isinstance(record, list):
        for value in record:
            yield from _string_fields(value)
