"""Block-diffusion training, readable top to bottom: the one loop behind SDAR's conversion step (plain code, every
token scored; training/convert.py) and SFT (chat rows: the prompt given, the response scored). Samples are noised and
packed (training/diffusion.py), trained with AdamW after a linear warm-up, checkpointed in the one format of
training/checkpoints.py and resumable with the same data order and noise; under `torchrun` each rank trains its
share of every global batch, the model replicated (DDP) or sharded (FSDP2, training/parallel.py).

Rows longer than `max_length` are dropped, never cut (DICE's `truncate_mode: drop`: a cut answer teaches code blocks
that never close); `max_length` is chosen from the data when not given.

Learning rate and Adam betas (`SFT_RECIPES`). The paper's recipe (`dice_8b`: lr 1e-5 constant after 3 % warm-up,
3 epochs; LLaMA-Factory's AdamW, i.e. Hugging Face's betas (0.9, 0.999)) is for an 8B model that already predicts
in SDAR's way. Our models are 135M-500M and, converted from autoregressive ones, still re-learning their objective,
so the default (`small`) is: lr 1e-4, ten times the paper's, the rate our SmolLM2-135M conversions trained at
stably (2026-12-04, benchmarks/RESULTS.md: held-out loss 8.50 -> 1.74 in 711 steps), since a run here has a few
hundred steps, not the paper's three epochs of 6,303 samples; betas (0.9, 0.95), the usual choice when pretraining
models of this size, whose second-moment estimate forgets in ~20 steps rather than ~1000, so step sizes follow the
gradients of the new objective rather than the old one's; and a cosine decay to a tenth after warm-up (time-boxed
runs end on small steps). Not yet measured against the paper's recipe on our data: the GPU run
(benchmarks/train_pipeline_gpu.py --sft-recipe dice_8b) is how to compare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from training.blocks import prediction_shift
from training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from training.data import as_messages, chat_prompt, read_rows, training_texts
from training.diffusion import (BlockDiffusionBatch, NoisySegment, TokenizedSample, block_diffusion_loss,
                                build_attention_mask, noise_sample, pack_segments)
from training.distributed import Processes
from training.modeling_sdar import set_flex_compile_mode
from training.parallel import ParallelSettings, autocast, clip_gradients, prepare_model
from training.tokenizer import end_of_turn_id

DICE_MAX_LENGTH = 6144  # tokens of prompt + response (the paper's cutoff)

SFT_RECIPES: dict[str, dict] = {
    "small": {},  # SFTConfig's defaults (see the module docstring)
    "dice_8b": dict(learning_rate=1e-5, adam_betas=(0.9, 0.999), warmup_ratio=0.03, final_lr_ratio=1.0, epochs=3),
}


# ----------------------------------------------------------------------------------------------------------- data
@dataclass
class SkippedRow:
    row: int
    reason: str  # "too_long" or "empty_response"
    message: str


@dataclass
class TokenizedRows:
    samples: list[TokenizedSample]
    max_length: int  # the cap applied: given, or chosen from the data
    skipped: list[SkippedRow] = field(default_factory=list)

    def skipped_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.skipped:
            counts[row.reason] = counts.get(row.reason, 0) + 1
        return counts


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tokenize_chat_rows(tokenizer, rows: Iterable[dict], max_length: int | None = None,
                       max_length_cap: int = DICE_MAX_LENGTH, block_size: int = 4) -> TokenizedRows:
    """`rows` have `prompt` (a user string or a list of chat messages) and `response`; the answer is the response
    plus the end-of-turn token. Rows longer than `max_length` tokens (prompt + answer) are dropped with reason
    `too_long`; without `max_length` it is the longest row rounded up to a whole block, at most `max_length_cap`."""
    eos = end_of_turn_id(tokenizer)
    encoded, skipped = [], []
    for index, row in enumerate(rows):
        response = row.get("response")
        if not isinstance(response, str) or not response.strip():
            skipped.append(SkippedRow(index, "empty_response", "response is missing or blank"))
            continue
        prompt_text = tokenizer.apply_chat_template(as_messages(row["prompt"]), tokenize=False,
                                                    add_generation_prompt=True)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        encoded.append((index, prompt_ids, answer_ids))
    if max_length is None:
        longest = max((len(p) + len(a) for _, p, a in encoded), default=block_size)
        max_length = min(max_length_cap, round_up(longest, block_size))
    samples = []
    for index, prompt_ids, answer_ids in encoded:
        if len(prompt_ids) + len(answer_ids) > max_length:
            skipped.append(SkippedRow(index, "too_long", f"{len(prompt_ids)} prompt + {len(answer_ids)} answer "
                                                         f"tokens, max_length is {max_length}: dropped, not cut"))
            continue
        ids = torch.tensor(prompt_ids + answer_ids, dtype=torch.long)
        samples.append(TokenizedSample(ids, torch.arange(ids.numel()) >= len(prompt_ids)))
    skipped.sort(key=lambda s: s.row)
    return TokenizedRows(samples, max_length, skipped)


def text_windows(tokenizer, texts: Iterable[str], window: int) -> list[TokenizedSample]:
    """Continued-training samples: the texts joined by end-of-text and cut into `window`-token pieces, every token
    scored (how SDAR converts a pretrained autoregressive model)."""
    separator = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:  # one batched call: runs in parallel
        stream.extend(ids + [separator])
    return [TokenizedSample(torch.tensor(stream[i:i + window]), torch.ones(window, dtype=torch.bool))
            for i in range(0, len(stream) - window + 1, window)]


# --------------------------------------------------------------------------------------------------------- config
@dataclass
class SFTConfig(ParallelSettings):
    """The training loop's settings; the defaults are the `small` recipe (module docstring). `from_dict` accepts a
    `recipe` key (`SFT_RECIPES`) whose values the other keys override. Running across processes (DDP or FSDP,
    activation checkpointing, mixed precision): ParallelSettings' fields."""

    recipe: str = "small"
    learning_rate: float = 1e-4
    adam_betas: tuple[float, float] = (0.9, 0.95)
    warmup_ratio: float = 0.03
    warmup_steps: int | None = None  # overrides warmup_ratio (time-boxed runs do not know their step count)
    # After warm-up, cosine decay to this fraction of the learning rate over the run (its steps, or max_seconds
    # when set); 1.0 keeps it constant (DICE's recipe).
    final_lr_ratio: float = 0.1
    epochs: int = 3
    max_steps: int | None = None  # stop early
    max_seconds: float | None = None  # time box (training time, summed over resumed runs)
    samples_per_step: int = 8  # the global batch (each rank trains its share) when rows_per_step is None
    rows_per_step: int | None = None  # fixed batch shape: fill this many rows per step (token budget; one process)
    row_length: int | None = None  # packed row length; default 2 x the longest sample (a sample of L tokens needs 2L)
    max_length: int | None = None  # prompt + response tokens; longer rows dropped. None: from the data
    max_length_cap: int = DICE_MAX_LENGTH  # the most a data-chosen max_length may be
    block_size: int = 4  # for preset bases; a loaded model keeps its own
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    attention_backend: str = "auto"  # "dense" (CPU), "flex" (GPU), "auto" picks by device
    drop_unscored_blocks: bool = True
    tile: int | None = None  # 128: tile-aware packing for flex attention (exact; see diffusion.pack_segments)
    # torch.compile mode of flex attention on the GPU. "max-autotune-no-cudagraphs" benchmarks its kernels once per
    # row shape (about 100 s at 32k tokens on an H200) and made a 0.6B step 1-2% faster there (benchmarks/RESULTS.md):
    # worth it for long runs with fixed rows (rows_per_step), not for short ones.
    flex_compile_mode: str | None = None
    save_every: int | None = 50  # steps between checkpoints (with an out_dir); the last step always saves
    keep_checkpoints: int | None = 2
    tokenizer_vocab_size: int = 4096  # preset bases only

    def __post_init__(self) -> None:
        if self.recipe not in SFT_RECIPES:
            raise ValueError(f"unknown SFT recipe {self.recipe!r}; choose one of {sorted(SFT_RECIPES)}")
        self.adam_betas = tuple(self.adam_betas)
        self.check_parallel_settings()

    @classmethod
    def from_dict(cls, values: dict | None) -> "SFTConfig":
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown SFT config keys: {sorted(unknown)} (SFTConfig has {sorted(known)})")
        recipe = values.get("recipe", "small")
        if recipe not in SFT_RECIPES:
            raise ValueError(f"unknown SFT recipe {recipe!r}; choose one of {sorted(SFT_RECIPES)}")
        return cls(**{**SFT_RECIPES[recipe], **values})


