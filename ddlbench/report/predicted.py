"""The report's "Predicted beside measured" section: every point's predicted and measured step time and
peak memory with their accuracies, the averages per strategy and overall, and the strategy the model
would have picked beside the one that was fastest (ddlbench.analysis.analytic.accuracy has the formulas).

Reads <sweep>/predictions.csv, written by `ddlbench predict` (workflow/rules/predict.smk) when the sweep
names a machine file or a calibration suite. No torch here: the predictions are a table by then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.analysis.analytic.accuracy import by_strategy, join, overall, picks
from ddlbench.config import SweepConfig
from ddlbench.report.figures import Cell, interval_text, number

PREDICTED_COLUMNS = [
    "point_id", "strategy", "measured step (ms)", "predicted step", "time accuracy", "compute", "exposed comm",
    "bubble", "measured peak", "predicted peak", "memory accuracy", "bottleneck",
]  # fmt: skip
ACCURACY_COLUMNS = [
    "strategy",
    "points",
    "time accuracy (mean)",
    "time (worst)",
    "memory accuracy (mean)",
    "memory (worst)",
]


def _pct(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * float(value):.1f} %"


def _ms(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{1e3 * float(value):.4g} ms"


def _mb(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{float(value) / 1e6:.4g} MB"


def predicted_section(config: SweepConfig, table: pd.DataFrame) -> dict[str, Any] | None:
    """The section's context, or None when the sweep predicts nothing."""
    if config.machine_path is None:
        return None
    path = Path(config.sweep_dir) / "predictions.csv"
    if not path.exists():
        return {"missing": f"no predictions at {path}: run `ddlbench predict` (the workflow's predict rule)"}
    predictions = pd.read_csv(path)
    joined = join(table, predictions)
    rows = []
    for row in joined.to_dict("records"):
        ms = [
            None if pd.isna(row.get(k)) else 1e3 * float(row[k])
            for k in ("step_time_s_median", "step_time_s_ci_low", "step_time_s_ci_high")
        ]
        measured = interval_text(*ms, row.get("step_time_s_n"), unit="steps")
        rows.append(
            {
                "point_id": Cell(text=str(row["point_id"]), is_text=True),
                "strategy": Cell(text=str(row["strategy"]), is_text=True),
                "measured step (ms)": Cell(text=measured),
                "predicted step": Cell(text=_ms(row["predicted_step_time_s"])),
                "time accuracy": Cell(text=_pct(row["time_accuracy"])),
                "compute": Cell(text=_ms(row.get("predicted_compute_s"))),
                "exposed comm": Cell(text=_ms(row.get("predicted_comm_exposed_s"))),
                "bubble": Cell(text=_ms(row.get("predicted_bubble_s"))),
                "measured peak": Cell(text=_mb(row.get("tensor_peak_bytes"))),
                "predicted peak": Cell(text=_mb(row.get("predicted_peak_memory_bytes"))),
                "memory accuracy": Cell(text=_pct(row["memory_accuracy"])),
                "bottleneck": Cell(text=str(row.get("predicted_bottleneck", "")), is_text=True),
            }
        )
    strategies = by_strategy(joined)
    time_all, memory_all = overall(strategies)
    return {
        "machine": str(config.machine_path),
        "sources": sorted({str(s) for s in predictions.get("compute_source", pd.Series(dtype=str)).dropna()}),
        "rows": rows,
        "columns": PREDICTED_COLUMNS,
        "accuracy": [
            {
                "strategy": s.strategy,
                "points": number(s.points),
                "time accuracy (mean)": _pct(s.time_accuracy),
                "time (worst)": _pct(s.time_worst),
                "memory accuracy (mean)": _pct(s.memory_accuracy),
                "memory (worst)": _pct(s.memory_worst),
            }
            for s in strategies
        ],
        "accuracy_columns": ACCURACY_COLUMNS,
        "overall_time": _pct(time_all),
        "overall_memory": _pct(memory_all),
        "points": len(joined),
        "picks": [
            {
                "group": p.group,
                "strategies": p.strategies,
                "predicted": p.predicted_best,
                "measured": p.measured_best,
                "agrees": "yes" if p.agrees else "no",
                "regret": _pct(p.regret),
            }
            for p in picks(joined)
        ],
    }
