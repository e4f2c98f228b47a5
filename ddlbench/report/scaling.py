"""The report's scaling models, in each model × dataset's section: the empirical models of its series
(ddlbench.analysis.empirical, written by `ddlbench fit` into <sweep>/models.json) with their formula,
cross-validated error and predictions, and charts of throughput and efficiency: measured medians with
their range over repetitions, the model, its 95 % prediction interval (shaded), extrapolations dotted.

A large sweep has a model per series and figure (a 10,000-point sweep: 2,000 of them): a section draws
at most MAX_DRAWN series (beyond that, each strategy's series fastest at its largest scale, as its
charts do) and lists the models of the series it draws when it has more than MAX_LISTED; models.json
has them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from ddlbench.analysis.stamps import stale_reason, sweep_stamp, table_digest
from ddlbench.config import SweepConfig
from ddlbench.report.charts import Axis, Line, Mark, colour, line_chart

MODEL_COLUMNS = ["Configuration", "Figure", "Model", "Points (observations)", "LOO SMAPE", "Predictions (95 % PI)"]
DRAWN = (("samples_per_s", "Throughput model", "samples/s"), ("efficiency", "Efficiency model", "efficiency"))
MAX_DRAWN = 8
MAX_LISTED = 40
LOG_SPAN = 4.0


def scaling_section(config: SweepConfig, table: pd.DataFrame) -> dict[str, Any] | None:
    """models.json's models, or why there are none (or why they are not shown: fitted on another table,
    ddlbench.analysis.stamps); None without the file."""
    path = Path(config.sweep_dir) / "models.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    expected = sweep_stamp(config) | {"table_sha256": table_digest(table)}
    stale = stale_reason(data, expected, what=str(path), remedy="`ddlbench report` fits them again")
    if stale:
        return {"why": stale, "models": []}
    models = data.get("models", [])
    if not models:
        return {"why": data.get("why", "no series to model"), "models": []}
    return {"why": "", "models": models, "columns": MODEL_COLUMNS, "method": models[0]["method"]}


def pair_of(model: dict[str, Any]) -> tuple[str, str] | None:
    """The model × dataset of the series (models.json of ddlbench before it said so: None, shown apart)."""
    if model.get("model") is None or model.get("dataset") is None:
        return None
    return (str(model["model"]), str(model["dataset"]))


def scaling_block(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Charts, legend and table rows of a set of models (one model × dataset's, or those shown apart)."""
    drawable = [m for m in models if len(m["parameters"]) == 1 and m["measured"]]
    throughput = [m for m in drawable if m["figure"] == "samples_per_s"]
    chosen = throughput if len(throughput) <= MAX_DRAWN else _fastest_per_strategy(throughput)
    labels = [m["label"] for m in chosen]
    charts = []
    for figure, title, unit in DRAWN:
        of_figure = {m["label"]: m for m in drawable if m["figure"] == figure}
        drawn = [of_figure[label] for label in labels if label in of_figure]
        if drawn:
            charts.append(Markup(_chart(drawn, labels, title, unit)))
    listed = models if len(models) <= MAX_LISTED else [m for m in models if m["label"] in set(labels)]
    note = ""
    if len(chosen) < len(throughput):
        note = f"{len(chosen)} of {len(throughput)} series drawn: each strategy's fastest at its largest scale"
    if len(listed) < len(models):
        note += f"{'; ' if note else ''}{len(listed)} of {len(models)} models listed (models.json has them all)"
    return {
        "charts": charts,
        "legend": [{"label": _short(label), "colour": colour(i)} for i, label in enumerate(labels)],
        "rows": [_row(m) for m in listed],
        "note": note,
    }


def _fastest_per_strategy(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy (a label's first word), the series with the highest median at its largest measured x."""
    best: dict[str, tuple[tuple[float, float], dict[str, Any]]] = {}
    for model in models:
        last = max(model["measured"], key=lambda point: point["x"][0])
        rank = (float(last["x"][0]), float(last["median"]))
        strategy = model["label"].split(" ")[0]
        if strategy not in best or rank > best[strategy][0]:
            best[strategy] = (rank, model)
    return sorted((model for _, model in best.values()), key=lambda m: m["label"])[:MAX_DRAWN]


def _short(label: str) -> str:
    """A series' label without its model and dataset (its second and third words), named by the section."""
    words = label.split(" ")
    return " ".join(words[:1] + words[3:])


def _row(model: dict[str, Any]) -> dict[str, str]:
    return {
        "Configuration": model["label"],
        "Figure": f"{model['figure']} ({model['unit'] or 'ratio'})",
        "Model": f"{model['figure']} = {model['formula']}",
        "Points (observations)": f"{model['points']} ({model['observations']})",
        "LOO SMAPE": "–" if model["cv_smape_percent"] is None else f"{model['cv_smape_percent']:.2f} %",
        "Predictions (95 % PI)": "; ".join(_prediction(model, p) for p in model["predictions"]) or "–",
    }


def _chart(models: list[dict[str, Any]], labels: list[str], title: str, unit: str) -> str:
    lines = []
    for model in models:
        tint = colour(labels.index(model["label"]))
        name = _short(model["label"])
        largest = max(point["x"][0] for point in model["measured"])
        inside = _thin([c for c in model["curve"] if c["x"][0] <= largest * (1 + 1e-9)])
        beyond = _thin([c for c in model["curve"] if c["x"][0] >= largest * (1 - 1e-9)])
        curve = inside + beyond
        band = tuple((c["x"][0], c["low"], c["high"]) for c in curve if c["low"] is not None and c["high"] is not None)
        lines.append(Line(label=f"{name}: model", colour=tint, marks=_marks(inside), dots=False, band=band))
        if len(beyond) > 1:
            lines.append(
                Line(label=f"{name}: extrapolated", colour=tint, marks=_marks(beyond), dashed=True, dots=False)
            )
        measured = tuple(
            Mark(x=p["x"][0], y=p["median"], low=p["min"], high=p["max"],
                 note=f"{name}, {model['parameters'][0]} {p['x'][0]:g}: {p['median']:.4g} (range {p['min']:.4g} to "
                      f"{p['max']:.4g}, n={p['n']})")
            for p in model["measured"]
        )  # fmt: skip
        lines.append(Line(label=f"{name}: measured", colour=tint, marks=measured, width=0))
    values = [m.y for line in lines for m in line.marks if m.y > 0]
    y_log = bool(values) and max(values) / min(values) >= LOG_SPAN
    parameter = models[0]["parameters"][0]
    return line_chart(lines, title=title, x=Axis(label=parameter, log=True, base=2), y=Axis(label=unit, log=y_log))


def _thin(curve: list[dict[str, Any]], every: int = 4) -> list[dict[str, Any]]:
    """Every 4th point of a curve and its last: a smooth line at a chart's size, a quarter of the bytes."""
    return curve[::every] + (curve[-1:] if (len(curve) - 1) % every else [])


def _marks(curve: list[dict[str, Any]]) -> tuple[Mark, ...]:
    return tuple(Mark(x=c["x"][0], y=c["value"]) for c in curve)


def _prediction(model: dict[str, Any], p: dict[str, Any]) -> str:
    where = ", ".join(f"{name}={value:g}" for name, value in zip(model["parameters"], p["x"], strict=True))
    band = _band_text(p["low"], p["high"])
    return f"{where}: {p['value']:.4g} {band}"


def _band_text(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "no band"
    return f"[{'−∞' if low is None else f'{low:.4g}'}, {'∞' if high is None else f'{high:.4g}'}]"
