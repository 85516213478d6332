"""The staged recipe's command line: each stage reads files and writes a checkpoint directory (`step-N/` + `latest`,
training/checkpoints.py), so it runs the same under Dagster (through Pipes, under `torchrun`), from a shell, or on a
GPU host with only torch + transformers installed (`python -m training.stages --help`). This module only dispatches:
`convert` (SDAR's conversion step, training/convert.py) -> `sft` (training/sft.py) -> `rl_infilling` ->
`rl_end_to_end` (BiC-RL, training/rl.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from training.checkpoints import LATEST, resolve_checkpoint
from training.data import chat_prompt, read_rows, training_texts, write_jsonl

STAGES = ("convert", "sft", "rl_infilling", "rl_end_to_end")
log = logging.getLogger("training.stages")
__all__ = ["LATEST", "STAGES", "chat_prompt", "main", "read_rows", "resolve_checkpoint", "run_stage",
           "training_texts", "write_jsonl"]


def run_stage(stage: str, base: str, out: str | Path, data: str | Path | None = None, config: dict | None = None,
              reward: str = "static", verify_config: dict | None = None, resume: bool = True, on_step=None,
              reward_timeout_s: float | None = None) -> dict:
    """Run one stage from plain values (what the command line and the Dagster assets pass); returns its result."""
    if stage == "convert":
        from training.convert import ConversionConfig, run_conversion_stage

        return run_conversion_stage(base, out, ConversionConfig.from_dict(config), resume=resume, on_step=on_step)
    if data is None:
        raise ValueError(f"stage {stage} needs --data")
    if stage == "sft":
        from training.sft import SFTConfig, run_sft_stage

        return run_sft_stage(base, data, out, SFTConfig.from_dict(config), resume=resume, on_step=on_step)
    if stage in ("rl_infilling", "rl_end_to_end"):
        from training.rl import run_rl_stage

        return run_rl_stage(base, data, out, stage, config, reward=reward, verify_config=verify_config,
                            resume=resume, on_step=on_step, reward_timeout_s=reward_timeout_s)
    raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.stages", description=__doc__)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--base", required=True, help="preset:NAME, a .gguf file, a checkpoint or a stage directory")
    parser.add_argument("--data", default=None,
                        help="SFT samples, infilling or end-to-end tasks (JSONL/Parquet); convert reads its corpus "
                             "from --config's corpus_roots")
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


def step_summary(record: dict) -> str:
    """A step's numbers in one line: what the run log shows."""
    shown = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(shown.items())[:8])


def main(argv: Sequence[str] | None = None) -> int:
    """Run one stage; logs each step (`logging`: the asset's run log under Dagster Pipes, stderr from a shell),
    shows a progress bar on stderr, and writes the result JSON."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a no-op under Pipes, which logs already
    rank = int(os.environ.get("RANK", "0"))
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(desc=args.stage, unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_step(record: dict) -> None:
        log.info(f"{args.stage} step {record.get('step')}: {step_summary(record)}")
        if bar is not None:
            if record.get("total_steps") or bar.total is None:
                bar.total = record.get("total_steps", bar.total)
            bar.update(1)
            bar.set_postfix({k: f"{record[k]:.4g}" for k in ("loss", "reward_mean", "kl") if
                             isinstance(record.get(k), (int, float))})

    result = run_stage(args.stage, args.base, args.out, args.data, _json_arg(args.config), args.reward,
                       _json_arg(args.verify_config), not args.no_resume, on_step, args.reward_timeout_s)
    if bar is not None:
        bar.close()
    if args.results and rank == 0:
        # Which GPUs the ranks were given (a GpuPool lease under Dagster): the record of what the run held.
        result = dict(result, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
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
