"""Change points over a history: for each figure of a sequence of runs (a partition's certificates, a sweep's
stored aggregates), the runs since which it changed, each with a p-value and a size.

Regressions judged run against run (`compare`, certify's check against the last pass) see a step only while
it is fresh, and see drift not at all. Change-point detection asks the whole series where its distribution
changed, as Apache Otava (formerly Hunter, MongoDB's method) does for performance histories, with E-divisive
(Matteson & James, "A nonparametric approach for multiple change point analysis of multivariate data", JASA
2014). Here, per figure, on its values in run order (log values: a change is a ratio):

- the split: for each candidate τ (MIN_SEGMENT ≤ τ ≤ n − MIN_SEGMENT), the energy statistic
  Q(τ) = τ(n − τ)/n · [2/(τ(n−τ)) Σ|xᵢ − yⱼ| − 1/C(τ,2) Σ|xᵢ − xₖ| − 1/C(n−τ,2) Σ|yⱼ − yₗ|] (α = 1), x the
  values before τ and y those from τ on; the best split is the τ with the largest Q;
- its p-value: a permutation test of "no change", the share of PERMUTATIONS random orders of the same values
  whose largest Q is at least the observed one ((1 + hits) ÷ (1 + PERMUTATIONS), never 0), from a generator
  seeded by the series, so the same history always gives the same answer;
- binary segmentation: a split with p < MAX_PVALUE is a change point, and each side is searched again, until
  no side has a significant split or is too short (fewer than 2·MIN_SEGMENT runs);
- its size: the median after ÷ the median before, less 1 (medians of the two segments it separates).

MAX_PVALUE is 0.01, not Otava's 0.001: a permutation test of a history of 10 to 20 runs cannot go much
below 1/C(n, n/2) (0.004 at 10 runs), and a partition's history is that short for its first months. At 0.01
about one figure in a hundred flags a change that is not there; each change point carries its p so a reader
can ask for less.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlbench.history.figures import CHECK_KINDS

MIN_SEGMENT = 3  # runs on each side of a change point: fewer say nothing about a distribution
PERMUTATIONS = 999
MAX_PVALUE = 0.01


@dataclass(frozen=True, kw_only=True)
class ChangePoint:
    """One change of one series: the index of the first value after it, with its p-value and size."""

    index: int  # the first value of the new segment
    p_value: float
    size: float  # median after ÷ median before − 1 (of the segments it separates)
    before: float  # median of the segment before
    after: float  # median of the segment after


def change_points(
    values: Sequence[float], *, max_pvalue: float = MAX_PVALUE, permutations: int = PERMUTATIONS
) -> list[ChangePoint]:
    """The change points of a series of positive values in time order (module docstring), by index."""
    if len(values) < 2 * MIN_SEGMENT or any(not (v > 0 and math.isfinite(v)) for v in values):
        return []
    logs = [math.log(v) for v in values]
    seed = int.from_bytes(hashlib.sha256(repr([round(v, 12) for v in logs]).encode()).digest()[:8], "big")
    rng = random.Random(seed)
    found: list[tuple[int, float]] = []
    pending = [(0, len(logs))]
    while pending:
        start, stop = pending.pop()
        if stop - start < 2 * MIN_SEGMENT:
            continue
        segment = logs[start:stop]
        split, statistic = _best_split(segment)
        p_value = _permutation_p(segment, statistic, rng, permutations, max_pvalue)
        if p_value < max_pvalue:
            found.append((start + split, p_value))
            pending += [(start, start + split), (start + split, stop)]
    found.sort()
    cuts = [0, *(index for index, _ in found), len(values)]
    points = []
    for position, (index, p_value) in enumerate(found):
        before = statistics.median(values[cuts[position] : index])
        after = statistics.median(values[index : cuts[position + 2]])
        points.append(ChangePoint(index=index, p_value=p_value, size=after / before - 1, before=before, after=after))
    return points


def _best_split(series: Sequence[float]) -> tuple[int, float]:
    """(τ, Q(τ)) with the largest energy statistic over the allowed splits: every τ at once, from the 2-D
    cumulative sums of the distance matrix (O(n²) a series, so a thousand permutations stay cheap)."""
    x = np.asarray(series, dtype=float)
    n = len(x)
    cumulative = np.abs(x[:, None] - x[None, :]).cumsum(axis=0).cumsum(axis=1)
    tau = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    m = n - tau
    square = cumulative[tau - 1, tau - 1]  # Σ over [0, τ)²: twice the within-x sum
    block = cumulative[tau - 1, n - 1] - square  # Σ over [0, τ) × [τ, n): the between sum
    rest = cumulative[n - 1, n - 1] - 2 * block - square  # Σ over [τ, n)²: twice the within-y sum
    between = 2 * block / (tau * m)
    within_x = square / 2 / (tau * (tau - 1) / 2)
    within_y = rest / 2 / (m * (m - 1) / 2)
    statistic = tau * m / n * (between - within_x - within_y)
    best = int(np.argmax(statistic))
    return int(tau[best]), float(statistic[best])


def _permutation_p(
    segment: list[float], statistic: float, rng: random.Random, permutations: int, max_pvalue: float
) -> float:
    """(1 + hits) ÷ (1 + permutations), hits the random orders whose best Q reaches `statistic`; stops once
    the p-value can no longer fall below max_pvalue (it is then at least that, which is all a caller asks)."""
    enough = math.ceil(max_pvalue * (1 + permutations))  # this many hits already put p at or above max_pvalue
    hits = 0
    for done in range(1, permutations + 1):
        hits += _best_split(rng.sample(segment, len(segment)))[1] >= statistic
        if hits >= enough:
            return (1 + hits + permutations - done) / (1 + permutations)  # an upper bound: the rest all hit
    return (1 + hits) / (1 + permutations)


def history_change_points(runs: Sequence[Any], *, max_pvalue: float = MAX_PVALUE) -> list[dict[str, Any]]:
    """Per figure (name and node) of `runs` (ddlbench.history.db.Run with figures, oldest first), its change
    points: the run since which it changed (id and date), the p-value, the size and the medians either side.
    A figure is followed over the runs that measured it (a run where it has no value is skipped)."""
    series: dict[tuple[str, str | None], list[tuple[Any, float, str]]] = {}
    for run in runs:
        for figure in run.figures:
            if figure.get("value") is None or figure.get("kind") in CHECK_KINDS:
                continue
            key = (figure["name"], figure.get("node"))
            series.setdefault(key, []).append((run, float(figure["value"]), figure.get("unit", "")))
    rows = []
    for (name, node), points in series.items():
        for change in change_points([value for _, value, _ in points], max_pvalue=max_pvalue):
            since = points[change.index][0]
            rows.append(
                {
                    "name": name, "node": node, "unit": points[0][2], "since_run": since.id, "since_date": since.date,
                    "p_value": change.p_value, "size": change.size, "before": change.before, "after": change.after,
                    "runs": len(points),
                }
            )  # fmt: skip
    return sorted(rows, key=lambda row: (row["name"], row["node"] or "", row["since_run"]))


def series_change_points(runs: Sequence[Any], *, db: Any) -> list[dict[str, Any]]:
    """history_change_points over each series of `runs` (ddlbench.history.db.Run, without figures): runs of
    one kind, name, system:partition and measurement version, whose figures mean the same thing; each row
    names its series ("certificate certify_x_y on x:y, measurement 4")."""
    from ddlbench.history.db import load_run

    groups: dict[tuple[Any, ...], list[Any]] = {}
    for run in runs:
        groups.setdefault((run.kind, run.name, run.system, run.partition, run.measurement_version), []).append(run)
    rows = []
    for (kind, name, system, partition, version), members in groups.items():
        if len(members) < 2 * MIN_SEGMENT:
            continue
        label = f"{kind} {name} on {system}:{partition}, measurement {version}"
        loaded = [load_run(run.id, db=db) for run in members]
        rows += [{"series": label, **row} for row in history_change_points(loaded)]
    return rows
