"""TraceRL for the block-diffusion LM (DICE's BiC-RL stages), readable top to bottom.

A step: take the next `tasks_per_step` tasks of the easy->hard schedule (training/tasks.py), sample G completions
per task with the block-diffusion sampler (which records the forward that committed each token: the trace), judge
them all in one reward call, turn rewards into z-scores within each task's group (groups whose samples all score the
same are dropped), and take PPO-clip steps on the log-probs of the committed tokens computed by replaying the trace
(training/trace.py: each token scored under the state the sampler saw when it committed it, in SFT's layout, block
partition and prediction shift). A k3 KL against the rollout policy keeps the update near it. Checkpoints are the
one format of training/checkpoints.py. Under `torchrun` the policy is replicated or sharded (FSDP2,
training/parallel.py); a sharded policy samples through an unsharded replica refreshed at each step.

GPU-side code: torch, transformers (the model) and the standard library; the reward is a pluggable callable
(training/rewards.py: the verifier's isolated workers, or static checks only on hosts without a GPU).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from training.checkpoints import latest_checkpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from training.blocks import decoded_span_end
from training.distributed import Processes
from training.parallel import (ParallelSettings, RolloutReplica, autocast, clip_gradients, compute_dtype, is_sharded,
                               prepare_model)
from training.rewards import (RewardFn, RewardOutcome, RewardRequest, candidate_source,
                              infrastructure_failure)
from training.tasks import RLTask, order_easy_to_hard, task_order_fingerprint, tasks_for_step
from training.trace import Rollout, TraceBatch, generate_rollouts, model_trace_batches, token_offsets, \
    trace_forward, trace_log_probs

STAGES = ("infilling", "end_to_end")


# --------------------------------------------------------------------------------------------------------- config


@dataclass
class RLConfig(ParallelSettings):
    """One RL stage. Defaults are DICE's (NOTES.md section 1) where the paper states them. Running across processes
    (DDP or FSDP, activation checkpointing, mixed precision): ParallelSettings' fields."""

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
    confidence_threshold: float = 0.9  # dynamic unmasking: commit every token more confident than this
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
        self.check_parallel_settings()
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


# --------------------------------------------------------------------------------------------------------- update


