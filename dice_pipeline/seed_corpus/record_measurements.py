"""Turn a GPU verifier run over the seed corpus into `measurements.json`, which the seed loader reads.

Input: a JSON list of {"job_id": <pair uuid>, "verdict": <Verdict.to_dict()>} (benchmarks/results/seed_verdicts.json).
Only verdicts executed on a GPU carry a speedup; rejected candidates keep their status and a speedup of None.
Usage: python -m dice_pipeline.seed_corpus.record_measurements PATH [--output measurements.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dice_pipeline.seed_corpus import (
    MEASUREMENTS_PATH,
    SeedCorpusError,
    SeedPairSpec,
    code_sha256,
    load_manifest,
)
from dice_pipeline.verify.verdict import Status, Verdict

# Provenance keys as the verifier may spell them -> the key recorded here. First match wins.
_PROVENANCE_KEYS = {
    "gpu": ("gpu", "gpu_name", "device_name"),
    "driver": ("driver", "driver_version"),
    "torch": ("torch", "torch_version"),
    "cuda": ("cuda", "cuda_version"),
    "verifier_version": ("verifier_version", "version"),
    "date": ("time", "date", "timestamp", "started_at"),
    "timing_method": ("timing_method", "timing"),
}


def _provenance_field(provenance: dict[str, Any], key: str) -> Any:
    for candidate in _PROVENANCE_KEYS[key]:
        if provenance.get(candidate) not in (None, ""):
            return provenance[candidate]
    return None


def _method(verdict: Verdict) -> dict[str, Any]:
    provenance = verdict.provenance or {}
    method = {key: _provenance_field(provenance, key) for key in _PROVENANCE_KEYS}
    if method["timing_method"] is None and verdict.candidate_timing is not None:
        # Say only what the verdict itself shows about how it timed.
        method["timing_method"] = (
            f"verifier median of {verdict.candidate_timing.n} timed calls per model, speedup = reference median / "
            "candidate median"
        )
    return method


def measurement_from_verdict(spec: SeedPairSpec, verdict: Verdict) -> dict[str, Any]:
    """One measurements.json record. Raises SeedCorpusError when a verdict claims a speedup it cannot back."""
    executed = verdict.status != Status.NOT_EXECUTED
    method = _method(verdict)
    speedup = None
    if verdict.status == Status.CORRECT:
        if verdict.speedup is None or not verdict.speedup > 0:
            raise SeedCorpusError(f"{spec.problem_name}: verdict is correct but carries no positive speedup")
        if not method["gpu"]:
            raise SeedCorpusError(f"{spec.problem_name}: a speedup without the GPU in its provenance is not recorded")
        speedup = float(verdict.speedup)
    return {
        "problem_name": spec.problem_name,
        "status": verdict.status.value,
        "speedup_over_eager": speedup,
        "reference_median_ms": verdict.reference_timing.median_ms if verdict.reference_timing else None,
        "candidate_median_ms": verdict.candidate_timing.median_ms if verdict.candidate_timing else None,
        "reason_codes": verdict.reason_codes(),
        "flags": list(verdict.flags),
        "executed_on_gpu": executed,
        "method": method,
        "code_sha256": code_sha256(spec.read("reference.py"), spec.read("candidate.py")),
    }


def build_measurements(entries: list[dict[str, Any]], specs: list[SeedPairSpec]) -> dict[str, dict[str, Any]]:
    by_uuid = {spec.uuid: spec for spec in specs}
    measurements: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "job_id" not in entry or "verdict" not in entry:
            raise SeedCorpusError(f"entry {index}: expected {{'job_id': ..., 'verdict': {{...}}}}")
        job_id = str(entry["job_id"])
        spec = by_uuid.get(job_id)
        if spec is None:
            raise SeedCorpusError(f"entry {index}: job_id {job_id} is not a seed pair uuid")
        if job_id in measurements:
            raise SeedCorpusError(f"entry {index}: a second verdict for {spec.problem_name} ({job_id})")
        measurements[job_id] = measurement_from_verdict(spec, Verdict.from_dict(entry["verdict"]))
    return measurements


def record(verdicts_path: Path, output_path: Path = MEASUREMENTS_PATH) -> dict[str, Any]:
    entries = json.loads(verdicts_path.read_text(encoding="utf-8"))
    if not isinstance(entries, list):
        raise SeedCorpusError(f"{verdicts_path}: expected a JSON list of verdict entries")
    specs = load_manifest()
    measurements = build_measurements(entries, specs)
    document = {
        "schema_version": 1,
        "source": verdicts_path.name,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "measurements": {uuid: measurements[uuid] for uuid in sorted(measurements)},
    }
    output_path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verdicts", type=Path, help="JSON list of {job_id, verdict} from the verifier")
    parser.add_argument("--output", type=Path, default=MEASUREMENTS_PATH, help="where to write measurements.json")
    args = parser.parse_args(argv)
    try:
        document = record(args.verdicts, args.output)
    except (SeedCorpusError, json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
        print(f"record_measurements: {exc}", file=sys.stderr)
        return 1
    measured = document["measurements"]
    with_speedup = sum(1 for m in measured.values() if m["speedup_over_eager"] is not None)
    missing = [spec.problem_name for spec in load_manifest() if spec.uuid not in measured]
    print(f"recorded {len(measured)} verdicts ({with_speedup} with a measured speedup) to {args.output}")
    if missing:
        print(f"not in this run (stay not_measured): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
