"""A content-addressed store of executed verdicts, so a candidate is judged on a GPU once.

Key: the verifier version, the reference and candidate sources, and every config field that can change a verdict
(trials, tolerances, timing method, build profile, ...; not paths, parallelism, devices or time limits). Only
verdicts that executed on a GPU are stored (not static rejections, not `not_executed`, not timeouts, which can be
a busy host's fault). Lookups on a GPU host only reuse verdicts measured on a GPU of the same name; a GPU-less
host reuses any, and the verdict's provenance names the GPU it came from.

This is also how GPU work is farmed out: a GPU host runs the verifier with a store directory, the directory
travels back, and the pipeline pointed at it (`dice run --verdict-store DIR`) reuses those verdicts. Standard
library only. One JSON file per verdict, written atomically, so concurrent writers are safe.

A store can also be packed into one gzip'd JSON-lines archive (`pack_verdict_store`): read-only, a fraction of
the size, and what the project ships for its own GPU-judged data (`VerifyConfig.verdict_archives`). Lookups read
the directory first, then the archives.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path

from dice_pipeline.verify.config import VerifyConfig, VerifyJob
from dice_pipeline.verify.verdict import READABLE_VERIFIER_VERSIONS, VERIFIER_VERSION, Status, Verdict

# VerifyConfig fields that cannot change a completed verdict: where things live, how much runs at once, limits.
_NOT_IN_KEY = frozenset({
    "build_cache_dir", "max_parallel_builds", "devices", "memory_cap_mb", "gpu_memory_fraction", "execute",
    "use_precompiled_header", "light_cuda_headers", "isolate_network", "compile_arch", "build_without_gpu",
    "compile_timeout_s",
    "run_timeout_s", "verdict_store_dir", "prestart_gpu_workers", "gpu_worker_cpus",
    "device_lock_dir", "gpu_lanes", "build_batch_size", "parallel_group_builds", "skip_grouped_member_builds",
    "start_cuda_before_go", "release_gpu_after_timing",
    # how long the device warms before timing: the warm-up ends at steady clocks either way (harness.warm_up)
    "warmup_min_seconds",
    # set per attempt, bounding time, or choosing which stored verdicts to read: never what a verdict says
    "low_memory", "max_run_timeout_s", "slow_candidate_factor", "accept_verdicts_from", "verdict_archives",
})
# VerifyConfig fields that enter the key only when set: at their default (empty) they ask for nothing extra, so a
# verdict judged before the field existed is the verdict judged now.
_IN_KEY_WHEN_SET = frozenset({"extra_baselines"})
_NOT_STORED = frozenset({Status.NOT_EXECUTED, Status.TIMEOUT, Status.INFRASTRUCTURE_ERROR})
# VerifyConfig fields each version added: the key an older version computed had none of them. `low_memory` and the
# run-limit fields are set per attempt or bound time only, so they are never in a key.
_FIELDS_ADDED_IN = {
    "0.3.0": frozenset({"max_run_timeout_s", "slow_candidate_factor", "timing_min_samples", "speedup_convention",
                        "slow_draw_seconds", "gpu_draw_bytes", "low_memory", "consistency_tolerance_ratio",
                        "baseline_kernel_policy", "baseline_kernel_share", "accept_verdicts_from"}),
    "0.4.0": frozenset({"null_output_share"}),
}


def _fields_unknown_to(version: str) -> frozenset[str]:
    """The config fields added after `version` (none for the current version)."""
    later = [added for v, added in _FIELDS_ADDED_IN.items() if v > version]
    return frozenset().union(*later) if later else frozenset()


def verdict_key(job: VerifyJob, config: VerifyConfig, version: str = VERIFIER_VERSION) -> str:
    """The store key for a job judged with `config` by verifier `version` (an older version's key leaves out the
    fields that version did not have)."""
    unknown = _fields_unknown_to(version)
    judged_by = {k: v for k, v in sorted(config.to_dict().items())
                 if k not in _NOT_IN_KEY and k not in unknown and (v or k not in _IN_KEY_WHEN_SET)}
    material = json.dumps({"verifier_version": version, "reference": job.reference_src,
                           "candidate": job.candidate_src, "config": judged_by}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


class VerdictArchive:
    """A packed, read-only store: gzip'd JSON lines of {"key": store key, "verdict": verdict dict}, loaded on the
    first lookup. A line that does not parse is skipped (its job is judged again), like a damaged store entry."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._entries: dict[str, dict] | None = None

    def _load(self) -> dict[str, dict]:
        if self._entries is None:
            entries: dict[str, dict] = {}
            try:
                with gzip.open(self.path, "rt", encoding="utf-8") as handle:
                    for line in handle:
                        try:
                            record = json.loads(line)
                            entries[record["key"]] = record["verdict"]
                        except (json.JSONDecodeError, KeyError, TypeError):
                            continue
            except FileNotFoundError:
                raise FileNotFoundError(f"verdict archive {self.path} does not exist") from None
            self._entries = entries
        return self._entries

    def get(self, key: str) -> dict | None:
        return self._load().get(key)

    def __len__(self) -> int:
        return len(self._load())


