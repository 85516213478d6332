"""A verification batch as a Dagster Pipes external process:

    python -m dice_pipeline.verify.pipes_entry        # started by a Pipes client, which passes the extras below

Extras: `jobs_path` (JSONL of {job_id, reference_src, candidate_src}), `verdicts_path` (written here: JSONL of
{job_id, verdict}), `verify_config` (VerifyConfig.to_dict()), `backend` ("local": this host's GPUs; "ray": a Ray
cluster), `ray_address`. One log line per verdict as it is reached, then the batch's figures as materialization
metadata. Jobs and verdicts travel as files, not messages (a batch can be 90,000 candidates): on Kubernetes or
Slurm both paths are on storage the pod or job and the Dagster process share. Needs the verifier (torch, stdlib)
and the standalone `dagster-pipes` package, not Dagster.
"""

from __future__ import annotations

import collections
import json
import platform
import sys
import time
from pathlib import Path

from dice_pipeline.verify.api import gpu_inventory, verify_batch
from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.verdict import Verdict


def read_jobs(path: str | Path) -> list[VerifyJob]:
    return [VerifyJob(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jobs(path: str | Path, jobs: list[VerifyJob]) -> None:
    Path(path).write_text("".join(json.dumps({"job_id": j.job_id, "reference_src": j.reference_src,
                                              "candidate_src": j.candidate_src}) + "\n" for j in jobs))


def read_verdicts(path: str | Path) -> dict[str, Verdict]:
    rows = (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
    return {row["job_id"]: Verdict.from_dict(row["verdict"]) for row in rows}


def main() -> int:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        extras = pipes.extras
        jobs = read_jobs(extras["jobs_path"])
        config = VerifyConfig.from_dict(extras.get("verify_config") or {})
        backend = extras.get("backend", "local")
        gpus = gpu_inventory()
        pipes.log.info(f"verifying {len(jobs)} jobs on {platform.node()} ({backend} backend, "
                       f"{len(gpus)} local GPU(s): {', '.join(sorted({g.name for g in gpus})) or 'none'})")

        def on_result(job: VerifyJob, verdict: Verdict) -> None:
            pipes.log.info(f"{job.job_id}: {verdict.summary()}")

        start = time.perf_counter()
        if backend == "ray":
            from dice_pipeline.verify.ray_backend import verify_batch_ray

            verdicts = verify_batch_ray(jobs, config, on_result=on_result, address=extras.get("ray_address") or None)
        elif backend == "local":
            verdicts = verify_batch(jobs, config, on_result=on_result)
        else:
            raise ValueError(f"backend must be 'local' or 'ray', not {backend!r}")
        wall = time.perf_counter() - start
        Path(extras["verdicts_path"]).write_text("".join(
            json.dumps({"job_id": job.job_id, "verdict": verdict.to_dict()}) + "\n"
            for job, verdict in zip(jobs, verdicts)))
        by_status = collections.Counter(v.status.value for v in verdicts)
        pipes.report_asset_materialization(metadata={
            "verification/jobs": len(jobs),
            "verification/wall_seconds": round(wall, 2),
            "verification/judged_per_minute": round(60 * len(jobs) / wall, 2) if wall > 0 else None,
            "verification/host": platform.node(),
            "verification/backend": backend,
            "verification/gpus": len(gpus),
            "verification/by_status": {"raw_value": dict(sorted(by_status.items())), "type": "json"},
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
