"""The staged training recipe as plain-file stage runners: block-diffusion SFT on CuKe, then BiC-RL stage 1 (kernel
infilling) and stage 2 (end-to-end, easy->hard). Each stage reads JSONL/Parquet rows and writes a checkpoint
directory (`step-N/` + `latest`), so it runs the same under Dagster, from a shell, under `torchrun`, or on a GPU host
with only torch + transformers installed (`python -m training.stages --help`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from training.diffusion import block_diffusion_loss, build_attention_mask, noise_sample, pack_segments
from training.modeling_sdar import SDARForCausalLM, set_flex_compile_mode
from training.sft import tokenize_chat_rows

LATEST = "latest"
STAGES = ("sft", "rl_infilling", "rl_end_to_end")


# ----------------------------------------------------------------------------------------------------------- data
def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL, JSON (a list of objects) or Parquet file (pyarrow, present on the GPU image)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: expected .jsonl, .json or .parquet")


def write_jsonl(rows: Sequence[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat_prompt(row: dict):
    """The chat messages of a CuKe row: `prompt_messages` (a JSON list) when present, else `prompt` as one user
    turn (the rendered `prompt` column must not be rendered a second time)."""
    messages = row.get("prompt_messages")
    if isinstance(messages, str) and messages.strip():
        return json.loads(messages)
    if isinstance(messages, list) and messages:
        return messages
    return row["prompt"]


# ----------------------------------------------------------------------------------------------------- base models
def resolve_checkpoint(path: str | Path) -> Path:
    """A stage directory resolves to the `step-N` its `latest` pointer file names; anything else is itself."""
    path = Path(path)
    latest = path / LATEST
    if latest.is_dir():  # a symlink to the step
        return latest.resolve()
    if latest.is_file():
        return path / latest.read_text().strip()
    return path


def load_base(spec: str, texts: Sequence[str] = (), block_size: int = 4, vocab_size: int = 4096,
              seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a base spec: `preset:NAME` (a random SDAR model of that size with a byte-level BPE
    trained on `texts`), a `.gguf` file or a checkpoint directory (a stage directory resolves to its latest step;
    an autoregressive Llama/Qwen3 checkpoint is converted to block diffusion)."""
    if spec.startswith("preset:"):
        from training.configuration_sdar import preset_config
        from training.tokenizer import train_bpe_tokenizer

        if not texts:
            raise ValueError("a preset base needs texts to train its tokenizer on")
        tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size, min_frequency=2)
        torch.manual_seed(seed)
        config = preset_config(spec.split(":", 1)[1], vocab_size=len(tokenizer), block_size=block_size,
                               mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id)
        return SDARForCausalLM(config).to(dtype).eval(), tokenizer
    from training.convert import load_pretrained_as_block_diffusion

    return load_pretrained_as_block_diffusion(resolve_checkpoint(spec), block_size=block_size, dtype=dtype)


# ------------------------------------------------------------------------------------------------- distributed
@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        if torch.distributed.get_backend() == "nccl":
            tensor = tensor.cuda()
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())


def init_distributed() -> Distributed:
    """Under `torchrun` (WORLD_SIZE > 1): join the process group, gloo on CPU and nccl on GPUs."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Distributed(torch.distributed.get_rank(), world_size, local_rank)


class _LossModule(torch.nn.Module):
    """The block-diffusion loss as a module's forward, so DistributedDataParallel's hooks see the parameters used."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch, attention_mask):
        return block_diffusion_loss(self.model, batch, attention_mask)


# ---------------------------------------------------------------------------------------------------------- SFT
@dataclass
class SFTStageConfig:
    """DICE's SFT recipe (lr 1e-5, 3 % warm-up then constant, 3 epochs, block 4) plus what a resumable, time-boxed
    stage needs. `samples_per_step` is the global batch: under torchrun each rank trains its share of it."""

    learning_rate: float = 1e-5
    warmup_ratio: float = 0.03
    epochs: int = 3
    block_size: int = 4
    samples_per_step: int = 8
    max_length: int = 2048  # tokens of prompt + response; longer responses are cut
    max_steps: int | None = None
    max_seconds: float | None = None  # time box (training time, summed over resumed runs)
    save_every: int = 50  # steps between checkpoints
    keep_checkpoints: int = 2
    final_lr_ratio: float = 1.0  # < 1: cosine decay after warm-up (short runs)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    attention_backend: str = "auto"
    flex_compile_mode: str | None = None
    tokenizer_vocab_size: int = 4096  # preset bases only

    @classmethod
    def from_dict(cls, values: dict | None) -> "SFTStageConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values or {}) - known
        if unknown:
            raise ValueError(f"unknown SFT config keys: {sorted(unknown)}")
        return cls(**(values or {}))


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


