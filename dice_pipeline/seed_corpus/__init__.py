"""The embedded seed corpus: PyTorch -> CUDA pairs written by the team, served as ConCuR-schema rows.

Each pair lives in `pairs/<NN_name>/` (reference.py, candidate.py, think.md) and is listed in `manifest.json`.
Speedups come only from `measurements.json`, written by `record_measurements` from a GPU verifier run; a pair
without a valid measurement has `speedup_over_eager = None` and says why in `measurement_status`.
Standard library only, so it loads in the Dagster process and on a torch-only GPU host alike.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = CORPUS_DIR / "manifest.json"
MEASUREMENTS_PATH = CORPUS_DIR / "measurements.json"

# uuid5 namespace of the seed corpus; a pair's uuid is uuid5(namespace, problem_name), so it is stable across edits.
SEED_UUID_NAMESPACE = uuid.UUID("6f1c2a4e-5b7d-4c1e-9a3f-2d8e7b6c5a41")

CONCUR_COLUMNS = ("uuid", "problem_name", "pytorch_code", "generated_code", "generated_think", "speedup_over_eager")
EXTRA_COLUMNS = ("op_family", "intended_outcome", "measurement_status", "speedup_measurement")
SEED_COLUMNS = CONCUR_COLUMNS + EXTRA_COLUMNS

# What the author meant the candidate to show. A label for tests and for reading verifier results against;
# never a verdict (verdicts come only from the verifier).
GOOD_OUTCOMES = frozenset({"faster", "parity", "slower"})
BAD_OUTCOMES = frozenset({"wrong", "pytorch_only", "no_compile", "fallback_to_torch", "partial_output"})
INTENDED_OUTCOMES = GOOD_OUTCOMES | BAD_OUTCOMES

NOT_MEASURED = "not_measured"
STALE_MEASUREMENT = "stale_measurement"  # the pair's code changed after it was measured

_PAIR_FILES = ("reference.py", "candidate.py", "think.md")


class SeedCorpusError(ValueError):
    """The corpus files (manifest, pair directories, measurements) are missing or inconsistent."""


@dataclass(frozen=True)
class SeedPairSpec:
    """One manifest entry. `cpu_smoke_sizes` overrides module-level size constants for quick CPU runs."""

    uuid: str
    problem_name: str
    directory: str
    op_family: str
    intended_outcome: str
    cpu_smoke_sizes: dict[str, int]

    @property
    def path(self) -> Path:
        return CORPUS_DIR / self.directory

    def read(self, filename: str) -> str:
        return (self.path / filename).read_text(encoding="utf-8")


def seed_uuid(problem_name: str) -> str:
    return str(uuid.uuid5(SEED_UUID_NAMESPACE, problem_name))


def code_sha256(pytorch_code: str, generated_code: str) -> str:
    """Hash of what was measured: a measurement is only valid for the exact reference and candidate text."""
    digest = hashlib.sha256()
    for part in (pytorch_code, generated_code):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def load_manifest(path: Path = MANIFEST_PATH) -> list[SeedPairSpec]:
    """Read and validate the manifest: unique uuids and names, uuids derived from names, known outcomes,
    and every pair directory holding its three files."""
    data = json.loads(path.read_text(encoding="utf-8"))
    specs: list[SeedPairSpec] = []
    seen_uuids: set[str] = set()
    seen_names: set[str] = set()
    for entry in data["pairs"]:
        spec = SeedPairSpec(
            uuid=entry["uuid"],
            problem_name=entry["problem_name"],
            directory=entry["directory"],
            op_family=entry["op_family"],
            intended_outcome=entry["intended_outcome"],
            cpu_smoke_sizes=dict(entry.get("cpu_smoke_sizes") or {}),
        )
        if spec.uuid != seed_uuid(spec.problem_name):
            raise SeedCorpusError(f"{spec.problem_name}: uuid {spec.uuid} is not uuid5(namespace, problem_name)")
        if spec.uuid in seen_uuids or spec.problem_name in seen_names:
            raise SeedCorpusError(f"{spec.problem_name}: duplicate uuid or problem_name in the manifest")
        if spec.intended_outcome not in INTENDED_OUTCOMES:
            raise SeedCorpusError(f"{spec.problem_name}: unknown intended_outcome {spec.intended_outcome!r}")
        missing = [name for name in _PAIR_FILES if not (spec.path / name).is_file()]
        if missing:
            raise SeedCorpusError(f"{spec.problem_name}: {spec.directory} lacks {', '.join(missing)}")
        seen_uuids.add(spec.uuid)
        seen_names.add(spec.problem_name)
        specs.append(spec)
    return specs


def load_measurements(path: Path = MEASUREMENTS_PATH) -> dict[str, dict[str, Any]]:
    """uuid -> measurement record, or {} when no GPU run has been recorded yet."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data.get("measurements") or {})


def _measurement_columns(record: dict[str, Any] | None, current_sha: str) -> dict[str, Any]:
    if record is None:
        return {"speedup_over_eager": None, "measurement_status": NOT_MEASURED, "speedup_measurement": None}
    summary = {key: record.get(key) for key in ("status", "reference_median_ms", "candidate_median_ms")}
    summary.update(record.get("method") or {})
    if record.get("code_sha256") != current_sha:
        return {
            "speedup_over_eager": None,
            "measurement_status": STALE_MEASUREMENT,
            "speedup_measurement": json.dumps(summary, sort_keys=True),
        }
    return {
        "speedup_over_eager": record.get("speedup_over_eager"),
        "measurement_status": record["status"],
        "speedup_measurement": json.dumps(summary, sort_keys=True),
    }


def load_seed_pairs(
    manifest_path: Path = MANIFEST_PATH, measurements_path: Path = MEASUREMENTS_PATH
) -> list[dict[str, Any]]:
    """Every seed pair as a ConCuR-schema row plus `op_family`, `intended_outcome`, `measurement_status`
    (`not_measured`, `stale_measurement`, or the verifier status) and `speedup_measurement` (JSON of how the
    speedup was measured, or None). `speedup_over_eager` is a measured number or None, never a guess."""
    specs = load_manifest(manifest_path)
    measurements = load_measurements(measurements_path)
    unknown = sorted(set(measurements) - {spec.uuid for spec in specs})
    if unknown:
        raise SeedCorpusError(f"{measurements_path.name} has measurements for uuids not in the manifest: {unknown}")
    rows = []
    for spec in specs:
        pytorch_code = spec.read("reference.py")
        generated_code = spec.read("candidate.py")
        row = {
            "uuid": spec.uuid,
            "problem_name": spec.problem_name,
            "pytorch_code": pytorch_code,
            "generated_code": generated_code,
            "generated_think": spec.read("think.md").strip(),
            "op_family": spec.op_family,
            "intended_outcome": spec.intended_outcome,
        }
        row.update(
            _measurement_columns(measurements.get(spec.uuid), code_sha256(pytorch_code, generated_code))
        )
        rows.append({column: row[column] for column in SEED_COLUMNS})
    return rows


__all__ = [
    "BAD_OUTCOMES",
    "CONCUR_COLUMNS",
    "CORPUS_DIR",
    "EXTRA_COLUMNS",
    "GOOD_OUTCOMES",
    "INTENDED_OUTCOMES",
    "MANIFEST_PATH",
    "MEASUREMENTS_PATH",
    "NOT_MEASURED",
    "SEED_COLUMNS",
    "STALE_MEASUREMENT",
    "SeedCorpusError",
    "SeedPairSpec",
    "code_sha256",
    "load_manifest",
    "load_measurements",
    "load_seed_pairs",
    "seed_uuid",
]