def continued_training_config(learning_rate: float, max_seconds: float, window: int, rows_per_step: int = 8,
                              warmup_steps: int = 50) -> SFTConfig:
    """SDAR's conversion step as a time-boxed run on `text_windows` of `window` tokens: fixed rows of 8 windows
    (one attention shape), cosine decay to a tenth over `max_seconds`, dense SDPA (no compile time out of a short
    budget), no checkpoints but the last."""
    return SFTConfig(learning_rate=learning_rate, warmup_steps=warmup_steps, final_lr_ratio=0.1, epochs=1000,
                     max_seconds=max_seconds, rows_per_step=rows_per_step, row_length=8 * window,
                     attention_backend="dense", save_every=None, keep_checkpoints=1)


# -------------------------------------------------------------------------------------------------------- batches
def epoch_orders(num_samples: int, epochs: int, seed: int) -> list[list[int]]:
    """The data order: one shuffled permutation per epoch, from the seed alone (so a resumed run walks the same)."""
    shuffler = random.Random(seed)
    order, orders = list(range(num_samples)), []
    for _ in range(epochs):
        shuffler.shuffle(order)
        orders.append(list(order))
    return orders


def sft_steps(orders: list[list[int]], samples_per_step: int) -> Iterator[tuple[int, list[int]]]:
    """(epoch, global sample indices) per optimizer step."""
    for epoch, order in enumerate(orders):
        for start in range(0, len(order), samples_per_step):
            yield epoch, order[start:start + samples_per_step]


