"""One round of the adaptive sweep: which points to measure next, or why to stop.

The candidates are the sweep's configurations; a *series* is those alike in everything but the
modelled parameter (settings.over). Each sampled point is its configuration run for settings.steps
measured steps after settings.warmup_steps, settings.repetitions times (Extra-Deep's few short steps
instead of full runs), into <sweep>/adaptive/points/<id>/record.json.

A round's short runs are measured in launches of several points each (`launches`: those of one layout
together, settings.per_launch at most; ddlbench.launch.group), so the seconds a launch costs whatever its
steps are paid once per launch, not once per point, and the budget buys later rounds. No launch holds two
repetitions of one configuration (costs.group_launches): the model's bands and the stopping rule count each
repetition as an independent sample, which repetitions of one launch are not.

- Round 0: every series' `initial` values spread evenly over its range, both ends included. Extra-P's
  measurement-point advisor ("base" mode) takes the smallest, the cheapest; but a model of the smallest
  batch sizes extrapolated to 16× them predicted a step time 6× too short (benchmarks/sampling_accuracy.py,
  first run), and the far end costs a short run only a few seconds more. Nothing is measured yet to
  price it, so with budget_share it is bounded instead (costs.round0_share_bound, from the two sweeps'
  shapes alone) and refused when the bound exceeds the share.
- Later rounds: each series' model of settings.figure (ddlbench.analysis.empirical, method "ddlbench")
  over its measured points; for every unmeasured candidate, the 95 % prediction interval's relative
  half-width w = (high − low) / 2 / value (∞ without a band) and its cost c, node-seconds:
  repetitions × nodes × (o_P + (warmup + steps) × t̂), t̂ the step-time model's prediction there (its 95 %
  band's upper end where it has one) and o_P the measured per-point overhead (costs.measure_overheads).
  The `per_round` candidates with the largest w / c among those with w > target_band are chosen, each
  only while the round's predicted cost (a launch's overhead o_L added once per launch) still fits.
- Stop when no candidate is left with w > target_band (every unmeasured value is known to ±target),
  when no candidate's predicted cost fits in what is left of the budget (budget_node_s, or budget_share
  of what the full sweep would cost, estimated_full_cost), or after max_rounds rounds.
Spent is measured: Σ over the rounds' launches, round 0's included, of nodes × launch wall time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from ddlbench.analysis.aggregate import record_row
from ddlbench.analysis.empirical.modelling import figure_kind, search
from ddlbench.analysis.empirical.series import series_from_table
from ddlbench.analysis.keys import point_columns
from ddlbench.config.adaptive import AdaptiveSettings
from ddlbench.errors import ConfigError
from ddlbench.launches import LaunchRecord
from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.sampling.costs import (
    Overheads,
    group_launches,
    launches_needed,
    layout_key,
    measure_overheads,
    round0_share_bound,
    spent_node_s,
)


def series_of(points: tuple[Point, ...], over: str) -> dict[Point, list[Point]]:
    """The sweep's configurations (repetition 0) grouped by everything but `over`, each sorted by it."""
    groups: dict[Point, list[Point]] = {}
    for point in points:
        if point.repetition != 0:
            continue
        groups.setdefault(dataclasses.replace(point, **{over: 1}), []).append(point)
    return {key: sorted(members, key=lambda p: getattr(p, over)) for key, members in groups.items()}


def spread(members: list[Point], count: int) -> list[Point]:
    """`count` of a sorted series, evenly spaced by position, both ends included."""
    if count >= len(members):
        return list(members)
    picks = sorted({round(k * (len(members) - 1) / (count - 1)) for k in range(count)})
    return [members[i] for i in picks]


def sampled(point: Point, settings: AdaptiveSettings) -> list[Point]:
    """The short runs that stand for a configuration."""
    return [
        dataclasses.replace(point, steps=settings.steps, warmup_steps=settings.warmup_steps, repetition=r)
        for r in range(settings.repetitions)
    ]


