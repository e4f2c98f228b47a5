"""The report's "Scaling models" section: each empirical model (ddlbench.analysis.empirical, written by
`ddlbench fit` into <sweep>/models.json) with its formula, cross-validated error and predictions, and
a drawing per throughput series: measured medians with their range over repetitions, the model, its
95 % prediction interval, and the extrapolated part dashed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from markupsafe import Markup

from ddlbench.config import SweepConfig

MODEL_COLUMNS = ["configuration", "figure", "model", "points (obs.)", "LOO SMAPE", "predictions (95 % PI)"]
DRAWN = ("samples_per_s", "efficiency")


def scaling_section(config: SweepConfig) -> dict[str, Any] | None:
    path = Path(config.sweep_dir) / "models.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    models = data.get("models", [])
    if not models:
        return {"why": data.get("why", "no series to model"), "rows": [], "plots": []}
    rows = [
        {
            "configuration": m["label"],
            "figure": f"{m['figure']} ({m['unit'] or 'ratio'})",
            "model": f"{m['figure']} = {m['formula']}",
            "points (obs.)": f"{m['points']} ({m['observations']})",
            "LOO SMAPE": "–" if m["cv_smape_percent"] is None else f"{m['cv_smape_percent']:.2f} %",
            "predictions (95 % PI)": "; ".join(_prediction(m, p) for p in m["predictions"]) or "–",
        }
        for m in models
    ]
    plots = [
        {"title": f"{m['label']}: {m['figure']}", "svg": Markup(_svg(m))}
        for m in models
        if m["figure"] in DRAWN and len(m["parameters"]) == 1 and m["curve"]
    ]
    return {"why": "", "rows": rows, "columns": MODEL_COLUMNS, "plots": plots, "method": models[0]["method"]}


def _prediction(model: dict[str, Any], p: dict[str, Any]) -> str:
    where = ", ".join(f"{name}={value:g}" for name, value in zip(model["parameters"], p["x"], strict=True))
    band = _band_text(p["low"], p["high"])
    return f"{where}: {p['value']:.4g} {band}"


def _svg(model: dict[str, Any]) -> str:
    from ddlbench.report.plots import plt, svg_text

    figure, axes = plt.subplots(figsize=(5.2, 3.4))
    curve = model["curve"]
    largest = max(point["x"][0] for point in model["measured"])
    xs = [c["x"][0] for c in curve]
    inside = [i for i, v in enumerate(xs) if v <= largest * (1 + 1e-9)]
    beyond = [i for i, v in enumerate(xs) if v >= largest * (1 - 1e-9)]
    if any(c["low"] is not None for c in curve):
        nan = float("nan")  # an open end is left undrawn
        lows = [nan if c["low"] is None else c["low"] for c in curve]
        highs = [nan if c["high"] is None else c["high"] for c in curve]
        axes.fill_between(xs, lows, highs, alpha=0.2, label="95 % PI")
    axes.plot([xs[i] for i in inside], [curve[i]["value"] for i in inside], "-", color="C0", label="model")
    if len(beyond) > 1:
        axes.plot([xs[i] for i in beyond], [curve[i]["value"] for i in beyond], "--", color="C0", label="extrapolated")
    measured = model["measured"]
    axes.errorbar(
        [m["x"][0] for m in measured],
        [m["median"] for m in measured],
        yerr=[[m["median"] - m["min"] for m in measured], [m["max"] - m["median"] for m in measured]],
        fmt="o",
        color="C1",
        label="measured (median, range)",
    )
    axes.set_xscale("log", base=2)
    axes.set_xlabel(model["parameters"][0])
    axes.set_ylabel(f"{model['figure']} ({model['unit']})" if model["unit"] else model["figure"])
    axes.legend(fontsize=7)
    figure.tight_layout()
    return svg_text(figure)


def _band_text(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "no band"
    return f"[{'−∞' if low is None else f'{low:.4g}'}, {'∞' if high is None else f'{high:.4g}'}]"