def ppo_update(model, optimizer, rollouts: Sequence[Rollout], advantages: Sequence[float], config: RLConfig,
               step: int, processes: Processes | None = None, rollout_model=None) -> dict:
    """PPO-clip epochs over `rollouts` (each with its advantage): old log-probs by replay under the rollout policy,
    then `minibatches` optimizer steps a pass, each on the token mean of its rollouts' TraceRL loss. Micro-batches
    (and ranks) accumulate gradients exactly: each contributes its token sum over the minibatch's token count
    (summed over ranks). Every rank takes the same optimizer steps, with the summed gradients.

    `rollout_model`: the (unsharded) weights the rollouts were sampled with, for the old log-probs; required for a
    sharded `model`, whose every forward is a collective: there each rank runs as many replay forwards as the
    busiest rank, the extra ones on a one-token filler whose loss is scaled to nothing."""
    processes = processes or Processes()
    device = next(model.parameters()).device
    sharded = is_sharded(model)
    # With one optimizer step a step, the policy being trained IS the rollout policy: its own (detached) log-probs
    # are the old ones, saving a replay. Otherwise they are replayed once, before the first step changes it.
    single_step = config.ppo_epochs == 1 and config.minibatches == 1
    if sharded and rollout_model is None and not single_step:
        raise ValueError("a sharded policy needs its rollout replica for the old log-probs")
    old = None if single_step else trace_log_probs(rollout_model or model, rollouts, config)
    offsets = token_offsets(rollouts)
    token_advantages = torch.tensor([a for r, a in zip(rollouts, advantages) for _ in range(r.length)],
                                    dtype=torch.float32, device=device)
    # FSDP averages gradients over the ranks; the objective wants their sum (the replicated path sums by hand).
    scale = processes.world if sharded else 1
    filler = _filler_trace(model, config) if sharded else None
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
            traces = [trace for start in range(0, len(chosen), config.micro_batch_size)
                      for trace in model_trace_batches(model, [rollouts[i] for i in chosen[start:start +
                                                                                            config.micro_batch_size]],
                                                       config, [offsets[i] for i in chosen[start:start +
                                                                                            config.micro_batch_size]])]
            forwards = int(processes.max(len(traces), device)) if sharded else len(traces)
            minibatch_loss = 0.0
            for index in range(forwards):
                if index >= len(traces):  # this rank is done: pair the busier ranks' collectives
                    with autocast(device, config.mixed_precision):
                        (trace_forward(model, filler, config.temperature, config.attention_backend).sum()
                         * 0.0).backward()
                    continue
                trace = traces[index]
                with autocast(device, config.mixed_precision):
                    log_probs = trace_forward(model, trace, config.temperature, config.attention_backend)
                old_log_probs = log_probs.detach() if old is None else old[trace.token_index]
                loss, k3, clipped = trace_rl_token_loss(log_probs, old_log_probs, token_advantages[trace.token_index],
                                                        config.clip, config.kl_coef)
                (loss.sum() / n_tokens * scale).backward()
                minibatch_loss += loss.detach().sum().item() / n_tokens
                kl_sum += k3.detach().sum().item()
                clipped_sum += int(clipped.sum())
            if not sharded:
                processes.sum_gradients(model)
            tokens_seen += n_tokens
            grad_norms.append(clip_gradients(model, config.grad_clip))
            optimizer.step()
            losses.append(processes.sum(minibatch_loss, device))
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    kl_sum, clipped_sum = processes.sum(kl_sum, device), processes.sum(clipped_sum, device)
    return dict(loss=sum(losses) / len(losses), kl=kl_sum / tokens_seen, clip_fraction=clipped_sum / tokens_seen,
                grad_norm=max(grad_norms), optimizer_steps=len(losses), tokens_trained=int(tokens_seen))


def _filler_trace(model, config: RLConfig) -> TraceBatch:
    """The replay of a one-token answer to a one-token prompt: the cheapest forward a sharded model can run to
    take part in another rank's collectives."""
    pad = model.config.pad_token_id or 0
    span = decoded_span_end(1, 1, config.block_size) - 1
    steps = torch.full((span,), -1, dtype=torch.long)
    steps[0] = 0
    rollout = Rollout(0, 0, [pad], torch.full((span,), pad, dtype=torch.long), steps, length=1)
    return next(model_trace_batches(model, [rollout], config, [0, 1]))


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
            step: int, processes: Processes | None = None, replica: RolloutReplica | None = None) -> dict:
    """One TraceRL step on `step_tasks`: rollouts, one reward call, group advantages, PPO update. Returns its
    metrics, the same on every rank (the update is skipped, and says so, when every group is dropped).

    Across ranks: rank r samples tasks r, r + world, ...; rank 0 judges every rollout in one reward call and
    shares the outcomes; each rank trains on its own rollouts with the summed gradients. A sharded `model` samples
    through `replica`, refreshed from its shards first."""
    processes = processes or Processes()
    rollout_model = model if replica is None else replica.sync()
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

    rollouts = generate_rollouts(rollout_model, tokenizer, [step_tasks[i] for i in mine], config,
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
                                 processes, None if replica is None else rollout_model), update="applied")
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

    Under `torchrun` (a process group initialised by the caller), every rank calls this with the same arguments:
    ranks share each step's tasks (see `rl_step`), rank 0 alone calls the reward, writes the logs and calls
    `on_step`; every rank returns the same history. `model` (on the CPU or a device) is replicated or sharded onto
    this rank's device as `config.parallelism` says."""
    processes = Processes()
    lead = processes.rank == 0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.block_size != model.config.block_size:
        raise ValueError(f"RLConfig.block_size {config.block_size} != the model's {model.config.block_size}")
    if next(model.parameters()).dtype != torch.float32:
        warnings.warn(f"RL on {next(model.parameters()).dtype} weights: AdamW steps at lr {config.learning_rate:g} "
                      "mostly round away; load the model in float32 (the replay runs under bf16 autocast on GPUs)")
    strategy = prepare_model(model, config, processes)
    device = processes.device()
    replica = RolloutReplica(model, compute_dtype(config.mixed_precision, device), device) \
        if strategy == "fsdp" else None
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
                         reward_fn, config, step, processes, replica)
        record["wall_seconds"] = wall_before + time.perf_counter() - started
        record["strategy"] = strategy
        record["tokens_seen"] = (history[-1]["tokens_seen"] if history else 0) + record["tokens_generated"]
        out_of_time = processes.from_rank_zero(
            config.max_seconds is not None and time.perf_counter() - started >= config.max_seconds)
        save = step % config.checkpoint_every == 0 or step == config.steps or out_of_time
        record["checkpoint"] = str(out_dir / f"step-{step}") if save else None
        history.append(record)
        if save:
            save_checkpoint(out_dir, step, model, tokenizer, optimizer,
                            dict(stage=f"rl_{config.stage}", identity=identity, config=asdict(config),
                                 world_size=processes.world, strategy=strategy), history,
                            config.keep_checkpoints, processes)
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