def plan_round(
    round_number: int,
    points: tuple[Point, ...],
    records: list[PointRecord],
    settings: AdaptiveSettings,
    launches: list[LaunchRecord],
) -> dict[str, Any]:
    """The round's choice (see the module docstring) as a plain mapping; `points` are the sweep's,
    `records` and `launches` what the earlier rounds measured."""
    series = series_of(points, settings.over)
    spent = spent_node_s(launches)
    overheads = measure_overheads(launches, records)
    measured_configs = {_config(r.point) for r in records}
    if round_number == 0:
        chosen = [p for members in series.values() for p in spread(members, settings.initial)]
        runs = _runs(chosen, settings)
        bound = round0_share_bound(points, runs, group_launches(runs, settings.per_launch, 0))
        if settings.budget_share is not None and bound > settings.budget_share:
            raise ConfigError(
                "adaptive.budget_share",
                f"{settings.budget_share:g} is less than what round 0 alone may cost, up to {bound:.3g} of the full "
                "sweep (its launches, points and steps against the full sweep's); lower adaptive.initial, "
                "adaptive.steps or adaptive.repetitions, raise adaptive.per_launch, or give a larger share",
            )
        why = "values spread over every series' range"
        return _round(round_number, chosen, settings, spent, why, [], overheads) | {"round0_share_bound": bound}
    scored = []
    for members in series.values():
        done = [r for r in records if _config(r.point) in {_config(p) for p in members}]
        left = [p for p in members if _config(p) not in measured_configs]
        if not left:
            continue
        scored += _score(members, left, done, settings, overheads)
    budget = math.inf
    if settings.budget_node_s is not None:
        budget = settings.budget_node_s
    if settings.budget_share is not None:
        full = estimated_full_cost(points, records, overheads, settings)
        budget = min(budget, settings.budget_share * full) if full else budget
    open_ = [s for s in scored if s["half_width"] > settings.target_band]
    if not open_:
        why = (
            f"every unmeasured value within ±{100 * settings.target_band:g} %" if scored else "every candidate measured"
        )
        return _round(round_number, [], settings, spent, why, scored, overheads)
    if round_number >= settings.max_rounds:
        return _round(round_number, [], settings, spent, f"{settings.max_rounds} rounds run", scored, overheads)
    # a candidate is taken only while the round's predicted cost still fits in the budget
    best, planned, opened = [], spent, {}
    for candidate in sorted(open_, key=lambda s: -s["score"]):
        point = Point.from_dict(candidate["point"])
        layout = layout_key(point)
        before = opened.get(layout, 0)  # runs of this layout already in the round (costs.group_launches)
        reps, width = settings.repetitions, settings.per_launch
        new_launches = launches_needed(before + reps, reps, width) - launches_needed(before, reps, width)
        launch = point.nodes * overheads.launch_s * new_launches
        if len(best) < settings.per_round and planned + candidate["cost_node_s"] + launch <= budget:
            best.append(candidate)
            planned += candidate["cost_node_s"] + launch
            opened[layout] = opened.get(layout, 0) + settings.repetitions
    if not best:
        why = f"budget: {spent:.1f} node-s spent of {budget:.1f}, and no candidate fits in the rest"
        return _round(round_number, [], settings, spent, why, scored, overheads)
    chosen = [Point.from_dict(s["point"]) for s in best]
    entry = _round(round_number, chosen, settings, spent, "widest band per node-second", scored, overheads)
    return entry | {"budget_node_s": budget, "planned_node_s": planned}


def _runs(chosen: list[Point], settings: AdaptiveSettings) -> list[Point]:
    return [s for p in chosen for s in sampled(p, settings)]


def _round(number, chosen, settings, spent, why, scored, overheads: Overheads) -> dict[str, Any]:
    runs = _runs(chosen, settings)
    return {
        "round": number,
        "stop": not chosen,
        "why": why,
        "spent_node_s": spent,
        "overheads": dataclasses.asdict(overheads),
        "configurations": [p.to_dict() for p in chosen],
        "points": [s.to_dict() for s in runs],
        "launches": group_launches(runs, settings.per_launch, number),
        "candidates": [{k: _finite(v) for k, v in s.items()} for s in scored],
    }


