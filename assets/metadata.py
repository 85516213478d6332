"""Metadata a person reads in the Dagster UI: row counts, column schema, a Markdown preview, plots, counts."""

import base64
import io
import json
import warnings
from collections.abc import Sequence

import dagster as dg
import polars as pl


# What a column means, shown beside it on every asset page that has it (the UI's Columns table).
COLUMN_DESCRIPTIONS = {
    "uuid": "the pair's id in its source (ConCuR's uuid); joins every table of the pair",
    "problem_name": "the PyTorch reference task's name",
    "pytorch_code": "the PyTorch reference (class Model, get_inputs, get_init_inputs)",
    "generated_code": "the candidate CUDA kernel (class ModelNew)",
    "generated_think": "the reasoning the source model wrote before the kernel",
    "source_name": "where the row was read from, e.g. embedded, hf:lkongam/ConCuR, parquet:/data/x.parquet",
    "source_row": "0-based row index in that source, to trace a row back",
    "speedup_over_eager": "speedup over eager PyTorch as the source recorded it (not measured by us)",
    "threshold_key": "the threshold partition (canonical key, e.g. 2.0)",
    "threshold": "the speedup threshold, as a number",
    "speedup_used": "the speedup the decision used: measured by our verifier on a GPU, else the source's",
    "speedup_source": "measured (our verifier, on a GPU) or recorded (the source's figure)",
    "verification_status": "our verifier's status for the pair (correct, not_executed, incorrect, deceptive, ...)",
    "verdict_id": "the verdict in verify.verified_pairs this row rests on",
    "kept": "whether the pair passed at this threshold",
    "reason_code": "why the row was dropped or rejected (kept when it was not)",
    "measured_speedup": "speedup over eager PyTorch measured by our verifier (empty when not executed)",
    "executed": "whether the verifier ran the candidate on a GPU",
}


def column_schema(schema: pl.Schema) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name, str(dtype), description=COLUMN_DESCRIPTIONS.get(name))
            for name, dtype in schema.items()
        ]
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


def table_metadata(frame: pl.DataFrame, schema: pl.Schema, preview_columns: Sequence[str]) -> dict:
    return {
        "dagster/row_count": frame.height,
        "dagster/column_schema": column_schema(schema),
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


def curves_markdown(history: Sequence[dict], panels: dict[str, Sequence[str]], title: str) -> str:
    """Training curves as one PNG embedded in Markdown: a panel per entry of `panels` (panel title -> record keys
    plotted against `step`). A key whose values are dicts (e.g. the deceptive-rollout share by reason) plots one
    line per dict key. Panels with nothing to plot are left out."""
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
        return f"**{title}**: no steps recorded"
    fig, axes = plt.subplots(1, len(drawn), figsize=(4 * len(drawn), 3), dpi=100, squeeze=False)
    for ax, (name, lines) in zip(axes[0], drawn.items()):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
        if len(lines) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    return _png_markdown(fig, title)