def block_diffusion_batches(samples: Sequence[TokenizedSample], config: SFTConfig, block_size: int,
                            mask_token_id: int, shift: int = 0, pad_token_id: int = 0, rank: int = 0,
                            world: int = 1) -> Iterator[tuple[int, BlockDiffusionBatch, bool]]:
    """(epoch, this rank's batch, whether the rank holds samples of this step) per optimizer step, in an order and
    with noise fixed by the seed alone (every rank draws the noise of the whole global batch, in order, so the run is
    the same at any world size, and replaying the draws of skipped steps resumes exactly).

    With `rows_per_step` (one process), each batch is exactly that many rows filled from the stream of noised
    samples (those that do not fit wait, noised, for the next batch), so the attention kernels see one shape;
    otherwise a step is the next `samples_per_step` samples, this rank's share packed into as many rows as needed."""
    noise = torch.Generator().manual_seed(config.seed)
    row_length = config.row_length or round_up(2 * max(s.input_ids.numel() for s in samples), block_size)

    def noised(index: int) -> NoisySegment:
        return noise_sample(samples[index], block_size, noise, config.drop_unscored_blocks, shift=shift)

    def pack(segments, max_rows=None):
        return pack_segments(segments, mask_token_id, block_size, row_length, max_rows=max_rows,
                             pad_token_id=pad_token_id, tile=config.tile, shift=shift)

    orders = epoch_orders(len(samples), config.epochs, config.seed)
    if not config.rows_per_step:
        for epoch, indices in sft_steps(orders, config.samples_per_step):
            segments = [noised(i) for i in indices]
            shard = segments[rank::world]
            # An idle rank still runs a forward (scaled to nothing) so the ranks' gradient syncs pair up.
            yield epoch, pack(shard or segments[:1])[0], bool(shard)
        return
    if world > 1:
        raise ValueError("rows_per_step batches need one process; use samples_per_step under torchrun")
    capacity = config.rows_per_step * row_length
    pending: list[NoisySegment] = []
    for epoch, order in enumerate(orders):
        for index in order:
            pending.append(noised(index))
            if sum(s.length for s in pending) >= capacity:
                batch, pending[:] = pack(pending, config.rows_per_step)
                yield epoch, batch, True
    while pending:  # the tail of the last epoch
        batch, pending[:] = pack(pending, config.rows_per_step)
        yield config.epochs - 1, batch, True


def _lr_at(config: SFTConfig, step: int, total_steps: int, warmup_steps: int, seconds: float) -> float:
    """Linear warm-up, then constant or a cosine decay to `final_lr_ratio` over the steps or the time box."""
    progress = seconds / config.max_seconds if config.max_seconds else step / max(total_steps, 1)
    decay = config.final_lr_ratio + (1 - config.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1)))
    return config.learning_rate * min(1.0, (step + 1) / warmup_steps) * decay


def data_fingerprint(samples: Sequence[TokenizedSample]) -> str:
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(sample.input_ids.numpy().tobytes())
        digest.update(sample.answer_mask.numpy().tobytes())
    return digest.hexdigest()[:16]


