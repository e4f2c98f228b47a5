"""Choosing ddlbench's default search, and its band's spread, out of sample on public scaling series.

The series (benchmarks/empirical/data, `load_collection`) each come from a collection (a publisher's
tables) and are fitted on all their scales but the two largest, which are predicted (holdout.py):
accuracy = 1 − |predicted − measured| / measured at the first held-out scale (2× the largest fitted one in
a doubling series) and the second (4×).

**The rule** (`pick`), given the accuracies of a family's candidates (candidates.py) on some series:
Extra-P's search unless another candidate's mean accuracy over those series is at least Extra-P's at 2×
*and* at 4×, and the series show its gain is not chance: a one-sided paired sign-flip test of its
per-series gain (its accuracy minus Extra-P's, summed over the two held-out scales) has p ≤ ALPHA
(`paired_gain_p`); among those, the highest mean of the two (ties: the earlier in the family). The
default must not fall below Extra-P, so nothing replaces it that did not beat it at both; and a gain of
a few tenths of a percent, which one BLAS's rounding more or less in a hypothesis choice turns around,
does not replace it either (the unknown family's extrap+forward: +0.18 % / +0.37 % over 49 series,
p ≈ 0.3, chosen on one CPU and not on another under the plain rule).

**Leave one collection out** (`select`): for each collection, the rule picks on the series of all other
collections and the pick is scored on the series of the left-out one; the figures of the procedure are
those scores, pooled over every series (mean and median over series, each one vote). The default
(extrapolation.DEFAULT_SEARCH) is the rule applied to every collection: its constants are fixed before
any collection scores them.

**The band's spread** (`calibrate_spread`): a held-out measurement m, predicted p at r times the largest
fitted scale, is inside the widened band when it is inside the fit's own band or when
max(m/p, p/m) ≤ (1 + c)^(log2 r) (regression.Fit.spread); its *need* is the smallest such c (0 inside the
own band, an end open where the band's denominator reaches 0 holding everything beyond it; infinite for a
prediction of another sign or none). The spread is the smallest c that holds
95 % of the needs; left out one collection at a time, it is computed on the others and its coverage
counted on the left-out one.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ddlbench.analysis.empirical.candidates import BASELINE, FAMILIES, LAW_KINDS, candidate
from ddlbench.analysis.empirical.combine import combine
from ddlbench.analysis.empirical.holdout import HeldOut
from ddlbench.analysis.empirical.regression import Fit

COVERAGE = 0.95
ALPHA = 0.05  # the rule's one-sided level for a candidate's gain over Extra-P's search
FLIPS = 1 << 16  # sign-flip draws of `paired_gain_p` beyond EXACT series (a fixed seed: one answer per input)
EXACT = 16  # up to this many series, every one of the 2**n sign patterns is counted
HELD = 2  # scales held out of each series: the first at 2×, the second at 4× in a doubling series


@dataclass(frozen=True, kw_only=True)
class PublicSeries:
    """One published series: its CSV's name, its collection, its kind and its values by scale."""

    name: str
    collection: str
    kind: str
    data: dict[float, list[float]]


