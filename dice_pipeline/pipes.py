"""Launch pipeline work as an external process through a Dagster Pipes client: logs and metadata come back to the
asset, the work itself runs wherever the client puts it.

`dg.PipesSubprocessClient` (the default) runs it on this host. Moving it to Kubernetes, Slurm or Ray is a client
swap: pass a `PipesK8sClient` (dagster-k8s), a Slurm or Ray Pipes client (dagster-ray), or any client whose
`run(context=..., command=..., extras=..., env=...)` starts the same command. The external side needs only this
package's GPU-side code and the standalone `dagster-pipes` wheel (no Dagster).

- `run_module_through_pipes`: any module's command line (`python -m MODULE ARGS`), unchanged, through
  `dice_pipeline.pipes_module` (its `logging` goes to the asset log; `write_run_metadata` to the asset's metadata);
  with `nproc_per_node`, under `torchrun` (one process a leased GPU; rank 0 talks to Dagster). The training assets
  start every stage this way, holding a `GpuPool` lease:
  `run_module_through_pipes(context, "training.stages", args, nproc_per_node=n, env=lease.env())`.
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

from dice_pipeline.paths import source_root


def _with_repo_on_path(env: Mapping[str, str] | None) -> dict[str, str]:
    """The child imports this checkout's code (as the verifier's own workers do), whatever is installed."""
    merged = dict(env or {})
    existing = merged.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(source_root()), existing) if p)
    return merged


def torchrun_prefix(nproc_per_node: int, python: str | None = None, log_dir: str | Path | None = None) -> list[str]:
    """`python -m torch.distributed.run` for `nproc_per_node` processes on this host, before `-m MODULE ...`.
    `--standalone` picks a free port, so concurrent runs on one host never meet; with `log_dir` every rank's stdout
    and stderr are also kept there (`<log_dir>/<run id>/attempt_0/<rank>/stderr.log`)."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    command = [python or sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc_per_node)]
    if log_dir is not None:
        command += ["--log-dir", str(log_dir), "--tee", "3"]
    return command


def run_module_through_pipes(context: dg.AssetExecutionContext | dg.OpExecutionContext, module: str,
                             args: Sequence[str] = (), *, extras: Mapping[str, Any] | None = None,
                             env: Mapping[str, str] | None = None, cwd: str | None = None,
                             client: Any | None = None, python: str | None = None,
                             wrap: bool = True, nproc_per_node: int | None = None,
                             log_dir: str | Path | None = None) -> dg.PipesClientCompletedInvocation:
    """Run `python -m MODULE ARGS` as a Pipes external process and return its completed invocation
    (`.get_materialize_result()` for the asset's result). `wrap=False` runs a module that opens Dagster Pipes
    itself (such as dice_pipeline.verify.pipes_entry) directly. `nproc_per_node`: under `torchrun`, that many
    processes (rank 0 opens the Pipes session; `log_dir` keeps every rank's output)."""
    client = client or dg.PipesSubprocessClient()
    if nproc_per_node is not None:
        if not wrap:
            raise ValueError("under torchrun the module runs through dice_pipeline.pipes_module (wrap=True)")
        launcher = torchrun_prefix(nproc_per_node, python, log_dir) + ["-m"]
    else:
        launcher = [python or sys.executable, "-m"]
    command = [*launcher, *(("dice_pipeline.pipes_module",) if wrap else ()), module, *args]
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
