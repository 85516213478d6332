"""`dice export-training-data DIR`: dump the warehouse's training tables for one threshold (CuKe SFT samples, the
kernel-infilling tasks, the end-to-end RL pool) to JSONL files a GPU host without DuckDB can read
(`training.stages`, `benchmarks/train_pipeline_gpu.py`), plus KernelBench's tasks for evaluation, each task's
operator family and the families held out of training (`kernelbench_families.json`: evaluation reports seen and
unseen families apart), and a manifest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from dice_pipeline.cli import summary

# file name -> (warehouse table, columns the training stages read); the partitioned CuKe tables are filtered by
# threshold, the RL pool is not partitioned.
EXPORTS = {
    "sft_samples.jsonl": ("cuke_sft_samples", ["sample_id", "source", "problem_name", "op_family", "family",
                                               "difficulty", "prompt_messages", "prompt", "response", "pytorch_code"]),
    "infilling_tasks.jsonl": ("cuke_infilling_tasks", ["task_id", "source", "family", "prompt_messages",
                                                       "pytorch_code", "prefix", "ground_truth_middle", "suffix",
                                                       "difficulty"]),
    "end_to_end_tasks.jsonl": ("rl_end_to_end_tasks", ["schedule_position", "task_id", "source", "family",
                                                       "difficulty", "op_family", "pytorch_code"]),
}
KERNELBENCH_FILE = "kernelbench_tasks.jsonl"
FAMILIES_FILE = "kernelbench_families.json"


def register(subparsers) -> None:
    parser = subparsers.add_parser("export-training-data", help="dump the training tables to JSONL for a GPU host",
                                   description=summary(__doc__))
    parser.add_argument("out", type=Path, help="folder to write (e.g. training_data/, git-ignored)")
    parser.add_argument("--threshold", default="2.0", help="the CuKe threshold partition (canonical key)")
    parser.add_argument("--warehouse", type=Path, default=None, help="default: DICE_WAREHOUSE_PATH or the project's")
    parser.add_argument("--kernelbench", type=Path, default=None,
                        help="KernelBench tasks.jsonl to copy beside them (default: DICE_KERNELBENCH_TASKS or the "
                             "shared copy; skipped with a note when none is found)")
    parser.set_defaults(func=run_export)


def export_training_data(out: Path, threshold: str, warehouse_path: Path | None = None,
                         kernelbench: Path | None = None) -> dict:
    """Write the files and `manifest.json` (row counts, threshold, warehouse, time); returns the manifest."""
    from dice_pipeline.paths import kernelbench_tasks_path
    from dice_pipeline.paths import warehouse_path as default_warehouse
    from warehouse import Warehouse, table_for

    path = warehouse_path or default_warehouse()
    if not Path(path).is_file():
        raise FileNotFoundError(f"no warehouse at {path}: run `dice run` first")
    warehouse = Warehouse(path)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, (table, columns) in EXPORTS.items():
        spec = table_for(table)
        frame = warehouse.read(spec, partition_keys=[threshold] if spec.partition_column else None)
        frame = frame.select([c for c in columns if c in frame.columns])
        (out / name).write_text("".join(json.dumps(row) + "\n" for row in frame.to_dicts()), encoding="utf-8")
        counts[name] = frame.height
    source = kernelbench or kernelbench_tasks_path()
    if source is not None and Path(source).is_file():
        from dice_pipeline.cuke.family_report import kernelbench_family_map
        from dice_pipeline.kernelbench import load_kernelbench_tasks
        from dice_pipeline.synthesis.operators import HELD_OUT_FAMILIES

        shutil.copyfile(source, out / KERNELBENCH_FILE)
        counts[KERNELBENCH_FILE] = sum(1 for line in (out / KERNELBENCH_FILE).read_text().splitlines() if line.strip())
        families = kernelbench_family_map(load_kernelbench_tasks(source).tasks)
        covered = {key: family for key, family in families.items() if family != "not_covered"}
        (out / FAMILIES_FILE).write_text(json.dumps({
            "held_out_families": list(HELD_OUT_FAMILIES), "family_of": covered,
            "not_covered": sorted(key for key in families if key not in covered)}, indent=1, sort_keys=True))
        counts[FAMILIES_FILE] = len(families)
    manifest = dict(threshold=threshold, warehouse=str(path), rows=counts,
                    kernelbench=str(source) if KERNELBENCH_FILE in counts else None,
                    exported_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def run_export(args: argparse.Namespace) -> int:
    try:
        manifest = export_training_data(args.out, args.threshold, args.warehouse, args.kernelbench)
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, rows in manifest["rows"].items():
        print(f"{args.out / name}: {rows} rows")
    if manifest["rows"].get("sft_samples.jsonl", 0) == 0:
        print(f"warning: no CuKe samples at threshold {args.threshold}", file=sys.stderr)
    if manifest["kernelbench"] is None:
        print("note: no KernelBench tasks found; set DICE_KERNELBENCH_TASKS or pass --kernelbench", file=sys.stderr)
    return 0
