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

from typing import Any

import pandas as pd

from ddlbench.analysis.aggregate import record_row
from ddlbench.analysis.empirical.modelling import model_series
from ddlbench.analysis.empirical.series import series_from_table
from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.sampling.plan import estimated_full_cost, launch_overhead, node_seconds, series_of, stands_for
from ddlbench.sampling.settings import AdaptiveSettings


def summarize(
    points: tuple[Point, ...], rounds: list[dict[str, Any]], records: list[PointRecord], settings: AdaptiveSettings
) -> dict[str, Any]:
    measured = sum(node_seconds(r) for r in records)
    table = pd.DataFrame([record_row(r) for r in records])
    figures = tuple(dict.fromkeys((settings.figure, "step_time_s")))
    found = series_from_table(table, over=(settings.over,), figures=figures) if records else []
    models = []
    for members in series_of(points, settings.over).values():
        values = sorted({float(getattr(p, settings.over)) for p in members})
        models += [
            model_series(s, at=[(v,) for v in values])
            for s in found
            if s.figure == settings.figure and stands_for(s, members[0], settings.over)
        ]
    overhead = launch_overhead(records)
    full = estimated_full_cost(points, records, settings)
    return {
        "settings": settings.__dict__,
        "rounds": [
            {k: r[k] for k in ("round", "stop", "why", "spent_node_s")} | {"points": len(r["points"])} for r in rounds
        ],
        "measured_points": len(records),
        "measured_node_s": measured,
        "launch_overhead_s": overhead,
        "full_sweep_points": len(points),
        "full_sweep_node_s_estimated": full,
        "saved_estimated": 1 - measured / full if full else None,
        "models": models,
    }