# ---------------------------------------------------------------------------------------------------------- stage
RL_STAGE_NAMES = {"rl_infilling": "infilling", "rl_end_to_end": "end_to_end"}  # -> RLConfig.stage


def rl_config_for(stage: str, values: dict | None) -> RLConfig:
    """`RLConfig` for a stage from a dict of its fields (DICE's settings are RLConfig's defaults: lr 1e-6, clip 0.2,
    KL 0.01, G=16, 64 tasks a step, temperature 1.0, block 4, 4 steps, confidence threshold 0.9)."""
    known = {f.name for f in dataclasses.fields(RLConfig)}
    unknown = set(values or {}) - known
    if unknown:
        raise ValueError(f"unknown RL config keys: {sorted(unknown)} (RLConfig has {sorted(known)})")
    return RLConfig(**{**(values or {}), "stage": RL_STAGE_NAMES[stage]})


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
    its latest step) on the tasks in `tasks_path`, via `train_rl`; checkpoints in `out_dir/step-N` + `latest`. Under
    torchrun every rank samples its share of each step's rollouts and rank 0 calls the reward."""
    from training.convert import load_base
    from training.data import read_rows
    from training.tasks import rl_tasks_from_rows

    rl_config = rl_config_for(stage, config)
    out_dir = Path(out_dir)
    processes = Processes.join(one_process_group=rl_config.parallelism == "fsdp")
    if processes.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    processes.barrier()
    device = processes.device()
    model, tokenizer = load_base(str(base), block_size=rl_config.block_size)
    tasks = rl_tasks_from_rows(read_rows(tasks_path), stage)
    if not tasks:
        raise ValueError(f"{tasks_path}: no RL tasks")

    started = time.perf_counter()
    reward_fn = build_reward(reward, verify_config, reward_timeout_s)
    history = train_rl(model, tokenizer, tasks, reward_fn, rl_config, out_dir, resume=resume, on_step=on_step)
    return dict(stage=stage, checkpoint=str(resolve_checkpoint(out_dir)), out_dir=str(out_dir),
                step=history[-1]["step"] if history else 0, total_steps=rl_config.steps, tasks=len(tasks),
                tokens_seen=int(history[-1].get("tokens_seen") or sum(r.get("tokens_generated") or 0 for r in history)
                                if history else 0),
                seconds=round(history[-1]["wall_seconds"] if history else time.perf_counter() - started, 3),
                reward=reward, reward_description=getattr(reward_fn, "description", reward), device=str(device),
                world_size=processes.world, base=str(base), config=dataclasses.asdict(rl_config),
                optimizer_steps=sum(r.get("optimizer_steps") or 0 for r in history),
                rewarded_groups=sum(r.get("groups_used") or 0 for r in history), history=history)