class _LossModule(torch.nn.Module):
    """The block-diffusion loss as a module's forward, so DistributedDataParallel's hooks see the parameters used."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch, attention_mask):
        return block_diffusion_loss(self.model, batch, attention_mask)


# ----------------------------------------------------------------------------------------------------------- loop
def train_block_diffusion(model, samples: Sequence[TokenizedSample], config: SFTConfig, *, tokenizer=None,
                          out_dir: str | Path | None = None, resume: bool = False, stage: str = "sft",
                          on_step: Callable[[dict], None] | None = None, extra_state: dict | None = None) -> dict:
    """Train `model` in place on `samples` with the block-diffusion objective (the model's own block size, mask
    token and prediction shift). With `out_dir`, saves `step-N` every `save_every` steps and at the end (with the
    tokenizer), and with `resume` continues from `out_dir/latest` with its weights, optimizer, step, time and the same
    data order (refusing a checkpoint trained on other data or settings). Under torchrun (a process group joined
    by the caller) the model is replicated (DDP) or sharded (FSDP) as `config.parallelism` says, each rank trains
    its share of every global batch, and the loss is normalised by the global answer-token count (the curve equals
    one process's). `model` may be on the CPU: it is moved (or sharded) onto this rank's device here.

    Returns the run: checkpoint (or None), step, total_steps, tokens_seen, seconds, stopped_by, resumed_from,
    history (one record per optimizer step: step, epoch, loss, lr, clean_tokens, tokens_seen, seconds)."""
    if not samples:
        raise ValueError("no training samples")
    processes = Processes()
    strategy = prepare_model(model, config, processes)
    device = processes.device()
    block_size, mask_id, shift = model.config.block_size, model.config.mask_token_id, prediction_shift(model.config)
    pad_id = model.config.pad_token_id or 0
    if config.rows_per_step:
        row_length = config.row_length or round_up(2 * max(s.input_ids.numel() for s in samples), block_size)
        total_steps = math.ceil(sum(2 * s.input_ids.numel() for s in samples) * config.epochs
                                / (config.rows_per_step * row_length))  # an estimate: sets the warm-up only
    else:
        total_steps = config.epochs * math.ceil(len(samples) / config.samples_per_step)
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    warmup_steps = config.warmup_steps or max(1, round(config.warmup_ratio * total_steps))
    # What fixes the data order and the noise: a resumed run must agree on all of it.
    identity = dict(stage=stage, data=data_fingerprint(samples), seed=config.seed, epochs=config.epochs,
                    samples_per_step=config.samples_per_step, rows_per_step=config.rows_per_step,
                    row_length=config.row_length, block_size=block_size, prediction_shift=shift,
                    drop_unscored_blocks=config.drop_unscored_blocks, tile=config.tile)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=tuple(config.adam_betas),
                                  weight_decay=config.weight_decay, fused=device.type == "cuda")
    history: list[dict] = []
    start_step, tokens_seen, seconds_before = 0, 0, 0.0
    out_dir = Path(out_dir) if out_dir is not None else None
    checkpoint = latest_checkpoint(out_dir) if out_dir is not None and resume else None
    if checkpoint is not None:
        state, history = load_checkpoint(checkpoint, model, optimizer)
        if state.get("identity") != identity:
            raise ValueError(f"{out_dir}: the checkpoint was trained on other data or another order "
                             f"(saved {state.get('identity')}, now {identity}); start a fresh stage (resume=False) "
                             "or point at another directory")
        start_step, tokens_seen, seconds_before = state["step"], state["tokens_seen"], state["seconds"]

    trainer = _LossModule(model)
    if strategy == "ddp":
        trainer = torch.nn.parallel.DistributedDataParallel(
            trainer, device_ids=[processes.local_rank] if device.type == "cuda" else None)
    set_flex_compile_mode(config.flex_compile_mode)

    def state_now(step: int, epoch: int, seconds: float) -> dict:
        return dict(stage=stage, epoch=epoch, tokens_seen=tokens_seen, seconds=seconds, total_steps=total_steps,
                    identity=identity, world_size=processes.world, strategy=strategy,
                    config=dataclasses.asdict(config), **(extra_state or {}))

    def save(step: int, epoch: int, seconds: float) -> Path:
        return save_checkpoint(out_dir, step, model, tokenizer, optimizer, state_now(step, epoch, seconds), history,
                               config.keep_checkpoints, processes)

    model.train()
    started = time.perf_counter()
    step, epoch, stopped_by = start_step, 0, "completed"
    batches = block_diffusion_batches(samples, config, block_size, mask_id, shift, pad_id, processes.rank,
                                      processes.world)
    for index, (epoch, batch, holds_samples) in enumerate(batches):
        if index < start_step:
            continue  # its noise was drawn: the resumed run sees exactly the batches the first one would have
        if config.max_steps is not None and step >= config.max_steps:
            stopped_by = "max_steps"
            break
        seconds = seconds_before + time.perf_counter() - started
        if config.max_seconds is not None:
            # Rank 0's clock for all: every rank must stop at the same step and decay the rate alike.
            seconds = processes.from_rank_zero(seconds)
        if config.max_seconds is not None and seconds >= config.max_seconds:
            stopped_by = "max_seconds"
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(config, step, total_steps, warmup_steps, seconds)
        local_tokens = batch.num_answer_tokens if holds_samples else 0
        global_tokens = processes.sum(local_tokens)
        batch = batch.to(device)
        with autocast(device, config.mixed_precision):
            mask = build_attention_mask(batch, config.attention_backend, block_size=block_size)
            # block_diffusion_loss divides by this rank's answer tokens; rescale to the global count, and by the
            # world size because DDP and FSDP average gradients: the update equals one process's on the whole batch.
            local_loss = trainer(batch, mask) * (local_tokens / max(global_tokens, 1))
        optimizer.zero_grad(set_to_none=True)
        (local_loss * processes.world).backward()
        clip_gradients(model, config.grad_clip)
        optimizer.step()
        step += 1
        clean_tokens = int(processes.sum(batch.num_clean_tokens if holds_samples else 0))
        tokens_seen += clean_tokens
        record = dict(step=step, total_steps=total_steps, epoch=epoch, loss=processes.sum(local_loss.item()),
                      lr=optimizer.param_groups[0]["lr"], clean_tokens=clean_tokens, tokens_seen=tokens_seen,
                      seconds=round(seconds_before + time.perf_counter() - started, 3))
        history.append(record)
        if on_step is not None and processes.is_main:
            on_step(record)
        if out_dir is not None and config.save_every and step % config.save_every == 0:
            save(step, epoch, record["seconds"])
    model.eval()
    seconds = round(seconds_before + time.perf_counter() - started, 3)
    final = save(step, epoch, seconds) if out_dir is not None else None
    return dict(stage=stage, checkpoint=None if final is None else str(final),
                out_dir=None if out_dir is None else str(out_dir), step=step, total_steps=total_steps,
                tokens_seen=tokens_seen, seconds=seconds, stopped_by=stopped_by, resumed_from=start_step,
                samples=len(samples), world_size=processes.world, strategy=strategy, device=str(device),
                config=dataclasses.asdict(config), history=history)


# ---------------------------------------------------------------------------------------------------------- stage
def run_sft_stage(base: str, samples_path: str | Path, out_dir: str | Path, config: SFTConfig | None = None,
                  resume: bool = True, on_step: Callable[[dict], None] | None = None) -> dict:
    """Block-diffusion SFT of `base` (training.convert.load_base: a conversion checkpoint, `preset:NAME`, a `.gguf`
    file or a checkpoint directory) on the CuKe rows in `samples_path` (prompt_messages/prompt + response), into
    `out_dir` (step-N + latest; a rerun resumes there). Rows longer than max_length are dropped and counted.
    Returns the run (train_block_diffusion) plus the data's counts."""
    from training.convert import load_base

    config = config or SFTConfig()
    out_dir = Path(out_dir)
    processes = Processes.join(one_process_group=config.parallelism == "fsdp")
    rows = read_rows(samples_path)
    if processes.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    processes.barrier()
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if checkpoint is not None:
        base_spec = str(checkpoint)
    elif base.startswith("preset:"):
        # Rank 0 builds the random model and trains its tokenizer once; every rank loads that same base.
        base_spec = str(out_dir / "base")
        if processes.is_main:
            model, tokenizer = load_base(base, training_texts(rows), config.block_size, config.tokenizer_vocab_size,
                                         config.seed)
            model.save_pretrained(base_spec)
            tokenizer.save_pretrained(base_spec)
        processes.barrier()
    else:
        base_spec = base
    model, tokenizer = load_base(base_spec, block_size=config.block_size)
    tokenized = tokenize_chat_rows(tokenizer, [{"prompt": chat_prompt(r), "response": r.get("response")}
                                               for r in rows], config.max_length, config.max_length_cap,
                                   model.config.block_size)
    if not tokenized.samples:
        raise ValueError(f"{samples_path}: no trainable rows ({tokenized.skipped_by_reason()} skipped)")
    result = train_block_diffusion(model, tokenized.samples, config, tokenizer=tokenizer, out_dir=out_dir,
                                   resume=resume, on_step=on_step, extra_state=dict(base=base))
    counts = tokenized.skipped_by_reason()
    return dict(result, base=base, rows=len(rows), max_length=tokenized.max_length,
                skipped_rows=len(tokenized.skipped), dropped_too_long=counts.get("too_long", 0),
                skipped_by_reason=counts, prediction_shift=prediction_shift(model.config))
