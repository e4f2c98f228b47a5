"""A series modelled: the chosen hypothesis, its errors, and its predictions with bands at asked scales.

What is written (models.json, `ddlbench fit --format json`) per series: the figure and its unit, what is
held fixed, the parameters, the formula, the coefficients and terms, the points and observations it rests
on, its in-sample SMAPE and leave-one-out SMAPE (percent), the residual standard deviation s (the
figure's unit), the measured points (median and range of the repetitions) and the predictions with
their 95 % prediction interval (ddlbench.analysis.empirical.regression), each flagged as inside the
measured range or an extrapolation, with how far (largest ratio to the largest measured value of a
parameter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlbench.analysis.empirical.combine import Combined
from ddlbench.analysis.empirical.regression import Fit
from ddlbench.analysis.empirical.search import search_extrap
from ddlbench.analysis.empirical.series import Series
from ddlbench.analysis.empirical.terms import term_text
from ddlbench.errors import DdlbenchError

METHODS = ("extrap", "ddlbench")


# What each figure is over a count of devices (nodes, ranks), for ddlbench's search: a throughput
# (Amdahl's law), a rate per device, or a duration or cost per sample proportional to p/R, which
# Amdahl's law makes linear in p (ddlbench.analysis.empirical.extrapolation). Over other parameters
# (a batch size, threads) every figure gets the forward-validated normal form, kept positive if a time.
DEVICE_PARAMETERS = ("nodes", "world_size", "ranks_per_node")
FIGURE_KINDS = {
    "samples_per_s": "throughput",
    "speedup": "throughput",
    "efficiency": "per_device",
    "step_time_s": "amdahl_time",
    "cost_node_h_per_epoch": "amdahl_time",
    "cost_per_epoch": "amdahl_time",
}


def figure_kind(figure: str, parameters: tuple[str, ...]) -> str:
    """The kind ddlbench's search models `figure` as, over `parameters`."""
    kind = FIGURE_KINDS.get(figure, "other")
    if len(parameters) == 1 and parameters[0] in DEVICE_PARAMETERS:
        return kind
    return "time" if kind == "amdahl_time" else "other"


def search(
    names: tuple[str, ...], x: np.ndarray, values: list[list[float]], method: str = "ddlbench", kind: str = "other"
) -> Fit:
    """The hypothesis `method` selects (see ddlbench.analysis.empirical.search and .extrapolation)."""
    if method == "extrap":
        return search_extrap(names, x, values)
    if method == "ddlbench":
        from ddlbench.analysis.empirical.extrapolation import search_ddlbench

        return search_ddlbench(names, x, values, kind=kind)
    raise DdlbenchError(f"method {method!r} unknown; methods: {', '.join(METHODS)}")


@dataclass(frozen=True, kw_only=True)
class Prediction:
    x: tuple[float, ...]
    value: float
    low: float | None  # None: no band (too few observations), or open below
    high: float | None  # None: no band, or open above (an inverse fit whose denominator's band reaches 0)
    extrapolation: float  # 1 inside the measured range, else the largest ratio beyond it

    def to_dict(self) -> dict[str, Any]:
        return {
            "x": list(self.x),
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "beyond": self.extrapolation,
        }


def predict(fit: Fit, measured: np.ndarray, at: list[tuple[float, ...]]) -> list[Prediction]:
    if not at:
        return []
    points = np.asarray(at, dtype=float).reshape(len(at), len(fit.names))
    values = fit.predict(points).tolist()
    band = fit.band(points)
    low, high = (None, None) if band is None else (_ends(band[0]), _ends(band[1]))
    largest = measured.max(axis=0)
    ratios = np.divide(points, largest, out=np.ones_like(points), where=largest > 0)
    beyond = np.maximum(1.0, ratios.max(axis=1)).tolist()
    return [
        Prediction(
            x=tuple(row),
            value=values[k],
            low=None if low is None else low[k],
            high=None if high is None else high[k],
            extrapolation=beyond[k],
        )
        for k, row in enumerate(points.tolist())
    ]


def _ends(end: np.ndarray) -> list[float | None]:
    """One end of a band as numbers; None where it is open (a transformed band whose end is not finite)."""
    return [float(v) if math.isfinite(v) else None for v in end.tolist()]


def model_series(series: Series, *, method: str = "ddlbench", at: list[tuple[float, ...]] = ()) -> dict[str, Any]:
    """The series' model as a plain mapping (see the module docstring)."""
    x = series.array()
    fit = search(series.parameters, x, series.lists(), method, figure_kind(series.figure, series.parameters))
    return {
        "figure": series.figure,
        "unit": series.unit,
        "label": series.label,
        # which model × dataset the series belongs to (the report files its drawing under them)
        "model": series.fixed.get("model"),
        "dataset": series.fixed.get("dataset"),
        "parameters": list(series.parameters),
        "method": method,
        **describe_fit(fit),
        "measured": [
            {"x": list(point), "median": float(np.median(reps)), "min": min(reps), "max": max(reps), "n": len(reps)}
            for point, reps in zip(series.x, series.values, strict=True)
        ],
        "predictions": [p.to_dict() for p in predict(fit, x, list(at))],
        "curve": _curve(fit, x, list(at)),
    }


def _curve(fit: Fit, x: np.ndarray, at: list[tuple[float, ...]], steps: int = 48) -> list[dict[str, Any]]:
    """One parameter: the model and its band on a log-spaced grid from the smallest measured value to the
    largest measured or predicted one, for drawing."""
    if x.shape[1] != 1:
        return []
    low, high = float(x[:, 0].min()), max(float(x[:, 0].max()), *(float(p[0]) for p in at))
    grid = [(float(v),) for v in np.geomspace(low, high, steps)] if high > low else [(low,)]
    return [{k: v for k, v in p.to_dict().items() if k != "beyond"} for p in predict(fit, x, grid)]


def describe_fit(fit: Fit) -> dict[str, Any]:
    """A fit as a plain mapping; a combination (combine.Combined) has no constant or terms of its own but
    its members, each described alike, and the spread of its band beyond the fitted scales."""
    described = {
        "formula": fit.formula(),
        "constant": fit.coefficients[0] if fit.coefficients else None,
        "terms": [
            {"coefficient": c, "term": term_text(term, fit.names)}
            for c, term in zip(fit.coefficients[1:], fit.terms, strict=True)
        ],
        "points": fit.points,
        "observations": fit.observations,
        "smape_percent": fit.smape,
        "cv_smape_percent": fit.cv_smape,
        "residual_sd": None if fit.residual_variance is None else math.sqrt(fit.residual_variance),
        "band_spread": fit.spread,
    }
    if isinstance(fit, Combined):
        described["members"] = [describe_fit(member) for member in fit.members]
    return described
