"""A content-addressed store of executed verdicts, so a candidate is judged on a GPU once.

Key: the verifier version, the reference and candidate sources, and every config field that can change a verdict
(trials, tolerances, timing method, build profile, ...; not paths, parallelism, devices or time limits). Only
verdicts that executed on a GPU are stored (not static rejections, not `not_executed`, not timeouts, which can be
a busy host's fault). Lookups on a GPU host only reuse verdicts measured on a GPU of the same name; a GPU-less
host reuses any, and the verdict's provenance names the GPU it came from.

This is also how GPU work is farmed out: a GPU host runs the verifier with a store directory, the directory
travels back, and the pipeline pointed at it (`dice run --verdict-store DIR`) reuses those verdicts. Standard
library only. One JSON file per verdict, written atomically, so concurrent writers are safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.verdict import VERIFIER_VERSION, Status, Verdict

# VerifyConfig fields that cannot change a completed verdict: where things live, how much runs at once, limits.
_NOT_IN_KEY = frozenset({
    "build_cache_dir", "max_parallel_builds", "devices", "memory_cap_mb", "gpu_memory_fraction", "execute",
    "use_precompiled_header", "isolate_network", "compile_arch", "build_without_gpu", "compile_timeout_s",
    "run_timeout_s", "verdict_store_dir", "prestart_gpu_workers", "gpu_worker_cpus",
    "device_lock_dir",
})
# VerifyConfig fields that enter the key only when set: at their default (empty) they ask for nothing extra, so a
# verdict judged before the field existed is the verdict judged now.
_IN_KEY_WHEN_SET = frozenset({"extra_baselines"})
_NOT_STORED = frozenset({Status.NOT_EXECUTED, Status.TIMEOUT})


def verdict_key(job: VerifyJob, config: VerifyConfig) -> str:
    judged_by = {k: v for k, v in sorted(config.to_dict().items())
                 if k not in _NOT_IN_KEY and (v or k not in _IN_KEY_WHEN_SET)}
    material = json.dumps({"verifier_version": VERIFIER_VERSION, "reference": job.reference_src,
                           "candidate": job.candidate_src, "config": judged_by}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


class VerdictStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, job: VerifyJob, config: VerifyConfig, local_gpu: str | None) -> Verdict | None:
        """The stored verdict for this job and config, or None. `local_gpu`: this host's GPU name (None: no GPU)."""
        path = self._path(verdict_key(job, config))
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            return None  # a damaged entry is a miss: the job is judged again and the entry rewritten
        verdict = Verdict.from_dict(data)
        measured_on = (verdict.provenance or {}).get("gpu")
        if local_gpu is not None and measured_on != local_gpu:
            return None
        verdict.provenance = {**(verdict.provenance or {}), "from_verdict_store": True}
        return verdict

    def put(self, job: VerifyJob, config: VerifyConfig, verdict: Verdict) -> bool:
        """Store an executed verdict; returns whether it was stored."""
        if verdict.status in _NOT_STORED or not (verdict.provenance or {}).get("gpu"):
            return False
        path = self._path(verdict_key(job, config))
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
        with os.fdopen(handle, "w") as out:
            out.write(verdict.to_json())
        os.replace(tmp, path)
        return True

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.is_dir() else 0
