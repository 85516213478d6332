"""Launch pipeline work as an external process through a Dagster Pipes client: logs and metadata come back to the
asset, the work itself runs wherever the client puts it.

`dg.PipesSubprocessClient` (the default) runs it on this host. Moving it to Kubernetes, Slurm or Ray is a client
swap: pass a `PipesK8sClient` (dagster-k8s), a Slurm or Ray Pipes client (dagster-ray), or any client whose
`run(context=..., command=..., extras=..., env=...)` starts the same command. The external side needs only this
package's GPU-side code and the standalone `dagster-pipes` wheel (no Dagster).

- `run_module_through_pipes`: any module's command line (`python -m MODULE ARGS`), unchanged, through
  `dice_pipeline.pipes_module` (its `logging` goes to the asset log; `write_run_metadata` to the asset's metadata).
  For the training stages, e.g. `run_module_through_pipes(context, "training.sft", ["--config", path], env=lease.env())`
  with a `GpuPool` lease, then `return invocation.get_materialize_result()`.
- `verify_through_pipes`: a verification batch through `dice_pipeline.verify.pipes_entry`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

import dice_pipeline

REPO_ROOT = str(Path(dice_pipeline.__file__).resolve().parent.parent)


def _with_repo_on_path(env: Mapping[str, str] | None) -> dict[str, str]:
    """The child imports this checkout's code (as the verifier's own workers do), whatever is installed."""
    merged = dict(env or {})
    existing = merged.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, existing) if p)
    return merged


def run_module_through_pipes(context: dg.AssetExecutionContext | dg.OpExecutionContext, module: str,
                             args: Sequence[str] = (), *, extras: Mapping[str, Any] | None = None,
                             env: Mapping[str, str] | None = None, cwd: str | None = None,
                             client: Any | None = None, python: str | None = None,
                             wrap: bool = True) -> dg.PipesClientCompletedInvocation:
    """Run `python -m MODULE ARGS` as a Pipes external process and return its completed invocation
    (`.get_materialize_result()` for the asset's result). `wrap=False` runs a module that opens Dagster Pipes
    itself (such as dice_pipeline.verify.pipes_entry) directly."""
    client = client or dg.PipesSubprocessClient()
    command = [python or sys.executable, "-m", *(("dice_pipeline.pipes_module",) if wrap else ()), module, *args]
    return client.run(context=context, command=command, extras=dict(extras or {}), env=_with_repo_on_path(env),
                      cwd=cwd)


def verify_through_pipes(context: dg.AssetExecutionContext, jobs: list, config, *, backend: str = "local",
                         ray_address: str = "", client: Any | None = None, env: Mapping[str, str] | None = None,
                         exchange_dir: str | None = None) -> tuple[list, dict[str, Any]]:
    """Judge `jobs` (VerifyJob) in an external process; returns (one Verdict per job in order, the metadata the
    process reported). `exchange_dir`: where the job and verdict files go (shared storage for a remote client);
    default a temporary directory here."""
    from dice_pipeline.verify.pipes_entry import read_verdicts, write_jobs

    with tempfile.TemporaryDirectory(prefix="dice_verify_pipes_", dir=exchange_dir) as scratch:
        jobs_path, verdicts_path = Path(scratch) / "jobs.jsonl", Path(scratch) / "verdicts.jsonl"
        write_jobs(jobs_path, jobs)
        invocation = run_module_through_pipes(
            context, "dice_pipeline.verify.pipes_entry", wrap=False, client=client, env=env,
            extras={"jobs_path": str(jobs_path), "verdicts_path": str(verdicts_path),
                    "verify_config": config.to_dict(), "backend": backend, "ray_address": ray_address})
        reported = invocation.get_materialize_result()
        by_job = read_verdicts(verdicts_path)
    missing = [job.job_id for job in jobs if job.job_id not in by_job]
    if missing or len(by_job) != len({job.job_id for job in jobs}):
        raise RuntimeError(f"the external verification returned no verdict for {missing[:20]} ({len(missing)} jobs)")
    return [by_job[job.job_id] for job in jobs], dict(reported.metadata or {})
