"""Metadata a person reads in the Dagster UI: row counts, column schema, a Markdown preview, plots, counts."""

import base64
import io
import json
import warnings
from collections.abc import Sequence

import dagster as dg
import polars as pl

from assets.column_descriptions import COLUMN_DESCRIPTIONS, TABLE_COLUMN_DESCRIPTIONS


def column_description(name: str, table: str | None = None) -> str | None:
    return TABLE_COLUMN_DESCRIPTIONS.get(table or "", {}).get(name) or COLUMN_DESCRIPTIONS.get(name)


def column_schema(schema: pl.Schema, table: str | None = None) -> dg.TableSchema:
    """The UI's Columns table: each column's type and what it means (`table` picks a table's own meanings)."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name, str(dtype), description=column_description(name, table))
                 for name, dtype in schema.items()]
    )


def _cell(value, width: int = 60) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_preview(frame: pl.DataFrame, columns: Sequence[str], rows: int = 10) -> str:
    if frame.height == 0:
        return "_(no rows)_"
    head = frame.select(columns).head(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in head.iter_rows():
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if frame.height > rows:
        lines.append(f"\n_{frame.height - rows} more rows_")
    return "\n".join(lines)


def counts_markdown(frame: pl.DataFrame, column: str, title: str) -> str:
    if frame.height == 0:
        return f"**{title}**: none"
    counts = frame.group_by(column).len().sort("len", descending=True)
    lines = [f"| {title} | rows |", "|---|---|"]
    lines += [f"| {value} | {count} |" for value, count in counts.iter_rows()]
    return "\n".join(lines)


def table_metadata(frame: pl.DataFrame, schema: pl.Schema, preview_columns: Sequence[str],
                   table: str | None = None) -> dict:
    return {
        "dagster/row_count": frame.height,
        "dagster/column_schema": column_schema(schema, table),
        "preview": dg.MetadataValue.md(markdown_preview(frame, preview_columns)),
    }


def lineage_query_markdown(threshold_key: str, kept_only: bool) -> str:
    """The warehouse query that links this partition's rows to their source rows and verdicts."""
    where = f"threshold_key = '{threshold_key}'" + (" AND kept" if kept_only else "")
    return (
        "Each row with its source row and verdict (DuckDB, `lineage` views):\n\n```sql\n"
        "SELECT uuid, source_name, source_row, kept, reason_code, speedup_used, speedup_source,\n"
        "       recorded_speedup, measured_speedup, verification_status, verdict_id\n"
        f"FROM lineage.filter_lineage WHERE {where};\n"
        "-- the verdicts themselves: SELECT * FROM lineage.pair_verification WHERE uuid = '...';\n```"
    )


def _png_markdown(fig, title: str) -> str:
    """The figure as a PNG embedded in Markdown. `bbox_inches="tight"` fits every label in the saved image whatever
    the axes' sizes (tight_layout warns and gives up when long tick labels do not fit)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f"![{title}](data:image/png;base64,{encoded})"


def bar_chart_markdown(frame: pl.DataFrame, column: str, title: str) -> str:
    """A horizontal bar chart of row counts per value of `column` (e.g. rejection reasons), as embedded PNG."""
    if frame.height == 0:
        return f"**{title}**: no rows"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = frame.group_by(column).len().sort("len")
    labels = [str(v) for v in counts[column].to_list()]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.35 * len(labels)), dpi=100)
    bars = ax.barh(labels, counts["len"].to_list(), color="#4a78b5")
    ax.bar_label(bars, padding=3)
    ax.set_title(title)
    ax.set_xlabel("rows")
    return _png_markdown(fig, title)


def histogram_markdown(values: Sequence[float], title: str, threshold: float | None = None, log_x: bool = True) -> str:
    """A PNG histogram embedded in Markdown (the UI renders data URIs), with the threshold drawn as a line."""
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return f"**{title}**: no values to plot"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    if log_x and max(values) / min(values) > 20:
        bins = np.logspace(np.log10(min(values)), np.log10(max(values)), 30)
        ax.set_xscale("log")
    else:
        bins = 30
    ax.hist(values, bins=bins, color="#4a78b5")
    if threshold is not None:
        ax.axvline(threshold, color="#c0392b", linestyle="--", label=f"threshold {threshold:g}x")
        ax.legend()
    ax.set_title(title)
    ax.set_xlabel("speedup over eager PyTorch (x)")
    ax.set_ylabel("pairs")
    return _png_markdown(fig, title)


def schema_check(check_name: str, asset_key: dg.AssetKey, frame: pl.DataFrame, schema: pl.Schema):
    """An asset check result: the frame has exactly the declared columns, in order, with the declared types."""
    mismatches = [
        f"{name}: {frame.schema.get(name)} != {dtype}"
        for name, dtype in schema.items()
        if frame.schema.get(name) != dtype
    ]
    extra = [name for name in frame.columns if name not in schema]
    return dg.AssetCheckResult(
        check_name=check_name,
        asset_key=asset_key,
        passed=not mismatches and not extra,
        metadata={"mismatches": ", ".join(mismatches) or "none", "unexpected_columns": ", ".join(extra) or "none"},
    )


def versioned_output(value, data_version: str, **kwargs) -> dg.Output:
    """A `dg.Output` with an explicit data version, so downstream goes stale exactly when the content changes.

    `Output(data_version=...)` is a beta parameter in Dagster 1.13 and warns on every call; we rely on it knowingly
    (a `Config` change does not make downstream stale otherwise: NOTES.md section 5), so the warning is silenced
    here, for this one call, and nowhere else.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.Output(value, data_version=dg.DataVersion(data_version), **kwargs)


def curves_figure(history: Sequence[dict], panels: dict[str, Sequence[str]], title: str):
    """Training curves as one matplotlib figure (None when nothing was recorded): a panel per entry of `panels`
    (panel title -> record keys plotted against `step`). A key whose values are dicts (e.g. the deceptive-rollout
    share by reason) plots one line per dict key. Panels with nothing to plot are left out. The layout is
    constrained, so the figure's title and the panels' titles and legends never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> dict[str, tuple[list, list]]:
        lines: dict[str, tuple[list, list]] = {}
        for index, record in enumerate(history):
            value = record.get(key)
            step = record.get("step", index + 1)
            items = value.items() if isinstance(value, dict) else [(key, value)]
            for name, number in items:
                if isinstance(number, (int, float)) and number == number:
                    xs, ys = lines.setdefault(str(name), ([], []))
                    xs.append(step)
                    ys.append(number)
        return lines

    drawn = {name: {k: v for key in keys for k, v in series(key).items()} for name, keys in panels.items()}
    drawn = {name: lines for name, lines in drawn.items() if lines}
    if not drawn:
        return None
    fig, axes = plt.subplots(1, len(drawn), figsize=(4.2 * len(drawn), 3.4), dpi=100, squeeze=False,
                             layout="constrained")
    for ax, (name, lines) in zip(axes[0], drawn.items()):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
        ax.set_title(name, fontsize=10, wrap=True)
        ax.set_xlabel("step")
        if len(lines) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=12)
    return fig


def curves_markdown(history: Sequence[dict], panels: dict[str, Sequence[str]], title: str) -> str:
    """`curves_figure` as one PNG embedded in Markdown."""
    fig = curves_figure(history, panels, title)
    return f"**{title}**: no steps recorded" if fig is None else _png_markdown(fig, title)
