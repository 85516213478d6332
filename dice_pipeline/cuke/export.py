"""Export CuKe as a Hugging Face dataset: `save_to_disk` folder, a Parquet file and a dataset card (README.md with a
YAML header) giving the lineage (sources, thresholds, verifier version, counts, decontamination). Also the
composition table and length distributions, as data, for the card and for Dagster metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from dice_pipeline.verify.verdict import VERIFIER_VERSION

PARQUET_RELATIVE_PATH = "data/train-00000-of-00001.parquet"
HF_DISK_FOLDER = "hf_dataset"
LENGTH_QUANTILES = (0.5, 0.9, 0.99)


def composition_table(samples: pl.DataFrame) -> pl.DataFrame:
    """Sample counts by source x op family x difficulty, largest first."""
    return (
        samples.group_by("source", "op_family", "difficulty")
        .agg(pl.len().alias("samples"))
        .sort(["samples", "source", "op_family", "difficulty"], descending=[True, False, False, False])
    )


def length_distributions(
    samples: pl.DataFrame, count_tokens: Callable[[str], int] | None = None, bins: int = 10
) -> dict[str, dict]:
    """Per length column (prompt/response characters, and tokens if `count_tokens` is given): count, min, mean,
    quantiles, max and an equal-width histogram (`edges`, `counts`)."""
    lengths = {"prompt_chars": samples["prompt_chars"].to_list(), "response_chars": samples["response_chars"].to_list()}
    if count_tokens is not None:
        lengths["prompt_tokens"] = [count_tokens(text) for text in samples["prompt"].to_list()]
        lengths["response_tokens"] = [count_tokens(text) for text in samples["response"].to_list()]
    return {name: _describe(values, bins) for name, values in lengths.items()}


def _describe(values: list[int], bins: int) -> dict:
    if not values:
        return {"count": 0}
    series = pl.Series(values, dtype=pl.Float64)
    low, high = float(series.min()), float(series.max())
    width = (high - low) / bins if high > low else 1.0
    edges = [low + i * width for i in range(bins + 1)]
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    summary = {"count": len(values), "min": low, "mean": float(series.mean()), "max": high}
    summary.update({f"p{int(q * 100)}": float(series.quantile(q, interpolation="nearest")) for q in LENGTH_QUANTILES})
    summary.update(edges=edges, counts=counts)
    return summary


@dataclass(frozen=True)
class CukeExport:
    root: Path
    hf_dataset_dir: Path
    parquet_path: Path
    card_path: Path
    lineage: dict


def build_lineage(
    samples: pl.DataFrame,
    counts: dict,
    decontamination: dict | None,
    sources: list[str] | None = None,
    thresholds: list[float] | None = None,
    verifier_version: str = VERIFIER_VERSION,
) -> dict:
    """The lineage the card states: what went in, at which thresholds, judged by which verifier, what came out."""
    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sources": sources if sources is not None else sorted(set(samples["source_name"].drop_nulls().to_list())),
        "thresholds": thresholds
        if thresholds is not None
        else sorted(set(samples["threshold"].drop_nulls().to_list())),
        "verifier_version": verifier_version,
        "verification_status_counts": dict(
            samples.group_by("verification_status").len().sort("verification_status").iter_rows()
        ),
        "counts": counts,
        "decontamination": decontamination or {"checked": 0, "dropped": 0, "note": "not run"},
    }


def _markdown_table(frame: pl.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows])


def dataset_card(samples: pl.DataFrame, lineage: dict, lengths: dict) -> str:
    """README.md for the exported folder: YAML header (configs pointing at the Parquet file, features) and lineage."""
    counts = lineage["counts"]
    decontamination = lineage["decontamination"]
    features = "\n".join(
        f"    - name: {name}\n      dtype: {_hf_dtype(dtype)}" for name, dtype in samples.schema.items()
    )
    header = (
        "---\n"
        "pretty_name: CuKe (dice-pipeline)\n"
        "license: other\n"
        "task_categories:\n  - text-generation\n"
        "tags:\n  - cuda\n  - code\n  - kernelbench\n"
        "configs:\n  - config_name: default\n    data_files:\n"
        f"      - split: train\n        path: {PARQUET_RELATIVE_PATH}\n"
        f"dataset_info:\n  features:\n{features}\n"
        f"  splits:\n    - name: train\n      num_examples: {samples.height}\n"
        "---\n"
    )
    length_rows = pl.DataFrame(
        [
            {"length": name, **{k: round(v, 1) for k, v in d.items() if k not in ("edges", "counts", "count")}}
            for name, d in lengths.items()
            if d.get("count")
        ]
    )
    body = [
        "# CuKe: verified PyTorch -> CUDA kernel SFT samples",
        "",
        "Built by dice-pipeline after DICE (arXiv 2602.11715): speedup-filtered ConCuR-style pairs plus verified "
        "structure instances (attention/MLP sub-modules), each as the KernelBench one-shot prompt in a Qwen3-style "
        "chat template (`prompt`, with the messages in `prompt_messages`) and the `ModelNew` file as the answer "
        "(`response`, optionally after a `<think>` trace).",
        "",
        "**Licence**: the sources' terms apply (ConCuR declares no licence); check them before redistributing.",
        "",
        "## Lineage",
        "",
        f"- Sources: {', '.join(map(str, lineage['sources'])) or '(none)'}",
        f"- Speedup thresholds: {', '.join(str(t) for t in lineage['thresholds']) or '(none)'}",
        f"- Verifier version: {lineage['verifier_version']}",
        f"- Verification status of the samples: {json.dumps(lineage['verification_status_counts'])}"
        " (`not_executed` means no GPU judged the kernel: its speedup is the source's recorded figure)",
        f"- Candidates: {counts.get('candidates')} -> samples: {counts.get('samples')}",
        f"- Rejected by reason: {json.dumps(counts.get('rejected_by_reason', {}), sort_keys=True)}",
        f"- Duplicates dropped: {counts.get('duplicates_dropped', 0)}",
        f"- Built: {lineage['created_utc']}",
        "",
        "## Decontamination against KernelBench",
        "",
        "The paper does not decontaminate; we do, and report it. References matching any of the 250 KernelBench "
        "level 1-3 tasks after normalisation (names, comments, docstrings and sizes abstracted; shingle Jaccard "
        "and containment) are dropped.",
        "",
        f"- Checked: {decontamination.get('checked')}, dropped: {decontamination.get('dropped')}",
        f"- By rule: {json.dumps(decontamination.get('by_rule', {}), sort_keys=True)}",
        f"- By KernelBench level: {json.dumps(decontamination.get('by_kernelbench_level', {}), sort_keys=True)}",
        f"- Settings: {json.dumps(decontamination.get('config', {}), sort_keys=True)}",
        "",
        "## Composition (source x op family x difficulty)",
        "",
        _markdown_table(composition_table(samples)) if samples.height else "(empty)",
        "",
        "## Lengths",
        "",
        _markdown_table(length_rows) if length_rows.height else "(empty)",
        "",
        "## Loading",
        "",
        "```python",
        "import datasets",
        f'cuke = datasets.load_from_disk("{HF_DISK_FOLDER}")',
        f'# or: datasets.load_dataset("parquet", data_files="{PARQUET_RELATIVE_PATH}")',
        "```",
        "",
    ]
    return header + "\n" + "\n".join(body)


def _hf_dtype(dtype: pl.DataType) -> str:
    mapping = {pl.String: "string", pl.Int64: "int64", pl.Float64: "float64", pl.Boolean: "bool"}
    return mapping.get(dtype, str(dtype).lower())


def export_cuke(
    samples: pl.DataFrame,
    out_dir: str | Path,
    lineage: dict,
    count_tokens: Callable[[str], int] | None = None,
) -> CukeExport:
    """Write `samples` under `out_dir`: `hf_dataset/` (datasets.save_to_disk), `data/train-...parquet` and README.md
    (the dataset card, with `lineage` also saved as `lineage.json`). Loadable with `datasets.load_from_disk`."""
    import datasets

    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    parquet_path = root / PARQUET_RELATIVE_PATH
    parquet_path.parent.mkdir(parents=True, exist_ok=True)
    samples.write_parquet(parquet_path)
    hf_dir = root / HF_DISK_FOLDER
    # Plain (not large) string columns keep the saved features the usual `string` dtype.
    table = samples.to_arrow(compat_level=pl.CompatLevel.oldest())
    # An empty dataset must still be one shard: with zero shards `load_from_disk` fails (datasets 5.2), and an empty
    # result is still a dataset (e.g. a threshold nothing passes, or CPU runs before speedups are measured).
    num_shards = None if samples.height else 1
    datasets.Dataset(table).save_to_disk(str(hf_dir), num_shards=num_shards)
    lengths = length_distributions(samples, count_tokens)
    card_path = root / "README.md"
    card_path.write_text(dataset_card(samples, lineage, lengths), encoding="utf-8")
    (root / "lineage.json").write_text(json.dumps({**lineage, "lengths": lengths}, indent=2, default=str))
    return CukeExport(root=root, hf_dataset_dir=hf_dir, parquet_path=parquet_path, card_path=card_path, lineage=lineage)


__all__ = [
    "CukeExport",
    "build_lineage",
    "composition_table",
    "dataset_card",
    "export_cuke",
    "length_distributions",
]
