"""What the adaptive sweep measured, what it cost, and what its models say about the rest.

- measured_node_s: Σ over the rounds' launches, round 0's included, of nodes × launch wall time
  (node-seconds, measured; ddlbench.sampling.costs), and how many rounds after round 0 measured points;
- full_sweep_node_s_estimated: what the sweep's own points would cost, Σ over every point of
  nodes × (o_L + o_P + (warmup + steps) × t̂), o_L and o_P the measured launch and per-point overheads and
  t̂ the step-time model's prediction at that point (an estimate, labelled so;
  benchmarks/sampling_accuracy.py measures it);
- saved = 1 − measured / full (share), and the budget: what it was, and whether the measured spend
  stayed within it (later rounds are priced by prediction; round 0 by a bound, costs.round0_share_bound);
- per series, the model of the figure (formula, LOO SMAPE, points) and its prediction with 95 % interval
  at every configuration of the sweep, measured or not, by ddlbench's default search ("models") and by
  Extra-P's ("models_extrap"), fitted on the same points.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ddlbench.analysis.aggregate import record_row
from ddlbench.analysis.empirical.modelling import model_series
from ddlbench.analysis.empirical.series import series_from_table
from ddlbench.config.adaptive import AdaptiveSettings
from ddlbench.launches import LaunchRecord
from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.sampling.costs import measure_overheads, spent_node_s
from ddlbench.sampling.plan import estimated_full_cost, series_of, stands_for


def summarize(
    points: tuple[Point, ...],
    rounds: list[dict[str, Any]],
    records: list[PointRecord],
    launches: list[LaunchRecord],
    settings: AdaptiveSettings,
) -> dict[str, Any]:
    measured = spent_node_s(launches)
    table = pd.DataFrame([record_row(r) for r in records])
    figures = tuple(dict.fromkeys((settings.figure, "step_time_s")))
    found = series_from_table(table, over=(settings.over,), figures=figures) if records else []
    models: dict[str, list] = {"ddlbench": [], "extrap": []}
    for members in series_of(points, settings.over).values():
        values = sorted({float(getattr(p, settings.over)) for p in members})
        for method, fitted in models.items():
            fitted += [
                model_series(s, method=method, at=[(v,) for v in values])
                for s in found
                if s.figure == settings.figure and stands_for(s, members[0], settings.over) and len(s.x) >= 2
            ]
    overheads = measure_overheads(launches, records)
    full = estimated_full_cost(points, records, overheads, settings)
    # the last budget a round was planned against (budget_share's moves with the full-cost estimate)
    planned = [r["budget_node_s"] for r in rounds if r.get("budget_node_s") is not None]
    budget = planned[-1] if planned else settings.budget_node_s
    bound = rounds[0].get("round0_share_bound") if rounds else None
    return {
        "settings": settings.__dict__,
        "rounds": [
            {k: r[k] for k in ("round", "stop", "why", "spent_node_s")}
            | {"points": len(r["points"]), "launches": len(r.get("launches", []))}
            for r in rounds
        ],
        "rounds_measured_after_round_0": sum(1 for r in rounds[1:] if r["points"]),
        "measured_points": len(records),
        "measured_launches": len(launches),
        "measured_node_s": measured,
        "launch_overhead_s": overheads.launch_s,
        "point_overhead_s": overheads.point_s,
        "round0_share_bound": bound,
        "budget_node_s": budget,
        "within_budget": measured <= budget if budget is not None else None,
        "full_sweep_points": len(points),
        "full_sweep_node_s_estimated": full,
        "saved_estimated": 1 - measured / full if full else None,
        "models": models["ddlbench"],
        "models_extrap": models["extrap"],
    }