def _finite(value: Any) -> Any:
    """JSON has no infinity: an unknown band width or score is written as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def estimated_full_cost(
    points: tuple[Point, ...], records: list[PointRecord], overheads: Overheads, settings: AdaptiveSettings
) -> float | None:
    """What the sweep's own points would cost, node-seconds: Σ nodes × (o_L + o_P + (warmup + steps) × t̂),
    each point a launch of its own, o_L and o_P the measured overheads and t̂ the step-time model at the
    point (None without one)."""
    if not records:
        return None
    rows = pd.DataFrame([record_row(r) for r in records])
    found = [s for s in series_from_table(rows, over=(settings.over,), figures=("step_time_s",))]
    overhead = overheads.launch_s + overheads.point_s
    total = 0.0
    for members in series_of(points, settings.over).values():
        step = next((s for s in found if stands_for(s, members[0], settings.over)), None)
        if step is None or len(step.x) < 2:
            return None
        fit = search(
            step.parameters, step.array(), step.lists(), "ddlbench", figure_kind("step_time_s", step.parameters)
        )
        mine = [p for p in points if _same_series(p, members[0], settings.over)]
        predicted = fit.predict(np.asarray([[float(getattr(p, settings.over))] for p in mine]))
        total += sum(
            p.nodes * (overhead + (p.warmup_steps + p.steps) * t) for p, t in zip(mine, predicted, strict=True)
        )
    return float(total) if math.isfinite(total) else None


# fields a sampled short run changes: the rest say which sweep configuration it stands for
SAMPLING_FIELDS = ("steps", "warmup_steps", "repetition")


def _same_series(point: Point, member: Point, over: str) -> bool:
    strip = {over: 1, "repetition": 0}
    return dataclasses.replace(point, **strip) == dataclasses.replace(member, **strip)


def stands_for(series, member: Point, over: str) -> bool:
    """Whether a series of sampled records stands for the sweep series of `member`."""
    columns = point_columns(member)
    return all(
        str(series.fixed[name]) == str(columns[name])
        for name in series.fixed
        if name not in (over, *SAMPLING_FIELDS) and name in columns
    )


def _config(point: Point) -> Point:
    return dataclasses.replace(point, steps=0, warmup_steps=0, repetition=0)


def _score(members, left, done, settings: AdaptiveSettings, overheads: Overheads) -> list[dict[str, Any]]:
    rows = pd.DataFrame([record_row(r) for r in done]) if done else pd.DataFrame()
    figures = tuple(dict.fromkeys((settings.figure, "step_time_s")))
    found = {s.figure: s for s in series_from_table(rows, over=(settings.over,), figures=figures)} if done else {}
    x = np.asarray([[float(getattr(p, settings.over))] for p in left])
    band_of = _band(found.get(settings.figure), x)
    # the step time prices a candidate; when it is also the figure modelled, its fit is the one just made
    # a candidate is priced at its step time's upper band where there is one: the budget is not overrun by luck
    steps_band = band_of if settings.figure == "step_time_s" else _band(found.get("step_time_s"), x)
    step_of = [high if high is not None else value for value, _, high in steps_band]
    out = []
    for k, point in enumerate(left):
        value, low, high = band_of[k]
        half = (high - low) / 2 / abs(value) if low is not None and value else math.inf
        step = step_of[k] if step_of[k] is not None and step_of[k] > 0 else 1.0
        cost = (
            point.nodes * (overheads.point_s + (settings.warmup_steps + settings.steps) * step) * settings.repetitions
        )
        out.append(
            {
                "point": point.to_dict(),
                settings.over: getattr(point, settings.over),
                "value": value,
                "low": low,
                "high": high,
                "half_width": half,
                "cost_node_s": cost,
                "score": half / cost if cost > 0 else math.inf,
            }
        )
    return out


def _band(series, x: np.ndarray) -> list[tuple[float | None, float | None, float | None]]:
    if series is None or len(series.x) < 2:
        return [(None, None, None)] * len(x)
    fit = search(
        series.parameters, series.array(), series.lists(), "ddlbench", figure_kind(series.figure, series.parameters)
    )
    centre = fit.predict(x)
    band = fit.band(x)
    return [
        (float(c), None if band is None or not np.isfinite(band[0][k]) else float(band[0][k]),
         None if band is None or not np.isfinite(band[1][k]) else float(band[1][k]))
        for k, c in enumerate(centre)
    ]  # fmt: skip
