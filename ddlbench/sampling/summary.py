"""What the adaptive sweep measured, what it cost, and what its models say about the rest.

- measured_node_s: Σ over the sampled records of nodes × launch wall time (node-seconds, measured);
- full_sweep_node_s_estimated: what the sweep's own points would cost, Σ over every point of
  nodes × (o + (warmup + steps) × t̂), o the sampled points' median launch overhead and t̂ the step-time
  model's prediction at that point (an estimate, labelled so; benchmarks/sampling.py measures it);
- saved = 1 − measured / full (share);
- per series, the model of the figure (formula, LOO SMAPE, points) and its prediction with 95 % interval
  at every configuration of the sweep, measured or not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from ddlbench.analysis.aggregate import record_row
from ddlbench.analysis.empirical.modelling import model_series
from ddlbench.analysis.empirical.series import series_from_table
from ddlbench.analysis.keys import point_columns
from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.sampling.plan import launch_overhead, node_seconds, series_of
from ddlbench.sampling.settings import AdaptiveSettings


def summarize(
    points: tuple[Point, ...], rounds: list[dict[str, Any]], records: list[PointRecord], settings: AdaptiveSettings
) -> dict[str, Any]:
    measured = sum(node_seconds(r) for r in records)
    table = pd.DataFrame([record_row(r) for r in records])
    figures = tuple(dict.fromkeys((settings.figure, "step_time_s")))
    found = series_from_table(table, over=(settings.over,), figures=figures) if records else []
    models = []
    overhead = launch_overhead(records)
    full = 0.0
    for members in series_of(points, settings.over).values():
        values = sorted({float(getattr(p, settings.over)) for p in members})
        mine = [s for s in found if _matches(s, members[0], settings.over)]
        step = next((s for s in mine if s.figure == "step_time_s"), None)
        for s in mine:
            if s.figure == settings.figure:
                models.append(model_series(s, at=[(v,) for v in values]))
        predicted_step = {}
        if step is not None:
            model = model_series(step, at=[(v,) for v in values])
            predicted_step = {p["x"][0]: p["value"] for p in model["predictions"]}
        for point in (p for p in points if _same_series(p, members[0], settings.over)):
            t = predicted_step.get(float(getattr(point, settings.over)), float("nan"))
            full += point.nodes * (overhead + (point.warmup_steps + point.steps) * t)
    return {
        "settings": settings.__dict__,
        "rounds": [
            {k: r[k] for k in ("round", "stop", "why", "spent_node_s")} | {"points": len(r["points"])} for r in rounds
        ],
        "measured_points": len(records),
        "measured_node_s": measured,
        "launch_overhead_s": overhead,
        "full_sweep_points": len(points),
        "full_sweep_node_s_estimated": full if np.isfinite(full) else None,
        "saved_estimated": 1 - measured / full if np.isfinite(full) and full > 0 else None,
        "models": models,
    }


# fields a sampled short run changes: the rest say which sweep configuration it stands for
SAMPLING_FIELDS = ("steps", "warmup_steps", "repetition")


def _same_series(point: Point, member: Point, over: str) -> bool:
    strip = {over: 1, "repetition": 0}
    return dataclasses.replace(point, **strip) == dataclasses.replace(member, **strip)


def _matches(series, member: Point, over: str) -> bool:
    """Whether a series of sampled records stands for the sweep series of `member`."""
    columns = point_columns(member)
    return all(
        str(series.fixed[name]) == str(columns[name])
        for name in series.fixed
        if name not in (over, *SAMPLING_FIELDS) and name in columns
    )
