"""TraceRL for the block-diffusion LM (DICE's BiC-RL stages), readable top to bottom.

A step: take the next `tasks_per_step` tasks of the easy->hard schedule, sample G completions per task with the
block-diffusion sampler (which records the forward that committed each token: the trace), judge them all in one
reward call, turn rewards into z-scores within each task's group (groups whose samples all score the same are
dropped), and take PPO-clip steps on the log-probs of the committed tokens computed by replaying the trace: a token
committed at a block's denoising step s is scored under the state the sampler saw then (earlier blocks clean, the
tokens of its block committed at steps < s revealed, the rest MASK). A k3 KL against the rollout policy keeps the
update near it. One replay forward per denoising-step index covers every block of every response in a micro-batch,
in the `[x_t ; x_0]` training layout of diffusion.py (the noisy copies are the trace states).

GPU-side code: torch, transformers (the model) and the standard library; the reward is a pluggable callable
(training/rewards.py: the verifier's isolated workers, or static checks only on hosts without a GPU).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from training.diffusion import IGNORE_INDEX, BlockDiffusionBatch, build_attention_mask
from training.generate import block_diffusion_generate
from training.rewards import (RewardFn, RewardOutcome, RewardRequest, candidate_source,
                              infrastructure_failure)

STAGES = ("infilling", "end_to_end")


# --------------------------------------------------------------------------------------------------------- config


@dataclass
class RLConfig:
    """One RL stage. Defaults are DICE's (NOTES.md section 1) where the paper states them."""

    stage: str = "end_to_end"  # "infilling" (stage 1: prompts hold prefix and suffix) or "end_to_end" (stage 2)
    steps: int = 100  # DICE: 20 (infilling), 100 (end-to-end)
    tasks_per_step: int = 64
    samples_per_task: int = 16  # G
    learning_rate: float = 1e-6
    clip: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.01  # k3 KL against the rollout policy
    temperature: float = 1.0
    block_size: int = 4
    denoising_steps: int = 4
    strategy: str = "dynamic"  # the sampler's unmasking rule ("dynamic" or "static")
    threshold: float = 0.9  # dynamic unmasking confidence
    max_new_tokens: int = 4096
    seed: int = 0
    checkpoint_every: int = 10  # steps; the last step (and a time-out) always checkpoints
    keep_checkpoints: int | None = 3  # the newest N step directories are kept (model + optimizer each); None = all
    max_seconds: float | None = None  # stop (with a checkpoint) after the step that passes this much time
    ppo_epochs: int = 1  # passes over a step's rollouts
    # Optimizer steps per pass (rollouts split evenly). Not stated by the paper. With a single step a step the clip
    # and the KL are inert (the policy being trained is the rollout policy: ratio 1, zero KL gradient); from the
    # second minibatch on they act, so the default is 4.
    minibatches: int = 4
    micro_batch_size: int = 8  # rollouts per replay forward (gradient accumulation; memory, not maths)
    rollout_batch_size: int = 64  # prompts per sampler call
    # While later rollouts are still sampled, hand each finished batch to the reward's `prepare` (the verifier
    # compiles them on the CPU); judging, which uses the GPU, still waits until sampling is done. One process only.
    overlap_reward_builds: bool = True
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # Replay attention: "dense" (a bool mask, SDPA; any shape, nothing to compile) or "flex" (a BlockMask; compiled
    # for each new row shape, and replay rows vary in length). "auto" = dense.
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.temperature <= 0:
            raise ValueError("RL samples: temperature must be > 0 (log-probs are taken at the sampling temperature)")
        if self.samples_per_task < 2:
            raise ValueError("samples_per_task must be >= 2 (advantages are z-scores within a task's samples)")
        if self.attention_backend not in ("auto", "dense", "flex"):
            raise ValueError(f"attention_backend must be 'auto', 'dense' or 'flex', got {self.attention_backend!r}")
        if self.strategy not in ("static", "dynamic"):
            raise ValueError(f"strategy must be 'static' or 'dynamic', got {self.strategy!r}")
        if self.denoising_steps < 1 or self.denoising_steps > self.block_size:
            raise ValueError("denoising_steps must be in [1, block_size]")
        for name in ("steps", "tasks_per_step", "checkpoint_every", "ppo_epochs", "minibatches", "micro_batch_size",
                     "rollout_batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass
class RLTask:
    """A task: the chat prompt the model answers, the KernelBench-format reference its kernel is judged against, and
    a difficulty label (number, or numeric string) for easy->hard scheduling. Stage 1 (infilling) tasks also hold the
    `prefix` and `suffix` of the file: the reward judges prefix + generated middle + suffix."""

    task_id: str
    messages: list[dict]
    reference_src: str
    difficulty: int | float | str = 0
    prefix: str | None = None
    suffix: str | None = None


# ----------------------------------------------------------------------------------------------- data scheduling


def difficulty_key(task: RLTask) -> float:
    try:
        return float(task.difficulty)
    except (TypeError, ValueError):
        raise ValueError(f"task {task.task_id}: difficulty {task.difficulty!r} is not a number") from None


def order_easy_to_hard(tasks: Sequence[RLTask]) -> list[RLTask]:
    """Tasks by increasing difficulty; ties keep their input order (a stable sort)."""
    return sorted(tasks, key=difficulty_key)


def tasks_for_step(ordered: Sequence[RLTask], step: int, tasks_per_step: int) -> list[RLTask]:
    """The tasks of step `step` (1-based) when walking `ordered` in order, `tasks_per_step` at a time, starting
    over from the beginning when the walk runs off the end. Depends on the step index alone: a restarted run
    gets exactly the tasks the interrupted one would have."""
    if not ordered:
        raise ValueError("no tasks")
    start = (step - 1) * tasks_per_step
    return [ordered[(start + i) % len(ordered)] for i in range(tasks_per_step)]


def schedule(tasks: Sequence[RLTask], steps: int, tasks_per_step: int) -> list[list[RLTask]]:
    """The whole easy->hard walk: for each step 1..steps, its tasks (`tasks_for_step` on the sorted tasks)."""
    ordered = order_easy_to_hard(tasks)
    return [tasks_for_step(ordered, step, tasks_per_step) for step in range(1, steps + 1)]


def task_order_fingerprint(tasks: Sequence[RLTask]) -> str:
    """A hash of the scheduled order of task ids: a resumed run must walk the same list."""
    ids = "\n".join(t.task_id for t in order_easy_to_hard(tasks))
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- advantages


def group_advantages(groups: Sequence[Sequence[float | None]]) -> list[list[float | None] | None]:
    """Z-scores of rewards within each group (one task's G samples): (r - mean) / std, population std.

    A reward of None (the judge failed on that rollout) takes no part: it gets no advantage and is left out of the
    mean and std. A group whose remaining rewards are all equal (or fewer than two) carries no signal and is
    dropped: None in its place."""
    result: list[list[float | None] | None] = []
    for rewards in groups:
        valid = [r for r in rewards if r is not None]
        if len(valid) < 2:
            result.append(None)
            continue
        mean = sum(valid) / len(valid)
        std = math.sqrt(sum((r - mean) ** 2 for r in valid) / len(valid))
        if std == 0.0:
            result.append(None)
            continue
        result.append([None if r is None else (r - mean) / std for r in rewards])
    return result


# --------------------------------------------------------------------------------------------------------- loss


def trace_rl_token_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                        clip: float, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token TraceRL loss: -min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A) + kl_coef * k3, with
    ratio = exp(logp - old) and k3 = exp(old - logp) - (old - logp) - 1 (Schulman's estimator of KL(new || old),
    the rollout policy as reference). Returns (loss, k3, clipped), each per token; callers take the token mean."""
    old_log_probs = old_log_probs.detach()
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    k3 = torch.exp(-log_ratio) + log_ratio - 1.0
    loss = -torch.minimum(unclipped, clipped) + kl_coef * k3
    return loss, k3, (ratio - 1.0).abs() > clip


# ------------------------------------------------------------------------------------------------------ rollouts


@dataclass
class Rollout:
    """One sampled completion and its trace. `block_tokens`/`block_steps` are the decoded blocks as the sampler left
    them (tokens after an EOS inside its block kept: they were part of the states), the forward index that
    committed each (-1 never); the response is the first `length` of them."""

    task_index: int  # into the step's task list
    sample_index: int
    prompt_ids: list[int]
    block_tokens: torch.Tensor  # [blocks x block_size] long, CPU
    block_steps: torch.Tensor  # [blocks x block_size] long, CPU
    length: int
    text: str = ""


def prompt_ids_for(tokenizer, task: RLTask) -> list[int]:
    """The chat prompt as token ids, as SFT tokenizes it (Qwen3 template, generation prompt added)."""
    text = tokenizer.apply_chat_template(task.messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def generate_rollouts(model, tokenizer, tasks: Sequence[RLTask], config: RLConfig,
                      generator: torch.Generator | None = None,
                      on_batch: Callable[[list[Rollout]], None] | None = None) -> list[Rollout]:
    """G samples of every task (task-major order), `rollout_batch_size` prompts per sampler call; `on_batch` gets
    each call's rollouts as soon as they exist."""
    model.eval()
    prompts = [prompt_ids_for(tokenizer, task) for task in tasks]
    jobs = [(t, g) for t in range(len(tasks)) for g in range(config.samples_per_task)]
    rollouts: list[Rollout] = []
    for start in range(0, len(jobs), config.rollout_batch_size):
        chunk = jobs[start:start + config.rollout_batch_size]
        result = block_diffusion_generate(
            model, [prompts[t] for t, _ in chunk], config.max_new_tokens, block_size=config.block_size,
            steps=config.denoising_steps, strategy=config.strategy, threshold=config.threshold,
            temperature=config.temperature, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            mask_token_id=model.config.mask_token_id, generator=generator)
        for row, (t, g) in enumerate(chunk):
            length = int(result.lengths[row])
            blocks = -(-length // config.block_size) * config.block_size
            rollouts.append(Rollout(t, g, prompts[t], result.block_tokens[row, :blocks].clone(),
                                    result.block_unmask_steps[row, :blocks].clone(), length,
                                    tokenizer.decode(result.tokens[row, :length], skip_special_tokens=True)))
        if on_batch is not None:
            on_batch(rollouts[-len(chunk):])
    return rollouts


# ------------------------------------------------------------------------------------------------- trace replay


@dataclass
class TraceBatch:
    """The replay forward of one denoising-step index for a few rollouts: packed `[noisy blocks ; prompt + clean
    response]` rows (a `BlockDiffusionBatch`: its `targets` at `scored_index` are the tokens committed at that step),
    and for each scored position the index of its token in the flat list of all rollouts' response tokens."""

    batch: BlockDiffusionBatch
    token_index: torch.Tensor  # [num scored] long, aligned with batch.scored_index

    def to(self, device) -> "TraceBatch":
        return TraceBatch(self.batch.to(device), self.token_index.to(device))


def token_offsets(rollouts: Sequence[Rollout]) -> list[int]:
    """Start of each rollout's response tokens in the flat token list (rollout-major, then position)."""
    offsets, total = [], 0
    for rollout in rollouts:
        offsets.append(total)
        total += rollout.length
    return offsets + [total]


def trace_batches(rollouts: Sequence[Rollout], block_size: int, steps: int, mask_token_id: int,
                  pad_token_id: int = 0, offsets: Sequence[int] | None = None,
                  row_multiple: int = 1) -> Iterator[TraceBatch]:
    """For s = 0..steps-1, the replay batch of denoising step s (skipped when no token was committed at step s).

    Row of a rollout: for every block with a token committed at its step s, a noisy copy of the block (tokens its
    block committed at earlier steps revealed, the rest MASK; scored: the tokens committed at step s), then the
    clean prompt and the clean response blocks before the last one. Position ids follow the sequence, block ids
    align the response's blocks to block boundaries as the sampler did (it left-pads the prompt to a whole block;
    RoPE is relative, so the shifted positions give the same attention), and the block-diffusion mask of
    diffusion.py gives exactly the sampler's visibility: a noisy block sees itself and earlier clean blocks."""
    offsets = token_offsets(rollouts) if offsets is None else offsets
    for step in range(steps):
        rows = []
        for r, rollout in enumerate(rollouts):
            row = _trace_row(rollout, step, block_size, mask_token_id, offsets[r])
            if row is not None:
                rows.append(row)
        if not rows:
            continue
        length = max(row["input_ids"].numel() for row in rows)
        length = -(-length // row_multiple) * row_multiple
        shape = (len(rows), length)
        fields = dict(input_ids=torch.full(shape, pad_token_id, dtype=torch.long),
                      position_ids=torch.zeros(shape, dtype=torch.long),
                      segment_ids=torch.full(shape, -1, dtype=torch.long),
                      block_ids=torch.zeros(shape, dtype=torch.long),
                      is_noisy=torch.zeros(shape, dtype=torch.bool),
                      targets=torch.full(shape, IGNORE_INDEX, dtype=torch.long),
                      token_index=torch.full(shape, -1, dtype=torch.long))
        for i, row in enumerate(rows):
            n = row["input_ids"].numel()
            for name, value in row.items():
                fields[name][i, :n] = value
            fields["segment_ids"][i, :n] = i
        token_index = fields.pop("token_index").flatten()
        scored_index = torch.nonzero(token_index >= 0).flatten()
        scored = scored_index.numel()
        batch = BlockDiffusionBatch(**fields, loss_weights=(fields["targets"] != IGNORE_INDEX).float(),
                                    scored_index=scored_index, num_answer_tokens=scored,
                                    num_clean_tokens=int((~fields["is_noisy"] & (fields["segment_ids"] >= 0)).sum()),
                                    num_samples=len(rows))
        yield TraceBatch(batch, token_index[scored_index])


def _trace_row(rollout: Rollout, step: int, block_size: int, mask_token_id: int, offset: int) -> dict | None:
    prompt = torch.as_tensor(rollout.prompt_ids, dtype=torch.long)
    prompt_length = prompt.numel()
    shift = (-prompt_length) % block_size  # the sampler's left padding: response blocks start on a boundary
    num_blocks = -(-rollout.length // block_size)
    tokens = rollout.block_tokens[:num_blocks * block_size].view(num_blocks, block_size)
    forwards = rollout.block_steps[:num_blocks * block_size].view(num_blocks, block_size)
    in_response = (torch.arange(num_blocks * block_size) < rollout.length).view(num_blocks, block_size)
    committed = forwards >= 0
    if bool((in_response & ~committed).any()):
        raise ValueError("a response token has no recorded unmask step: the trace is incomplete")
    # A block's denoising step s is its first forward + s (each step commits at least one token until it is done).
    first = torch.where(committed, forwards, torch.iinfo(torch.long).max).min(dim=1, keepdim=True).values
    this_step = first + step
    scored = (forwards == this_step) & in_response
    blocks = torch.nonzero(scored.any(dim=1)).flatten()
    if blocks.numel() == 0:
        return None
    revealed = committed & (forwards < this_step)
    noisy_tokens = torch.where(revealed, tokens, mask_token_id)[blocks].flatten()
    noisy_positions = (prompt_length + blocks[:, None] * block_size + torch.arange(block_size)).flatten()
    token_position = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()
    noisy_scored = scored[blocks].flatten()
    clean = torch.cat((prompt, tokens[:-1].flatten()))
    clean_positions = torch.arange(clean.numel())
    positions = torch.cat((noisy_positions, clean_positions))
    noisy_count = noisy_tokens.numel()
    return dict(
        input_ids=torch.cat((noisy_tokens, clean)),
        position_ids=positions,
        block_ids=(positions + shift) // block_size,
        is_noisy=torch.arange(positions.numel()) < noisy_count,
        targets=torch.cat((torch.where(noisy_scored, tokens[blocks].flatten(), IGNORE_INDEX),
                           torch.full((clean.numel(),), IGNORE_INDEX, dtype=torch.long))),
        token_index=torch.cat((torch.where(noisy_scored, offset + token_position, -1),
                               torch.full((clean.numel(),), -1, dtype=torch.long))),
    )


def trace_forward(model, trace: TraceBatch, temperature: float, attention_backend: str = "auto") -> torch.Tensor:
    """Log-probs [num scored] of the committed tokens under the states of `trace`, at the sampling temperature and
    with the MASK token excluded, as the sampler drew them (generate.sample_tokens)."""
    batch = trace.batch
    mask = build_attention_mask(batch, "dense" if attention_backend == "auto" else attention_backend)
    hidden = model.model(batch.input_ids, batch.position_ids, mask).last_hidden_state
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.scored_index)
    logits = model.lm_head(picked).float()
    logits[:, model.config.mask_token_id] = float("-inf")
    targets = batch.targets.flatten().index_select(0, batch.scored_index)
    return -torch.nn.functional.cross_entropy(logits / temperature, targets, reduction="none")


def _row_multiple(device) -> int:
    """Replay rows are padded to a multiple of this: flex's 128-token tiles, aligned masks for SDPA's kernels."""
    return 128 if torch.device(device).type == "cuda" else 1


def trace_log_probs(model, rollouts: Sequence[Rollout], config: RLConfig) -> torch.Tensor:
    """Log-probs of every response token of `rollouts` (flat, rollout-major) by replaying the traces, without
    gradients, `micro_batch_size` rollouts a forward."""
    device = next(model.parameters()).device
    offsets = token_offsets(rollouts)
    out = torch.zeros(offsets[-1], dtype=torch.float32, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    with torch.no_grad(), autocast:
        for start in range(0, len(rollouts), config.micro_batch_size):
            micro = rollouts[start:start + config.micro_batch_size]
            for trace in trace_batches(micro, config.block_size, config.denoising_steps, model.config.mask_token_id,
                                       offsets=offsets[start:start + len(micro)],
                                       row_multiple=_row_multiple(device)):
                trace = trace.to(device)
                out[trace.token_index] = trace_forward(model, trace, config.temperature, config.attention_backend)
    return out


# ------------------------------------------------------------------------------------------------------- rewards


def score_completions(reward_fn: RewardFn, tasks: Sequence[RLTask],
                      completions: Sequence[tuple[int, str]]) -> list[RewardOutcome]:
    """Judge (task index, completion text) pairs in ONE reward call. If the call raises, each request is retried
    alone, so a failure costs only the rollouts it concerns their reward (recorded as `infrastructure_error`),
    never the step."""
    requests = [RewardRequest(tasks[t], text, candidate_source(tasks[t], text)) for t, text in completions]
    try:
        outcomes = reward_fn(requests)
        if len(outcomes) != len(requests):
            raise RuntimeError(f"reward returned {len(outcomes)} outcomes for {len(requests)} requests")
        return list(outcomes)
    except Exception:  # noqa: BLE001 - find which requests fail, one at a time
        pass
    outcomes = []
    for request in requests:
        try:
            (outcome,) = reward_fn([request])
        except Exception as exc:  # noqa: BLE001 - the judge failed on this rollout
            outcome = infrastructure_failure(f"{type(exc).__name__}: {exc}")
        outcomes.append(outcome)
    return outcomes


# ---------------------------------------------------------------------------------------------------- processes


class Processes:
    """This process's place in a `torchrun` job (rank, world size), or a lone process. Without an initialised
    process group every collective is the identity, so the same training code runs on one device and across
    several (data parallel: each rank samples its share of the step's tasks, rank 0 calls the reward for all of
    them, gradients are summed across ranks before each optimizer step, as DDP does)."""

    def __init__(self) -> None:
        dist = torch.distributed
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1

    def sum(self, value: float, device) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def gather(self, items: list) -> list:
        """Every rank's list, concatenated in rank order, on every rank."""
        if not self.active:
            return list(items)
        gathered: list = [None] * self.world
        torch.distributed.all_gather_object(gathered, items)
        return [item for part in gathered for item in part]

    def from_rank_zero(self, value):
        if not self.active:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def sum_gradients(self, model) -> None:
        if not self.active:
            return
        for parameter in model.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            torch.distributed.all_reduce(parameter.grad)

    def same_parameters(self, model) -> None:
        """Start every rank from rank 0's weights."""
        if self.active:
            for tensor in list(model.parameters()) + list(model.buffers()):
                torch.distributed.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()


# --------------------------------------------------------------------------------------------------------- update


def ppo_update(model, optimizer, rollouts: Sequence[Rollout], advantages: Sequence[float], config: RLConfig,
               step: int, processes: Processes | None = None) -> dict:
    """PPO-clip epochs over `rollouts` (each with its advantage): old log-probs by replay under the rollout policy,
    then `minibatches` optimizer steps a pass, each on the token mean of its rollouts' TraceRL loss. Micro-batches
    (and ranks) accumulate gradients exactly: each contributes its token sum over the minibatch's token count
    (summed over ranks). Every rank takes the same optimizer steps, with the summed gradients."""
    processes = processes or Processes()
    device = next(model.parameters()).device
    # With one optimizer step a step, the policy being trained IS the rollout policy: its own (detached) log-probs
    # are the old ones, saving a replay. Otherwise they are replayed once, before the first step changes it.
    single_step = config.ppo_epochs == 1 and config.minibatches == 1
    old = None if single_step else trace_log_probs(model, rollouts, config)
    offsets = token_offsets(rollouts)
    token_advantages = torch.tensor([a for r, a in zip(rollouts, advantages) for _ in range(r.length)],
                                    dtype=torch.float32, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    shuffler = random.Random(f"{config.seed}:{step}:{processes.rank}")
    losses, kl_sum, clipped_sum, tokens_seen, grad_norms = [], 0.0, 0, 0, []
    model.train()
    for _ in range(config.ppo_epochs):
        order = list(range(len(rollouts)))
        shuffler.shuffle(order)
        for k in range(config.minibatches):
            chosen = order[k * len(order) // config.minibatches:(k + 1) * len(order) // config.minibatches]
            n_tokens = processes.sum(sum(rollouts[i].length for i in chosen), device)
            if n_tokens == 0:  # no rollout in this minibatch on any rank
                continue
            optimizer.zero_grad(set_to_none=True)
            minibatch_loss = 0.0
            for micro_start in range(0, len(chosen), config.micro_batch_size):
                micro = chosen[micro_start:micro_start + config.micro_batch_size]
                for trace in trace_batches([rollouts[i] for i in micro], config.block_size, config.denoising_steps,
                                           model.config.mask_token_id, offsets=[offsets[i] for i in micro],
                                           row_multiple=_row_multiple(device)):
                    trace = trace.to(device)
                    with autocast:
                        log_probs = trace_forward(model, trace, config.temperature, config.attention_backend)
                    old_log_probs = log_probs.detach() if old is None else old[trace.token_index]
                    loss, k3, clipped = trace_rl_token_loss(log_probs, old_log_probs,
                                                            token_advantages[trace.token_index], config.clip,
                                                            config.kl_coef)
                    (loss.sum() / n_tokens).backward()
                    minibatch_loss += loss.detach().sum().item() / n_tokens
                    kl_sum += k3.detach().sum().item()
                    clipped_sum += int(clipped.sum())
            processes.sum_gradients(model)
            tokens_seen += n_tokens
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)))
            optimizer.step()
            losses.append(processes.sum(minibatch_loss, device))
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    kl_sum, clipped_sum = processes.sum(kl_sum, device), processes.sum(clipped_sum, device)
    return dict(loss=sum(losses) / len(losses), kl=kl_sum / tokens_seen, clip_fraction=clipped_sum / tokens_seen,
                grad_norm=max(grad_norms), optimizer_steps=len(losses), tokens_trained=int(tokens_seen))


# ---------------------------------------------------------------------------------------------------- checkpoints


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The directory the `latest` pointer names, or None."""
    pointer = Path(out_dir) / "latest"
    if not pointer.exists():
        return None
    path = Path(out_dir) / pointer.read_text().strip()
    return path if path.is_dir() else None


def _rng_states() -> dict:
    states = dict(python=random.getstate(), torch=torch.get_rng_state())
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(out_dir: str | Path, step: int, model, tokenizer, optimizer, history: list[dict],
                    trainer_state: dict) -> Path:
    """`out_dir/step-N`: the model (`save_pretrained`), tokenizer, optimizer and RNG states, and the metrics log up
    to this step (`metrics.jsonl`); then `out_dir/latest` names it. Written to a temporary directory and renamed,
    and the pointer replaced atomically, so a kill at any moment leaves the previous checkpoint usable."""
    out_dir = Path(out_dir)
    final, scratch = out_dir / f"step-{step}", out_dir / f".step-{step}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    model.save_pretrained(scratch)
    if tokenizer is not None:
        tokenizer.save_pretrained(scratch)
    torch.save(dict(trainer_state, step=step, optimizer=optimizer.state_dict(), rng=_rng_states()),
               scratch / "trainer_state.pt")
    (scratch / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in history))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(scratch, final)
    pointer = out_dir / ".latest.partial"
    pointer.write_text(final.name)
    os.replace(pointer, out_dir / "latest")
    return final


def prune_checkpoints(out_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` step directories (never the one `latest` names); returns those deleted."""
    if not keep:
        return []
    latest = latest_checkpoint(out_dir)
    steps = sorted((int(p.name.split("-", 1)[1]), p) for p in Path(out_dir).glob("step-*")
                   if p.is_dir() and p.name.split("-", 1)[1].isdigit())
    doomed = [p for _, p in steps[:-keep] if latest is None or p.resolve() != latest.resolve()]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def load_checkpoint(path: Path, model, optimizer) -> tuple[dict, list[dict]]:
    """Load a checkpoint's weights into `model` and state into `optimizer`; restore RNG states. Returns
    (trainer state, metrics history)."""
    loaded = type(model).from_pretrained(path, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())
    del loaded
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_states(state["rng"])
    history = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return state, history


# ------------------------------------------------------------------------------------------------------ training


def _step_generator(config: RLConfig, step: int, device, rank: int = 0) -> torch.Generator:
    """The sampler's random stream for a step (and rank): from the seed and the step index alone, so a resumed run
    draws what the uninterrupted one would have."""
    return torch.Generator(device=device).manual_seed((config.seed * 1_000_003 + step) * 1_009 + rank)


def _outcome_metrics(outcomes: Sequence[RewardOutcome]) -> dict:
    judged = [o for o in outcomes if not o.excluded]
    deceptive = [o for o in outcomes if o.deceptive]
    by_reason = Counter(code for o in deceptive for code in (o.reason_codes or ["unspecified"]))
    return dict(
        reward_mean=sum(o.reward for o in judged) / len(judged) if judged else None,
        rewarded=sum(1 for o in judged if o.reward > 0),
        reward_excluded=len(outcomes) - len(judged),
        deceptive=len(deceptive),
        deceptive_share=len(deceptive) / len(outcomes) if outcomes else 0.0,
        deceptive_by_reason=dict(sorted(by_reason.items())),
        deceptive_share_by_reason={code: count / len(outcomes) for code, count in sorted(by_reason.items())},
        status_counts=dict(sorted(Counter(o.status for o in outcomes).items())),
    )


def rl_step(model, tokenizer, optimizer, step_tasks: Sequence[RLTask], reward_fn: RewardFn, config: RLConfig,
            step: int, processes: Processes | None = None) -> dict:
    """One TraceRL step on `step_tasks`: rollouts, one reward call, group advantages, PPO update. Returns its
    metrics, the same on every rank (the update is skipped, and says so, when every group is dropped).

    Across ranks: rank r samples tasks r, r + world, ...; rank 0 judges every rollout in one reward call and
    shares the outcomes; each rank trains on its own rollouts with the summed gradients."""
    processes = processes or Processes()
    device = next(model.parameters()).device
    started = time.perf_counter()
    mine = list(range(processes.rank, len(step_tasks), processes.world))
    preparing, prepare_seconds = [], [0.0]
    on_batch = None
    if config.overlap_reward_builds and hasattr(reward_fn, "prepare") and processes.world == 1:
        background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-prepare")

        def prepare(requests: list[RewardRequest]) -> None:
            began = time.perf_counter()
            reward_fn.prepare(requests)
            prepare_seconds[0] += time.perf_counter() - began

        def on_batch(batch: list[Rollout]) -> None:
            requests = [RewardRequest(step_tasks[r.task_index], r.text, candidate_source(step_tasks[r.task_index],
                                                                                            r.text)) for r in batch]
            preparing.append(background.submit(prepare, requests))

    rollouts = generate_rollouts(model, tokenizer, [step_tasks[i] for i in mine], config,
                                 _step_generator(config, step, device, processes.rank), on_batch)
    for rollout in rollouts:
        rollout.task_index = mine[rollout.task_index]  # index into the step's tasks
    everyone = processes.gather([(r.task_index, r.sample_index, r.text, r.length) for r in rollouts])
    rollout_done = time.perf_counter()
    for future in preparing:  # builds still running: the judging call would only wait for them itself
        future.result()
    if preparing:
        background.shutdown()
    outcomes = None
    if processes.rank == 0:
        outcomes = score_completions(reward_fn, step_tasks, [(t, text) for t, _, text, _ in everyone])
    outcomes = processes.from_rank_zero(outcomes)
    reward_done = time.perf_counter()

    groups: list[list[float | None]] = [[None] * config.samples_per_task for _ in step_tasks]
    for (t, g, _, _), outcome in zip(everyone, outcomes):
        groups[t][g] = None if outcome.excluded else float(outcome.reward)
    advantages = group_advantages(groups)
    chosen = [(r, advantages[r.task_index][r.sample_index]) for r in rollouts
              if advantages[r.task_index] is not None and advantages[r.task_index][r.sample_index] is not None]
    record = dict(step=step, stage=config.stage, tasks=len(step_tasks), task_ids=[t.task_id for t in step_tasks],
                  samples=len(everyone), tokens_generated=sum(length for *_, length in everyone),
                  groups_used=sum(a is not None for a in advantages),
                  groups_dropped=sum(a is None for a in advantages), **_outcome_metrics(outcomes),
                  lr=optimizer.param_groups[0]["lr"])
    if record["groups_used"]:
        record.update(ppo_update(model, optimizer, [r for r, _ in chosen], [a for _, a in chosen], config, step,
                                 processes), update="applied")
    else:
        record.update(loss=None, kl=None, clip_fraction=None, grad_norm=None, optimizer_steps=0, tokens_trained=0,
                      update="skipped: every group had equal rewards (no signal)")
    finished = time.perf_counter()
    # seconds_reward: what the policy waited for the reward after sampling ended. seconds_reward_prepare: the time
    # the reward spent preparing (building) batches handed to it during sampling (the part that ran after sampling
    # ended is also in seconds_reward).
    record.update(seconds_rollout=rollout_done - started, seconds_reward=reward_done - rollout_done,
                  seconds_reward_prepare=prepare_seconds[0], seconds_update=finished - reward_done,
                  seconds=finished - started, ranks=processes.world)
    return record


def train_rl(model, tokenizer, tasks: Sequence[RLTask], reward_fn: RewardFn, config: RLConfig, out_dir: str | Path,
             resume: bool = True, on_step: Callable[[dict], None] | None = None,
             progress: bool = False) -> list[dict]:
    """Run one RL stage on `model` (in place) and return the metrics history (one record per step, earlier runs'
    records included when resuming).

    Tasks are walked easy->hard, `tasks_per_step` a step. Every `checkpoint_every` steps, at the last step, and when
    `max_seconds` runs out, a checkpoint goes to `out_dir/step-N` (see `save_checkpoint`); each step's record is
    also appended to `out_dir/metrics.jsonl`. With `resume`, a run finding `out_dir/latest` continues after that
    step with the same data order and random streams (refusing a different task list or schedule settings).

    Under `torchrun` (a process group initialised by the caller), every rank calls this with the same arguments and
    its own device: ranks share each step's tasks (see `rl_step`), rank 0 alone calls the reward, writes
    checkpoints and logs, and calls `on_step`; every rank returns the same history."""
    processes = Processes()
    lead = processes.rank == 0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    if config.block_size != model.config.block_size:
        raise ValueError(f"RLConfig.block_size {config.block_size} != the model's {model.config.block_size}")
    if next(model.parameters()).dtype != torch.float32:
        warnings.warn(f"RL on {next(model.parameters()).dtype} weights: AdamW steps at lr {config.learning_rate:g} "
                      "mostly round away; load the model in float32 (the replay runs under bf16 autocast on GPUs)")
    ordered = order_easy_to_hard(tasks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.999),
                                  weight_decay=config.weight_decay, fused=device.type == "cuda")
    # What fixes the data order and the random streams: a resumed run must agree on all of it.
    identity = dict(fingerprint=task_order_fingerprint(tasks), seed=config.seed, stage=config.stage,
                    tasks_per_step=config.tasks_per_step, samples_per_task=config.samples_per_task)
    history: list[dict] = []
    first_step = 1
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if checkpoint is not None:
        state, history = load_checkpoint(checkpoint, model, optimizer)
        differs = {k: (state["identity"].get(k), v) for k, v in identity.items() if state["identity"].get(k) != v}
        if differs:
            raise ValueError(f"{checkpoint} was trained with a different schedule (saved, now): {differs}; "
                             "use a new out_dir or resume=False")
        first_step = state["step"] + 1
    processes.same_parameters(model)
    if lead:
        (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate

    bar = None
    if progress and lead:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.steps, initial=first_step - 1, desc=f"RL {config.stage}", unit="step")
    started = time.perf_counter()
    wall_before = history[-1]["wall_seconds"] if history else 0.0
    for step in range(first_step, config.steps + 1):
        record = rl_step(model, tokenizer, optimizer, tasks_for_step(ordered, step, config.tasks_per_step),
                         reward_fn, config, step, processes)
        record["wall_seconds"] = wall_before + time.perf_counter() - started
        record["tokens_seen"] = (history[-1]["tokens_seen"] if history else 0) + record["tokens_generated"]
        out_of_time = processes.from_rank_zero(
            config.max_seconds is not None and time.perf_counter() - started >= config.max_seconds)
        save = step % config.checkpoint_every == 0 or step == config.steps or out_of_time
        record["checkpoint"] = str(out_dir / f"step-{step}") if save else None
        history.append(record)
        if save and lead:
            save_checkpoint(out_dir, step, model, tokenizer, optimizer, history,
                            dict(identity=identity, config=asdict(config)))
            prune_checkpoints(out_dir, config.keep_checkpoints)
        if save:
            processes.barrier()
        if lead:
            with open(out_dir / "metrics.jsonl", "a") as log:
                log.write(json.dumps(record) + "\n")
            if on_step is not None:
                on_step(record)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean'] or 0:.3f}", deceptive=record["deceptive"],
                            groups=record["groups_used"])
        if out_of_time:
            break
    if bar is not None:
        bar.close()
    return history