def load_collection(folder: Path) -> list[PublicSeries]:
    """The series of `folder`'s sources.yaml, each from its CSV (scale,value rows; repetitions repeated)."""
    out = []
    for entry in yaml.safe_load((folder / "sources.yaml").read_text()):
        data: dict[float, list[float]] = {}
        with (folder / entry["file"]).open() as handle:
            for row in csv.DictReader(handle):
                data.setdefault(float(row["scale"]), []).append(float(row["value"]))
        out.append(
            PublicSeries(
                name=entry["file"].removesuffix(".csv"), collection=entry["collection"], kind=entry["kind"], data=data
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class Scored:
    """A candidate's fit of one series without its largest scales, and what it predicted there."""

    fit: Fit
    held: tuple[HeldOut, ...]

    @property
    def accuracy(self) -> tuple[float, float]:
        return tuple(h.accuracy for h in self.held)  # type: ignore[return-value]

    def need(self, k: int) -> float:
        """The smallest spread whose band holds the k-th held-out measurement (see the module docstring)."""
        held = self.held[k]
        if holds(self.fit, held):
            return 0.0
        if not (held.predicted > 0 and held.measured > 0):
            return math.inf
        ratio = max(held.measured / held.predicted, held.predicted / held.measured)
        return ratio ** (1.0 / math.log2(held.beyond)) - 1.0


def holds(fit: Fit, held: HeldOut) -> bool:
    """Whether the fit's band at the held-out scale holds its measurement (an open end, NaN, holds all)."""
    band = fit.band(np.asarray([[held.scale]]))
    if band is None:
        return False
    low, high = np.nan_to_num(band[0][0], nan=-np.inf), np.nan_to_num(band[1][0], nan=np.inf)
    return bool(low <= held.measured <= high)


def score(series: PublicSeries, names: Sequence[str]) -> dict[str, Scored]:
    """Every candidate of `names` fitted to the series without its `HELD` largest scales; a mean of two
    candidates is made from their fits (combine.py), so each search runs once."""
    scales = sorted(series.data)
    fitted, kept = scales[:-HELD], scales[-HELD:]
    x = np.asarray([[s] for s in fitted])
    values = [series.data[s] for s in fitted]
    fits: dict[str, Fit] = {}
    if series.kind not in LAW_KINDS:  # no law to fit: only the other candidates score it
        names = [n for n in names if "law" not in n.split("+")]
    for name in sorted(names, key=lambda n: "+" in n):
        if "+" in name:
            fits[name] = combine([fits[part] for part in name.split("+")], x, values)
        else:
            fits[name] = candidate(name, series.kind)(("p",), x, values)
    at = np.asarray([[s] for s in kept])
    out = {}
    for name, fit in fits.items():
        predicted = fit.predict(at)
        held = tuple(
            HeldOut(scale=s, beyond=s / fitted[-1], predicted=float(p), measured=float(np.mean(series.data[s])))
            for s, p in zip(kept, predicted, strict=True)
        )
        out[name] = Scored(fit=fit, held=held)
    return out


def means(accuracies: Sequence[tuple[float, float]]) -> tuple[float, float]:
    return tuple(statistics.fmean(a[k] for a in accuracies) for k in range(HELD))  # type: ignore[return-value]


def medians(accuracies: Sequence[tuple[float, float]]) -> tuple[float, float]:
    return tuple(statistics.median(a[k] for a in accuracies) for k in range(HELD))  # type: ignore[return-value]


def paired_gain_p(gains: Sequence[float]) -> float:
    """One-sided p of a paired sign-flip test that the mean of `gains` (one per series) exceeds 0: the
    share of sign patterns whose mean is at least the observed one, each series' gain kept or negated with
    equal chance under the null of no difference (every pattern counted up to EXACT series; beyond, FLIPS
    draws of a fixed seed, p = (1 + hits) / (1 + FLIPS)). 1 when there are none or the mean is not above 0."""
    d = np.asarray(gains, dtype=float)
    if d.size == 0 or not d.mean() > 0:
        return 1.0
    observed = d.sum() * (1 - 1e-12)  # a pattern equal to the observed one counts, rounding aside
    if d.size <= EXACT:
        patterns = ((np.arange(1 << d.size)[:, None] >> np.arange(d.size)) & 1) * 2 - 1
        return float(np.mean(patterns @ d >= observed))
    signs = np.random.default_rng(0).integers(0, 2, size=(FLIPS, d.size)) * 2 - 1
    return float((1 + np.sum(signs @ d >= observed)) / (1 + FLIPS))


def pick(accuracy: dict[str, list[tuple[float, float]]], names: Sequence[str]) -> str:
    """The rule (see the module docstring) over the series whose accuracies are given, per candidate."""
    baseline = means(accuracy[BASELINE])
    best, best_sum = BASELINE, sum(baseline)
    for name in names:
        mean = means(accuracy[name])
        if not (all(m >= b for m, b in zip(mean, baseline, strict=True)) and sum(mean) > best_sum):
            continue
        gains = [sum(a) - sum(b) for a, b in zip(accuracy[name], accuracy[BASELINE], strict=True)]
        if paired_gain_p(gains) <= ALPHA:
            best, best_sum = name, sum(mean)
    return best


@dataclass(frozen=True, kw_only=True)
class Fold:
    """One collection left out: what the rule picked on the others, and how both scored on it."""

    collection: str
    series: int
    chosen: str
    chosen_accuracy: tuple[float, float]  # means over the left-out collection's series
    baseline_accuracy: tuple[float, float]


@dataclass(frozen=True, kw_only=True)
class Selection:
    """A family's choice: per fold, the pooled out-of-sample accuracies, and the rule on every series."""

    family: str
    series: tuple[str, ...]  # the names of the series it covered, in order
    folds: tuple[Fold, ...]
    out_of_sample: tuple[tuple[float, float], ...]  # per series, the accuracies of its fold's pick
    baseline: tuple[tuple[float, float], ...]  # per series, Extra-P's search (ours)
    default: str  # the rule on every collection
    accuracy: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # per candidate, per series


def select(series: Sequence[PublicSeries], scored: Sequence[dict[str, Scored]], family: str) -> Selection:
    """Leave one collection out (see the module docstring) over a family's candidates, on the series of a
    kind the family is for (a law's family: a throughput or a per-device rate; the others: every series)."""
    names = FAMILIES[family]
    kept = [i for i, s in enumerate(series) if family != "law" or s.kind in LAW_KINDS]
    series, scored = [series[i] for i in kept], [scored[i] for i in kept]
    accuracy = {name: [s[name].accuracy for s in scored] for name in names}
    folds, out = [], [None] * len(series)
    for collection in sorted({s.collection for s in series}):
        inside = [i for i, s in enumerate(series) if s.collection != collection]
        left = [i for i, s in enumerate(series) if s.collection == collection]
        # nothing to choose on (the family's only collection left out): the baseline
        chosen = pick({n: [accuracy[n][i] for i in inside] for n in names}, names) if inside else BASELINE
        for i in left:
            out[i] = accuracy[chosen][i]
        folds.append(
            Fold(
                collection=collection,
                series=len(left),
                chosen=chosen,
                chosen_accuracy=means([accuracy[chosen][i] for i in left]),
                baseline_accuracy=means([accuracy[BASELINE][i] for i in left]),
            )
        )
    return Selection(
        family=family,
        series=tuple(s.name for s in series),
        folds=tuple(folds),
        out_of_sample=tuple(out),  # type: ignore[arg-type]
        baseline=tuple(accuracy[BASELINE]),
        default=pick(accuracy, names),
        accuracy=accuracy,
    )


def calibrate_spread(needs: Sequence[float], coverage: float = COVERAGE) -> float:
    """The smallest spread holding `coverage` of the needs (rounded up to 3 decimals, so that it still does);
    0 when there are none."""
    ordered = sorted(needs)
    if not ordered:
        return 0.0
    value = ordered[max(0, math.ceil(coverage * len(ordered)) - 1)]
    return math.ceil(value * 1000) / 1000 if math.isfinite(value) else math.inf


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A default's band: its held-out coverage with no spread, the spread, and its coverage out of sample."""

    held_out: int
    open_ended: int  # bands open at one end (Amdahl's where its denominator's band reaches 0): they hold
    inside_unwidened: int
    spread: float  # calibrated on every collection
    inside_widened: int  # with that spread (in sample)
    inside_out_of_sample: int  # each collection with the spread of the others
    fold_spreads: dict[str, float]


def calibrate(series: Sequence[PublicSeries], scored: Sequence[dict[str, Scored]], name: str) -> Calibration:
    """The spread of candidate `name`'s band (see the module docstring), left out one collection at a time."""
    kept = [i for i in range(len(series)) if name in scored[i]]
    needs = [(series[i].collection, scored[i][name].need(k)) for i in kept for k in range(HELD)]
    spread = calibrate_spread([n for _, n in needs])
    folds, inside = {}, 0
    for collection in sorted({c for c, _ in needs}):
        folds[collection] = calibrate_spread([n for c, n in needs if c != collection])
        inside += sum(n <= folds[collection] for c, n in needs if c == collection)
    at = [(scored[i][name].fit, held) for i in kept for held in scored[i][name].held]
    bands = [fit.band(np.asarray([[held.scale]])) for fit, held in at]
    return Calibration(
        held_out=len(needs),
        open_ended=sum(b is not None and bool(np.isnan(b[0][0]) or np.isnan(b[1][0])) for b in bands),
        inside_unwidened=sum(n == 0 for _, n in needs),
        spread=spread,
        inside_widened=sum(n <= spread for _, n in needs),
        inside_out_of_sample=inside,
        fold_spreads=folds,
    )
