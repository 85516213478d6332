"""The DuckDB warehouse: table declarations (`tables`), connection helpers (`connection`), lineage views."""

from pathlib import Path

from warehouse.connection import BUILDS_TABLE, Provenance, Warehouse
from warehouse.tables import TABLES, table_for

LINEAGE_VIEWS_SQL = (Path(__file__).with_name("lineage_views.sql")).read_text()


def open_warehouse(path=None) -> Warehouse:
    from dice_pipeline.paths import warehouse_path

    return Warehouse(path or warehouse_path())


def install_lineage_views(wh: Warehouse) -> None:
    wh.install_views(LINEAGE_VIEWS_SQL, list(TABLES.values()))


__all__ = [
    "BUILDS_TABLE",
    "LINEAGE_VIEWS_SQL",
    "TABLES",
    "Provenance",
    "Warehouse",
    "install_lineage_views",
    "open_warehouse",
    "table_for",
]
