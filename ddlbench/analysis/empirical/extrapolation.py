"""ddlbench's model search, for predicting beyond the measured scales (method "ddlbench").

Extra-P picks the hypothesis that best predicts each measured point from the others (leave-one-out), a
test of interpolation. Asked for a scale beyond all of them, what matters is how a hypothesis fitted on
the smaller scales predicts the larger ones. Three changes, each for a failure seen on real scaling data
(benchmarks/empirical_accuracy.py says by how much each helps):

1. **Forward validation.** Sorted by the parameter, each hypothesis is fitted on the first k points and
   scored on the points after them (k from max(3, P−3) to P−1), the score the mean relative error
   |ŷ − y|/|y| of those predictions; leave-one-out SMAPE breaks ties and decides with fewer than 4 points.
2. **A wider set.** Extra-P's 42 building blocks, their negative-exponent twins (a strong-scaling time
   falls as 1/p), and the ring's saturating share (p−1)/p (ddlbench.analysis.empirical.terms).
3. **Throughput per device.** A throughput (kind "throughput": samples/s over the devices producing them)
   is modelled as p·u(p), u the per-device rate, constant under perfect scaling and falling as
   communication grows, a form the normal form captures with one term where the throughput's own does not;
   a hypothesis whose per-device rate turns negative, or grows beyond the best measured one by more than
   the measurements' own spread, by 4× the largest scale is not physical and is dropped.

Several parameters: Extra-P's multi-parameter search (ddlbench.analysis.empirical.search).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ddlbench.analysis.empirical.regression import Fit, design, fit_hypothesis
from ddlbench.analysis.empirical.search import loo_smape, search_extrap
from ddlbench.analysis.empirical.terms import Factor, Term, extrap_building_blocks

KINDS = ("auto", "throughput", "time", "other")
HORIZON = 4.0  # the physical checks look this far beyond the largest measured scale


def building_blocks(parameter: int, *, logs: bool) -> list[Factor]:
    return [
        *extrap_building_blocks(parameter, logs=logs, negative=True),
        Factor(parameter, saturating=True),
    ]


def forward_error(
    terms: tuple[Term, ...], x: np.ndarray, means: np.ndarray, *, per_unit: int | None = None
) -> float | None:
    """Mean relative error of predicting each later point from the earlier ones (see the docstring)."""
    order = np.argsort(x[:, 0], kind="stable")
    x, means = x[order], means[order]
    target = means / x[:, per_unit] if per_unit is not None else means
    unit = x[:, per_unit] if per_unit is not None else np.ones(len(means))
    rows = design(terms, x)
    count = len(means)
    errors = []
    for k in range(max(3, count - 3), count):
        if k <= rows.shape[1] - 1:
            continue
        coefficients, *_ = np.linalg.lstsq(rows[:k], target[:k], rcond=None)
        predicted = rows[k:] @ coefficients * unit[k:]
        errors.extend(np.abs(predicted - means[k:]) / np.abs(means[k:]))
    if not errors or not np.all(np.isfinite(errors)):
        return None
    return float(np.mean(errors))


def search_ddlbench(names: tuple[str, ...], x: np.ndarray, values: list[list[float]], *, kind: str = "auto") -> Fit:
    x = np.atleast_2d(np.asarray(x, dtype=float))
    if len(names) > 1:
        return search_extrap(names, x, values)
    per_unit = 0 if kind == "throughput" else None
    means = np.array([float(np.mean(v)) for v in values])
    logs = bool(np.all(x[:, 0] >= 1))
    candidates: list[tuple[Term, ...]] = [(), *(((block,),) for block in building_blocks(0, logs=logs))]
    scored = []
    for terms in candidates:
        if len(values) <= len(terms) + 1 and terms:
            continue
        fit = fit_hypothesis(names, terms, x, values, per_unit=per_unit)
        if not all(np.isfinite(fit.coefficients)) or (terms and fit.coefficients[-1] == 0):
            continue
        if not _physical(fit, x, values, kind):
            continue
        forward = forward_error(terms, x, means, per_unit=per_unit) if len(values) >= 4 else None
        target = means / x[:, 0] if per_unit is not None else means
        loo = loo_smape(terms, x, target) if len(values) > len(terms) + 1 else None
        scored.append((forward if forward is not None else float("inf"), loo if loo is not None else float("inf"), fit))
    if not scored:
        return search_extrap(names, x, values)
    forward, loo, best = min(scored, key=lambda item: (item[0], item[1]))
    return replace(best, cv_smape=loo if np.isfinite(loo) else None)


def _physical(fit: Fit, x: np.ndarray, values: list[list[float]], kind: str) -> bool:
    if kind not in ("throughput", "time"):
        return True
    ahead = np.linspace(x[:, 0].min(), HORIZON * x[:, 0].max(), 64)
    predicted = fit.predict(ahead[:, None])
    if np.any(predicted <= 0):
        return False
    if kind == "throughput":
        per_device = [max(reps) / row[0] for reps, row in zip(values, x, strict=True)]
        return bool(np.all(predicted / ahead <= 1.05 * max(per_device)))
    return True
