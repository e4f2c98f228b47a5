"""ddlbench's model search, for predicting beyond the measured scales (method "ddlbench").

Extra-P picks, among 42 one-term hypotheses, the one that best predicts each measured point from the
others (leave-one-out), a test of interpolation. ddlbench's default was chosen *out of sample*: on public
scaling series of other collections than the one it is scored on (ddlbench.analysis.empirical.selection,
leave one collection out; benchmarks/empirical_accuracy.py prints the procedure, what it chose and its
scores beside Extra-P's). The candidates (candidates.py) are Extra-P's search, the figure's law, the
forward-validated normal form, and the means of Extra-P's prediction with each. What it chose, for a
series over one parameter with 3 points or more:

- **throughput** (samples/s, or a speedup, over the devices p that produce it) and **per_device** (a rate
  per device, an efficiency): Extra-P's search (`DEFAULT_SEARCH`). On 6 collections the rule had taken
  the mean of Extra-P's prediction and Amdahl's law's (R(p) = p / (a + b·p), per device 1/(a + b·p),
  laws.py); on 2 collections it was not chosen on it lost to Extra-P (95.70 / 90.49 % against 96.76 /
  94.62 % at 2× / 4×), and with those 2 added to the development set no candidate's gain passes the
  rule's test any more (docs/empirical.md).
- **other** (nothing known of the figure: `ddlbench fit --x … --y …` without --kind): Extra-P's search
  itself: choosing among the physics-free candidates lost to it out of sample, and on all collections
  none beat it at both 2× and 4×.

Beyond the fitted scales the band is widened by the spread the same held-out series needed for 95 % of
them to fall inside (`BAND_SPREAD`, regression.Fit). With 2 points no search can be scored (the public
fits have 3 to 6), and the former forms stay: Amdahl's law for a throughput or per-device rate, the
constant otherwise. Kinds no public series scores keep their physics:

- **amdahl_time** (a step time under weak scaling, node-hours per epoch: proportional to p/R): by
  Amdahl's law, linear, a + b·p.
- **time**: the normal form chosen by forward validation, kept positive up to 4× the largest scale, the
  hypotheses that validated about as well widening its band (laws.py).

Where Amdahl's law itself is the answer (those 2-point fits, and amdahl_time) its serial part is
bounded, b ≥ 0 (laws.bounded_linear): measurements scaling better than linearly would otherwise give a
throughput with a pole and a step time that turns negative a few doublings out; bounded, they give
linear scaling. As a candidate of the selection it stays unbounded, as it was scored (combine.py drops a
member past its pole).

Several parameters: Extra-P's multi-parameter search (ddlbench.analysis.empirical.search).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ddlbench.analysis.empirical.candidates import candidate, family_of
from ddlbench.analysis.empirical.laws import (
    LINEAR,
    amdahl,
    bounded_linear,
    forward_error,
    forward_search,
    serial_fraction,
)
from ddlbench.analysis.empirical.regression import Fit
from ddlbench.analysis.empirical.search import loo_smape, search_extrap

__all__ = [
    "BAND_SPREAD",
    "DEFAULT_SEARCH",
    "KINDS",
    "LINEAR",
    "amdahl",
    "forward_error",
    "forward_search",
    "search_ddlbench",
    "serial_fraction",
]

KINDS = ("throughput", "per_device", "amdahl_time", "time", "other")
# chosen out of sample on the public collection (benchmarks/empirical/data, 56 series of 8 collections) by
# ddlbench.analysis.empirical.selection; benchmarks/empirical_accuracy.py fails if they drift from its choice
DEFAULT_SEARCH = {"law": "extrap", "unknown": "extrap"}  # by family (candidates.FAMILIES)
BAND_SPREAD = {"law": 0.255, "unknown": 0.255}  # c of regression.Fit.spread, by family


def search_ddlbench(names: tuple[str, ...], x: np.ndarray, values: list[list[float]], *, kind: str = "other") -> Fit:
    """ddlbench's search for a figure of `kind` (see the module docstring)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} unknown; kinds: {', '.join(KINDS)}")
    if len(names) > 1:
        return search_extrap(names, x, values)
    if kind in ("throughput", "per_device", "other") and len(values) >= 3:
        family = family_of(kind)
        fit = candidate(DEFAULT_SEARCH[family], kind)(names, x, values)
        return replace(fit, spread=BAND_SPREAD[family])
    if kind in ("throughput", "per_device") and len(values) >= 2:
        return amdahl(names, x, values, per_device=kind == "per_device", bounded=True)
    if kind == "amdahl_time" and len(values) >= 2:
        fit = bounded_linear(names, x, values)
        means = np.array([float(np.mean(v)) for v in values])
        return replace(fit, cv_smape=loo_smape(fit.terms, x, means) if len(values) > 2 else None)
    return forward_search(names, x, values, kind)
