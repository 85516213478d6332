"""Every warehouse table's schema is declared once, in dice_pipeline/schemas.py: the table declarations import no
stage module for it, and the stages use the same schema objects."""

import ast
import subprocess
import sys
from pathlib import Path

import polars as pl

import warehouse.tables
from dice_pipeline import schemas

ROOT = Path(__file__).resolve().parents[2]


def test_table_declarations_import_schemas_only():
    tree = ast.parse((ROOT / "warehouse" / "tables.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {m for m in imported if m.startswith("dice_pipeline")} == {"dice_pipeline", "dice_pipeline.schemas"}
    # and importing them loads no CuKe module (nothing like decontamination's KernelBench index comes along)
    code = "import sys, warehouse.tables; print(sorted(m for m in sys.modules if m.startswith('dice_pipeline.cuke')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_table_schema_is_declared_in_schemas_py():
    declared = [dict(value) for value in vars(schemas).values() if isinstance(value, pl.Schema)]
    for name, spec in warehouse.tables.TABLES.items():
        columns = dict(spec.schema)
        if spec.schema_name == "cuke":  # prefixed with the partition column the warehouse adds
            columns.pop(warehouse.tables.CUKE_PARTITION_COLUMN)
        assert columns in declared, name


def test_the_cuke_modules_re_export_the_declared_schemas():
    from dice_pipeline.cuke import decontaminate, infilling, rl_pool, samples

    assert samples.CUKE_SFT_SAMPLES is schemas.CUKE_SFT_SAMPLES and samples.CUKE_SFT_REJECTS is schemas.CUKE_SFT_REJECTS
    assert decontaminate.DECONTAMINATION_DROPS is schemas.DECONTAMINATION_DROPS
    assert infilling.INFILLING_REJECTS is schemas.INFILLING_REJECTS
    assert infilling.STAGE1_TASK_SCHEMA is schemas.STAGE1_TASK_SCHEMA
    assert rl_pool.RL_TASK_POOL is schemas.RL_TASK_POOL