def _lr_at(config: SFTStageConfig, step: int, total_steps: int, seconds: float) -> float:
    """Linear warm-up, then constant (DICE) or cosine decay to `final_lr_ratio` over the steps or the time box."""
    warmup = max(1, round(config.warmup_ratio * total_steps))
    progress = seconds / config.max_seconds if config.max_seconds else step / max(total_steps, 1)
    decay = config.final_lr_ratio + (1 - config.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1)))
    return config.learning_rate * min(1.0, (step + 1) / warmup) * decay


def _data_fingerprint(samples) -> str:
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(sample.input_ids.numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def save_checkpoint(out_dir: Path, step: int, model, tokenizer, state: dict, optimizer=None,
                    keep: int | None = None) -> Path:
    """`out_dir/step-N` (model via save_pretrained, tokenizer, optimizer, RNG, trainer state), then `latest` moved
    to it. Written under a temporary name and renamed, so a kill mid-save leaves the previous checkpoint intact."""
    final = out_dir / f"step-{step}"
    staging = out_dir / f".step-{step}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, staging / "rng.pt")
    (staging / "trainer_state.json").write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    pointer = out_dir / f".{LATEST}.partial"
    pointer.write_text(final.name)
    os.replace(pointer, out_dir / LATEST)
    if keep:
        names = [p.name.split("-", 1)[1] for p in out_dir.glob("step-*")]
        steps = sorted(int(name) for name in names if name.isdigit())
        for old in steps[:-keep]:
            shutil.rmtree(out_dir / f"step-{old}", ignore_errors=True)
    return final


def run_sft_stage(base: str, samples_path: str | Path, out_dir: str | Path, config: SFTStageConfig | None = None,
                  resume: bool = True, on_step: Callable[[dict], None] | None = None) -> dict:
    """Block-diffusion SFT of `base` on the CuKe rows in `samples_path` (prompt_messages/prompt + response).

    Saves `out_dir/step-N` every `save_every` steps and at the end; with `resume`, continues from `out_dir/latest`
    with its weights, optimizer, step and the same data order (checked against the saved one). Under torchrun
    (WORLD_SIZE > 1) the model is wrapped in DDP, each rank trains its shard of every global batch, the loss is
    normalised by the global answer-token count (so the curve equals a single process's), and only rank 0 saves.
    Returns the stage result (checkpoint path, step, tokens seen, seconds, history, config)."""
    config = config or SFTStageConfig()
    out_dir = Path(out_dir)
    dist = init_distributed()
    device = torch.device(f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu")
    rows = read_rows(samples_path)
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    state = None
    latest = out_dir / LATEST
    if resume and latest.is_file():
        checkpoint = resolve_checkpoint(out_dir)
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        model, tokenizer = load_base(str(checkpoint), block_size=config.block_size)
    elif base.startswith("preset:"):
        # Rank 0 builds the random model and trains the tokenizer once; every rank loads that same base.
        base_dir = out_dir / "base"
        if dist.is_main:
            texts = training_texts(rows)
            model, tokenizer = load_base(base, texts, config.block_size, config.tokenizer_vocab_size, config.seed)
            model.save_pretrained(base_dir)
            tokenizer.save_pretrained(base_dir)
        dist.barrier()
        model, tokenizer = load_base(str(base_dir), block_size=config.block_size)
    else:
        model, tokenizer = load_base(base, block_size=config.block_size)
    model.to(device)

    tokenized = tokenize_chat_rows(tokenizer, [{"prompt": chat_prompt(r), "response": r.get("response")} for r in rows],
                                   config.max_length)
    samples = tokenized.samples
    if not samples:
        raise ValueError(f"{samples_path}: no trainable rows ({len(tokenized.skipped)} skipped)")
    orders = epoch_orders(len(samples), config.epochs, config.seed)
    fingerprint = _data_fingerprint(samples)
    steps = list(sft_steps(orders, config.samples_per_step))
    total_steps = min(len(steps), config.max_steps or len(steps))

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=config.weight_decay)
    history: list[dict] = []
    start_step, tokens_seen, seconds_before = 0, 0, 0.0
    if state is not None:
        if state["data_fingerprint"] != fingerprint or state["data_order"] != orders:
            raise ValueError(f"{out_dir}: the checkpoint was trained on other data or another order; "
                             "start a fresh stage (resume=False) or point at another directory")
        optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location=device))
        rng = torch.load(checkpoint / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        start_step, tokens_seen, seconds_before = state["step"], state["tokens_seen"], state["seconds"]
        history = state["history"]

    trainer = _LossModule(model)
    if dist.world_size > 1:
        trainer = torch.nn.parallel.DistributedDataParallel(
            trainer, device_ids=[dist.local_rank] if device.type == "cuda" else None)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    set_flex_compile_mode(config.flex_compile_mode)
    block_size, mask_id = model.config.block_size, model.config.mask_token_id
    pad_id = tokenizer.pad_token_id or 0
    row_length = -(-2 * config.max_length // block_size) * block_size
    noise = torch.Generator().manual_seed(config.seed)

    def state_now(step: int, epoch: int, seconds: float) -> dict:
        return dict(stage="sft", step=step, epoch=epoch, tokens_seen=tokens_seen, seconds=seconds,
                    total_steps=total_steps, data_fingerprint=fingerprint, data_order=orders,
                    samples_per_step=config.samples_per_step, world_size=dist.world_size,
                    config=dataclasses.asdict(config), base=base, history=history)

    model.train()
    started = time.perf_counter()
    step, epoch, stopped_by = start_step, 0, "completed"
    for index, (epoch, indices) in enumerate(steps):
        # Every rank draws the noise of the whole global batch in order: the run is the same at any world size,
        # and skipping consumed steps on resume replays exactly the draws they made.
        segments = [noise_sample(samples[i], block_size, noise) for i in indices]
        if index < start_step:
            continue
        if step >= total_steps:
            stopped_by = "max_steps"
            break
        seconds = seconds_before + time.perf_counter() - started
        if config.max_seconds is not None and seconds >= config.max_seconds:
            stopped_by = "max_seconds"
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(config, step, total_steps, seconds)
        shard = segments[dist.rank::dist.world_size]
        batch = pack_segments(shard or segments[:1], mask_id, block_size, row_length, pad_token_id=pad_id)[0]
        local_tokens = batch.num_answer_tokens if shard else 0
        global_tokens = dist.sum(local_tokens)
        batch = batch.to(device)
        with autocast:
            mask = build_attention_mask(batch, config.attention_backend, block_size=block_size)
            # block_diffusion_loss divides by this rank's answer tokens; rescale to the global count, and by the
            # world size because DDP averages gradients: the update equals one process's on the whole batch.
            local_loss = trainer(batch, mask) * (local_tokens / max(global_tokens, 1))
        optimizer.zero_grad(set_to_none=True)
        (local_loss * dist.world_size).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += int(dist.sum(batch.num_clean_tokens if shard else 0))
        record = dict(step=step, total_steps=total_steps, epoch=epoch, loss=dist.sum(local_loss.item()),
                      lr=optimizer.param_groups[0]["lr"], tokens_seen=tokens_seen,
                      seconds=round(seconds_before + time.perf_counter() - started, 3))
        history.append(record)
        if on_step is not None and dist.is_main:
            on_step(record)
        if step % config.save_every == 0 and step < total_steps:
            if dist.is_main:
                save_checkpoint(out_dir, step, model, tokenizer, state_now(step, epoch, record["seconds"]),
                                optimizer, config.keep_checkpoints)
            dist.barrier()
    model.eval()
    seconds = round(seconds_before + time.perf_counter() - started, 3)
    final = out_dir / f"step-{step}"
    if dist.is_main:
        final = save_checkpoint(out_dir, step, model, tokenizer, state_now(step, epoch, seconds), optimizer,
                                config.keep_checkpoints)
    dist.barrier()
    return dict(stage="sft", checkpoint=str(final), out_dir=str(out_dir), step=step, total_steps=total_steps,
                tokens_seen=tokens_seen, seconds=seconds, stopped_by=stopped_by, resumed_from=start_step,
                samples=len(samples), skipped_rows=len(tokenized.skipped), truncated_rows=tokenized.truncated,
                world_size=dist.world_size, device=str(device), base=base, config=dataclasses.asdict(config),
                history=history)


def training_texts(rows: Sequence[dict]) -> list[str]:
    """What a preset base's tokenizer is trained on: every chat turn and response of the SFT rows."""
    return [m["content"] for r in rows for m in _as_messages(chat_prompt(r))] + [r["response"] for r in rows]


def _as_messages(prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


# ----------------------------------------------------------------------------------------------------------- RL
RL_STAGE_NAMES = {"rl_infilling": "infilling", "rl_end_to_end": "end_to_end"}  # -> RLConfig.stage


def rl_config_for(stage: str, values: dict | None):
    """`training.rl.RLConfig` for a stage from a dict of its fields (DICE's settings are RLConfig's defaults:
    lr 1e-6, clip 0.2, KL 0.01, G=16, 64 tasks a step, temperature 1.0, block 4, 4 steps, threshold 0.9)."""
    from training.rl import RLConfig

    known = {f.name for f in dataclasses.fields(RLConfig)}
    unknown = set(values or {}) - known
    if unknown:
        raise ValueError(f"unknown RL config keys: {sorted(unknown)} (RLConfig has {sorted(known)})")
    return RLConfig(**{**(values or {}), "stage": RL_STAGE_NAMES[stage]})


def rl_tasks_from_rows(rows: Sequence[dict], stage: str) -> list:
    """`RLTask`s in the order the stage walks them: stage 1 (infilling) in file order, prompts holding prefix and
    suffix; stage 2 (end-to-end) by `schedule_position` (easy -> hard), the KernelBench-style generation prompt."""
    from dice_pipeline.prompts import kernel_generation_messages
    from training.rl import RLTask

    if stage == "rl_infilling":
        return [RLTask(task_id=str(r["task_id"]), messages=chat_prompt(r), reference_src=r["pytorch_code"],
                       difficulty=_difficulty(r), prefix=r["prefix"], suffix=r["suffix"]) for r in rows]
    if stage == "rl_end_to_end":
        ordered = sorted(rows, key=lambda r: r.get("schedule_position", 0))
        return [RLTask(task_id=str(r["task_id"]), messages=kernel_generation_messages(r["pytorch_code"]),
                       reference_src=r["pytorch_code"], difficulty=_difficulty(r)) for r in ordered]
    raise ValueError(f"stage must be rl_infilling or rl_end_to_end, got {stage!r}")


def _difficulty(row: dict) -> int:
    return 0 if row.get("difficulty") is None else int(row["difficulty"])  # unlabelled rows count as easiest


def build_reward(kind: str, verify_config: dict | None = None, batch_timeout_s: float | None = None):
    """`verifier`: the kernel verifier (compiles and passes correctness; runs on a GPU, in isolated workers);
    `static`: static anti-gaming checks only, for GPU-less hosts (stated in the stage result). A reward call still
    unfinished after `batch_timeout_s` costs the unfinished rollouts their reward (recorded), never the step."""
    from training import rewards

    if kind == "static":
        return rewards.StaticCheckReward(batch_timeout_s=batch_timeout_s)
    if kind == "verifier":
        from dice_pipeline.verify import VerifyConfig

        fields = dict(verify_config or {})
        if "extra_baselines" in fields:
            fields["extra_baselines"] = tuple(fields["extra_baselines"])
        return rewards.VerifierReward(VerifyConfig(**fields), batch_timeout_s=batch_timeout_s)
    raise ValueError(f"reward must be 'verifier' or 'static', got {kind!r}")


def run_rl_stage(base: str | Path, tasks_path: str | Path, out_dir: str | Path, stage: str,
                 config: dict | None = None, reward: str = "static", verify_config: dict | None = None,
                 resume: bool = True, on_step: Callable[[dict], None] | None = None,
                 reward_timeout_s: float | None = None) -> dict:
    """One BiC-RL stage (`rl_infilling` or `rl_end_to_end`) from the checkpoint `base` (a stage directory resolves to
    its latest step) on the tasks in `tasks_path`, via `training.rl.train_rl`; checkpoints in `out_dir/step-N` +
    `latest`. Under torchrun every rank samples its share of each step's rollouts and rank 0 calls the reward
    (training.rl.train_rl)."""
    from training.rl import train_rl

    rl_config = rl_config_for(stage, config)
    out_dir = Path(out_dir)
    dist = init_distributed()
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    device = torch.device(f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_base(str(base), block_size=rl_config.block_size)
    model.to(device)
    tasks = rl_tasks_from_rows(read_rows(tasks_path), stage)
    if not tasks:
        raise ValueError(f"{tasks_path}: no RL tasks")

    started = time.perf_counter()
    reward_fn = build_reward(reward, verify_config, reward_timeout_s)
    history = train_rl(model, tokenizer, tasks, reward_fn, rl_config, out_dir,
                       resume=resume, on_step=on_step)
    return dict(stage=stage, checkpoint=str(resolve_checkpoint(out_dir)), out_dir=str(out_dir),
                step=history[-1]["step"] if history else 0, total_steps=rl_config.steps, tasks=len(tasks),
                tokens_seen=int(history[-1].get("tokens_seen") or sum(r.get("tokens_generated") or 0 for r in history)
                                if history else 0),
                seconds=round(history[-1]["wall_seconds"] if history else time.perf_counter() - started, 3),
                reward=reward, reward_description=getattr(reward_fn, "description", reward), device=str(device),
                world_size=dist.world_size, base=str(base), config=dataclasses.asdict(rl_config),
                history=history)


# ----------------------------------------------------------------------------------------------------------- CLI
def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.stages", description=__doc__)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--base", required=True, help="preset:NAME, a .gguf file, a checkpoint or a stage directory")
    parser.add_argument("--data", required=True, help="SFT samples, infilling or end-to-end tasks (JSONL/Parquet)")
    parser.add_argument("--out", required=True, help="the stage's checkpoint directory")
    parser.add_argument("--config", default="{}", help="JSON object of stage config fields (or @file.json)")
    parser.add_argument("--reward", choices=("verifier", "static"), default="static")
    parser.add_argument("--verify-config", default="{}", help="JSON object of VerifyConfig fields (reward=verifier)")
    parser.add_argument("--reward-timeout-s", type=float, default=None,
                        help="a reward call unfinished after this long costs the unfinished rollouts their reward")
    parser.add_argument("--results", help="write the stage result here as JSON")
    parser.add_argument("--no-resume", action="store_true", help="start over even if OUT holds a checkpoint")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def _json_arg(text: str) -> dict:
    return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one stage; prints each step as a `[step] {json}` line on stdout (read by the Dagster asset), a progress
    bar on stderr, and writes the result JSON."""
    args = _parse_args(argv)
    config = _json_arg(args.config)
    rank = int(os.environ.get("RANK", "0"))
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(desc=args.stage, unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_step(record: dict) -> None:
        print("[step] " + json.dumps(record, default=str), flush=True)
        if bar is not None:
            if record.get("total_steps") or bar.total is None:
                bar.total = record.get("total_steps", bar.total)
            bar.update(1)
            bar.set_postfix({k: f"{record[k]:.4g}" for k in ("loss", "reward_mean", "kl") if
                             isinstance(record.get(k), (int, float))})

    if args.stage == "sft":
        result = run_sft_stage(args.base, args.data, args.out, SFTStageConfig.from_dict(config),
                               resume=not args.no_resume, on_step=on_step)
    else:
        result = run_rl_stage(args.base, args.data, args.out, args.stage, config,
                              reward=args.reward, verify_config=_json_arg(args.verify_config),
                              resume=not args.no_resume, on_step=on_step, reward_timeout_s=args.reward_timeout_s)
    if bar is not None:
        bar.close()
    if args.results and rank == 0:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(result, indent=1, default=str))
    if rank == 0:
        print(f"[done] {args.stage}: step {result['step']}, {result['tokens_seen']} tokens, {result['seconds']} s -> "
              f"{result['checkpoint']}", flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
