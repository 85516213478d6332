"""Comparison reports: our checkpoints and comparison rows at both tolerances, beside the paper's published numbers.
Standard library only: the GPU script writes the same report as the Dagster asset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dice_pipeline.evaluation.metrics import FAST_P_CONVENTION
from dice_pipeline.evaluation.paper import PAPER_RESULTS, PAPER_SOURCE


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}"


def _triple(row: dict[str, Any]) -> str:
    text = f"{_pct(row['exec_rate'])} / {_pct(row['fast_1'])} / {_pct(row['fast_2'])}"
    text += " *" if row.get("n_not_executed") or row.get("executed") is False else ""
    return text + (" †" if row.get("complete") is False else "")


def comparison_markdown(metric_rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per tolerance, a model x level table of Exec / fast1 / fast2 (%) with the paper's rows under ours,
    then a detail table (compile rate, all fast_p, host-convention fast1/fast2, geomean speedup, deceptive rate).
    `metric_rows`: rows of `level_metrics` with `checkpoint` and `level` added."""
    levels = sorted({int(r["level"]) for r in metric_rows} | {1, 2, 3})
    lines = ["# KernelBench comparison", "",
             f"Exec / fast1 / fast2 in % of all tasks of a level. fast_p: correct and speedup strictly greater than "
             f"p over eager PyTorch measured on the same GPU in the same worker (`speedup_{FAST_P_CONVENTION}`: "
             "GPU-time convention, flush and call enqueued back to back, as KernelBench / do_bench; "
             "`speedup_host` shown in the detail table). `*`: the evaluation ran without a GPU or some tasks were "
             "not executed: those rates are not measured results. `†`: incomplete: the evaluation stopped before every "
             "task was generated and judged (a time box: tasks without a verdict count as failures), or took only the "
             "level's first tasks (`--max-tasks`, a smoke test: rates over those tasks).", ""]
    for tolerance in ("1e-2", "1e-4"):
        rows = [r for r in metric_rows if r["tolerance"] == tolerance]
        lines += [f"## atol = rtol = {tolerance}" + (" (the paper's tolerance)" if tolerance == "1e-2" else
                                                      " (KernelBench's current fp32 policy)"), ""]
        lines += ["| model | source | " + " | ".join(f"L{lv}" for lv in levels) + " |",
                  "|---|---|" + "---|" * len(levels)]
        for name in sorted({r["checkpoint"] for r in rows}):
            cells = {int(r["level"]): _triple(r) for r in rows if r["checkpoint"] == name}
            lines.append(f"| {name} | measured here | " + " | ".join(cells.get(lv, "–") for lv in levels) + " |")
        if tolerance == "1e-2":
            for model, by_level in PAPER_RESULTS.items():
                cells = [" / ".join(f"{x:g}" for x in by_level[lv]) if lv in by_level else "–" for lv in levels]
                lines.append(f"| {model} | paper | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Detail", "", "| model | level | tol | tasks | compile % | Exec % | fast_0 | fast_0.5 | fast_0.8 | "
              "fast_1 | fast_1.5 | fast_2 | fast_1 host | fast_2 host | geomean speedup (gpu) | deceptive % | "
              "not executed | known-issue tasks correct |", "|" + "---|" * 18]
    for r in sorted(metric_rows, key=lambda r: (r["checkpoint"], int(r["level"]), r["tolerance"])):
        geomean = r.get(f"geomean_speedup_{FAST_P_CONVENTION}")
        lines.append("| " + " | ".join([
            r["checkpoint"], str(r["level"]), r["tolerance"], str(r["n_tasks"]), _pct(r["compile_rate"]),
            _pct(r["exec_rate"]), *(_pct(r[f"fast_{p}"]) for p in ("0", "0.5", "0.8", "1", "1.5", "2")),
            _pct(r.get("fast_1_host")), _pct(r.get("fast_2_host")), "–" if geomean is None else f"{geomean:.2f}x",
            _pct(r["deceptive_rate"]), str(r["n_not_executed"]),
            f"{r['n_correct_on_known_issue_tasks']}/{r['n_known_issue_tasks']}"]) + " |")
    lines += ["", f"Paper rows: {PAPER_SOURCE}. Known-issue tasks (NOTES §2: live dropout, random forward, integer "
              "inputs, zeros pass at 1e-2) stay in every denominator; the last column counts how many of them were "
              "scored correct."]
    return "\n".join(lines) + "\n"
