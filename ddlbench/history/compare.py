"""Two runs side by side, figure by figure: the change, and whether it is beyond the noise.

For each figure both runs hold (same name, same node): change = (B − A) ÷ A, a fraction; `overlap`
whether their 95 % intervals overlap (None when either has none). The verdict says which way it went for
the figure's direction (lower is better for times, unit `s`; higher for every other figure: rates,
bandwidths, FLOP/s, efficiencies):

- `better` / `worse`: the intervals do not overlap, or (without intervals) |change| > NO_INTERVAL_CHANGE;
- `same within noise`: they overlap (or, without intervals, the change is within NO_INTERVAL_CHANGE);
- `only in A` / `only in B`, or `not measured` where a run holds the figure without a value.

Disjoint 95 % intervals are a conservative test of a difference (Hoefler & Belli, rule 7: non-overlap
implies a difference at well beyond 95 %; overlap does not prove sameness).
"""

from __future__ import annotations

from typing import Any

from ddlbench.history.db import Run

NO_INTERVAL_CHANGE = 0.10  # without intervals, a change beyond ±10 % counts as one


def higher_is_better(unit: str) -> bool:
    return unit != "s"


def compare_runs(a: Run, b: Run) -> list[dict[str, Any]]:
    """One row per figure of either run, in A's order then B's new ones."""
    first = {(figure["name"], figure["node"]): figure for figure in a.figures}
    second = {(figure["name"], figure["node"]): figure for figure in b.figures}
    keys = list(first) + [key for key in second if key not in first]
    return [compare_figures(first.get(key), second.get(key), key=key) for key in keys]


def compare_figures(
    a: dict[str, Any] | None, b: dict[str, Any] | None, *, key: tuple[str, str | None]
) -> dict[str, Any]:
    row: dict[str, Any] = {"name": key[0], "node": key[1], "a": a, "b": b, "change": None, "overlap": None}
    if a is None or b is None:
        return row | {"verdict": "only in B" if a is None else "only in A"}
    row["unit"] = b["unit"]
    if a["value"] is None or b["value"] is None:
        return row | {"verdict": "not measured"}
    if a["value"]:
        row["change"] = (b["value"] - a["value"]) / abs(a["value"])
    intervals = None not in (a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"])
    if intervals:
        row["overlap"] = a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]
        moved = not row["overlap"]
    else:
        moved = row["change"] is not None and abs(row["change"]) > NO_INTERVAL_CHANGE
    if not moved:
        return row | {"verdict": "same within noise"}
    up = b["value"] > a["value"]
    return row | {"verdict": "better" if up == higher_is_better(b["unit"]) else "worse"}


def regressions(previous: Run, figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures of a new certificate that got worse than in `previous` (a passing certificate of the
    same partition), by compare_figures' rule, whatever their reference band says."""
    before = {(figure["name"], figure["node"]): figure for figure in previous.figures}
    found = []
    for figure in figures:
        key = (figure["name"], figure["node"])
        if key not in before:
            continue
        row = compare_figures(before[key], figure, key=key)
        if row["verdict"] == "worse":
            found.append(
                {
                    "name": figure["name"],
                    "node": figure["node"],
                    "unit": figure["unit"],
                    "value": figure["value"],
                    "previous_value": before[key]["value"],
                    "change": row["change"],
                    "overlap": row["overlap"],
                    "previous_run": previous.id,
                    "previous_date": previous.date,
                }
            )
    return found