def pack_verdict_store(store_dir: str | os.PathLike, archive_path: str | os.PathLike) -> int:
    """Pack every readable verdict of a store directory into one archive (sorted by key, so the same store packs
    to the same bytes); returns how many were packed."""
    root = Path(store_dir)
    records = []
    for path in sorted(root.glob("*/*.json")):
        try:
            verdict = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        records.append(json.dumps({"key": path.stem, "verdict": verdict}, sort_keys=True))
    archive = Path(archive_path)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(("\n".join(records) + ("\n" if records else "")).encode())
    return len(records)


class VerdictStore:
    """`root`: the store directory (None: archives only, nothing is written); `archives`: packed stores read after
    the directory."""

    def __init__(self, root: str | os.PathLike | None, archives: tuple[str | os.PathLike, ...] = ()):
        self.root = Path(root) if root is not None else None
        self.archives = [VerdictArchive(path) for path in archives]

    def _path(self, key: str) -> Path | None:
        return None if self.root is None else self.root / key[:2] / f"{key}.json"

    def get(self, job: VerifyJob, config: VerifyConfig, local_gpu: str | None,
            accept_versions: tuple[str, ...] = ()) -> Verdict | None:
        """The stored verdict for this job and config, or None. `local_gpu`: this host's GPU name (None: no GPU).

        Only this verifier version's verdicts are found, unless `accept_versions` names older ones (from
        READABLE_VERIFIER_VERSIONS) to fall back on, newest first: such a verdict is never reused silently: its
        provenance names the version that judged it (`judged_by_verifier`) and it carries the flag
        `older_verifier_version` (it lacks the checks added since, and its speedup is verifier 0.2's host-inclusive
        one)."""
        unreadable = set(accept_versions) - set(READABLE_VERIFIER_VERSIONS)
        if unreadable:
            raise ValueError(f"verdicts of verifier {sorted(unreadable)} cannot be read; readable: "
                             f"{READABLE_VERIFIER_VERSIONS}")
        for version in (VERIFIER_VERSION, *sorted(accept_versions, reverse=True)):
            key = verdict_key(job, config, version)
            verdict = self._read(self._path(key)) or self._read_archived(key)
            if verdict is None:
                continue
            measured_on = (verdict.provenance or {}).get("gpu")
            if local_gpu is not None and measured_on != local_gpu:
                continue
            verdict.provenance = {**(verdict.provenance or {}), "from_verdict_store": True}
            if version != VERIFIER_VERSION:
                verdict.provenance["judged_by_verifier"] = version
                if verdict.speedup is not None and verdict.speedup_host is None:
                    verdict.speedup_host, verdict.speedup_convention = verdict.speedup, "host"
                verdict.flags = [*verdict.flags, "older_verifier_version"]
            return verdict
        return None

    def _read_archived(self, key: str) -> Verdict | None:
        for archive in self.archives:
            data = archive.get(key)
            if data is not None:
                try:
                    return Verdict.from_dict(data)
                except (KeyError, TypeError, ValueError):
                    continue
        return None

    @staticmethod
    def _read(path: Path | None) -> Verdict | None:
        if path is None:
            return None
        try:
            return Verdict.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # a damaged entry is a miss: the job is judged again and the entry rewritten

    def put(self, job: VerifyJob, config: VerifyConfig, verdict: Verdict) -> bool:
        """Store an executed verdict; returns whether it was stored."""
        if self.root is None or verdict.status in _NOT_STORED or not (verdict.provenance or {}).get("gpu"):
            return False
        path = self._path(verdict_key(job, config))
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
        with os.fdopen(handle, "w") as out:
            out.write(verdict.to_json())
        os.replace(tmp, path)
        return True

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root is not None and self.root.is_dir() else 0
