"""The report's predictions beside measurements: every point's predicted and measured step time and
peak memory with their accuracies (a table per model × dataset section), the averages per strategy and
overall (ddlbench.analysis.analytic.accuracy has the formulas), and per cell (one scale's choice) the
configuration the model recommends beside the one measured fastest, with the share of cells where the
recommendation is the best or within its run-to-run interval (ddlbench.analysis.analytic.recommendation).

Reads <sweep>/predictions.csv, written by `ddlbench predict` (workflow/rules/predict.smk) when the sweep
names a machine file or a calibration suite. No torch here: the predictions are a table by then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.analysis.analytic.accuracy import by_strategy, join, overall
from ddlbench.analysis.analytic.recommendation import Cell, Score, score
from ddlbench.analysis.stamps import file_digest, stale_reason, sweep_stamp
from ddlbench.config import SweepConfig
from ddlbench.report.figures import number
from ddlbench.report.tables import Spec

# the points' table (drawn by the page's script, ddlbench.report.tables), per model × dataset section
PREDICTED_SPECS = [
    Spec(key="point_id", kind="text"),
    Spec(key="strategy", kind="text"),
    Spec(key="measured_step_ms", kind="figure", source="step_time_s", n_column="step_time_s_n", factor=1e3),
    Spec(key="predicted_step_ms", source="predicted_step_time_s", factor=1e3),
    Spec(key="time_accuracy", factor=100),
    Spec(key="predicted_compute_ms", source="predicted_compute_s", factor=1e3),
    Spec(key="predicted_comm_ms", source="predicted_comm_exposed_s", factor=1e3),
    Spec(key="predicted_bubble_ms", source="predicted_bubble_s", factor=1e3),
    Spec(key="measured_peak_mb", source="tensor_peak_bytes", factor=1e-6),
    Spec(key="predicted_peak_mb", source="predicted_peak_memory_bytes", factor=1e-6),
    Spec(key="memory_accuracy", factor=100),
    Spec(key="bottleneck", source="predicted_bottleneck", kind="text"),
]
ACCURACY_COLUMNS = [
    "strategy",
    "points",
    "time accuracy (mean)",
    "time (worst)",
    "memory accuracy (mean)",
    "memory (worst)",
]


RECOMMENDATION_COLUMNS = [
    "cell",
    "configurations compared",
    "recommended",
    "predicted (samples/s)",
    "measured best",
    "recommended, measured (samples/s)",
    "best, measured (samples/s)",
    "recommended ÷ best [95 % CI]",
    "launches",
    "verdict",
    "hit",
]


def _pct(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * float(value):.1f} %"


def _ratio(cell: Cell) -> str:
    if cell.ratio is None:
        return "–"
    interval = f" [{cell.ci_low:.3g}, {cell.ci_high:.3g}]" if cell.ci_low is not None else ""
    return f"{cell.ratio:.3g}{interval}"


def recommendation_context(result: Score) -> dict[str, Any]:
    """The recommendation's headline, rule and one row per cell (RECOMMENDATION_COLUMNS)."""
    return {
        "headline": (
            f"{result.hits} of {result.n} cells ({_pct(result.share)}) recommend the measured best or one "
            f"within its interval; target ≥ {100 * result.target:.0f} %"
        ),
        "met": result.met,
        "rule": result.rule,
        "columns": RECOMMENDATION_COLUMNS,
        "rows": [
            {
                "cell": c.label,
                "configurations compared": ", ".join(c.compared),
                "recommended": c.recommended,
                "predicted (samples/s)": f"{c.recommended_predicted_samples_per_s:.4g}",
                "measured best": c.measured_best,
                "recommended, measured (samples/s)": f"{c.recommended_samples_per_s:.4g}",
                "best, measured (samples/s)": f"{c.best_samples_per_s:.4g}",
                "recommended ÷ best [95 % CI]": _ratio(c),
                "launches": f"{c.launches[0]}+{c.launches[1]}",
                "verdict": c.verdict,
                "hit": "yes" if c.hit else "no",
            }
            for c in result.cells
        ],
    }


def predicted_section(config: SweepConfig, table: pd.DataFrame) -> dict[str, Any] | None:
    """The section's context, or None when the sweep predicts nothing."""
    if config.machine_path is None:
        return None
    path = Path(config.sweep_dir) / "predictions.csv"
    if not path.exists():
        return {"missing": f"no predictions at {path}: `ddlbench report` makes them (the sweep knows its machine)"}
    if not Path(config.machine_path).exists():
        return {"missing": f"the machine file {config.machine_path} does not exist: its predictions are not shown"}
    predictions = pd.read_csv(path)
    expected = sweep_stamp(config) | {"machine_sha256": file_digest(Path(config.machine_path))}
    found = {key: predictions[key].iloc[0] if key in predictions and len(predictions) else None for key in expected}
    stale = stale_reason(found, expected, what=str(path), remedy="`ddlbench report` predicts again")
    if stale:
        return {"missing": stale}
    joined = join(table, predictions).sort_values(["model", "dataset", "point_id"], kind="stable")
    joined = joined.reset_index(drop=True)
    strategies = by_strategy(joined)
    time_all, memory_all = overall(strategies)
    return {
        "machine": str(config.machine_path),
        "sources": sorted({str(s) for s in predictions.get("compute_source", pd.Series(dtype=str)).dropna()}),
        "frame": joined,
        "specs": PREDICTED_SPECS,
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
        "recommendation": recommendation_context(score(joined)),
    }
