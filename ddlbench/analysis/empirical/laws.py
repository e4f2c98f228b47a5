"""The laws ddlbench's default search is made of (extrapolation.py chooses among them by kind, as
selected out of sample; candidates.py names them):

- **Amdahl's law** for a throughput (samples/s, or a speedup, over the devices p that produce it):
  R(p) = p / (a + b·p), fitted as the device-seconds per sample p/R = a + b·p (least squares over every
  repetition; regression.py's `inverse` with `per_unit`); for a rate per device (an efficiency),
  e(p) = 1/(a + b·p). The a is the per-sample work of a device, b·p what grows with the group: a ring
  all-reduce's latency term, 2(p−1)·α (Thakur, Rabenseifner and Gropp, IJHPCA 2005), or any serial part;
  R saturates at 1/b. The serial fraction f = b/(a + b) is Amdahl's: speedup R(p)/R(1) = 1/((1 − f)/p + f).
  A step time under weak scaling, or node-hours per epoch (proportional to p/R), is by the same law
  linear, a + b·p (`LINEAR`).
- **The forward-validated normal form** (`forward_search`): the normal form's hypotheses (Extra-P's 42,
  their negative-exponent twins, the ring's saturating share (p−1)/p), chosen by *forward* validation:
  sorted by the parameter, each hypothesis is fitted on the first k points and scored on those after (k
  from max(3, P−3) to P−1), by the mean relative error; leave-one-out SMAPE breaks ties and decides below
  4 points. A time (kind "time") must stay positive up to 4× the largest scale. The hypotheses that
  validated about as well (within twice the best error, or 1 % of it) widen the band: few points leave
  many forms possible, and they part ways beyond the measured range, which is where an adaptive sweep
  should measure.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np

from ddlbench.analysis.empirical.regression import Fit, back_transform, design, fit_hypothesis, observations_of, smape
from ddlbench.analysis.empirical.search import fold_indices, loo_smape, lstsq, search_extrap
from ddlbench.analysis.empirical.terms import Factor, Term, extrap_building_blocks

HORIZON = 4.0  # a time must stay positive this far beyond the largest measured scale
# a hypothesis is as plausible as the best when its validation error is within twice the best's, or
# within this much (a relative error: 1 %) of it, whichever is larger
PLAUSIBLE_ERROR = 0.01
LINEAR: tuple[Term, ...] = ((Factor(0, Fraction(1)),),)


def building_blocks(parameter: int, *, logs: bool) -> list[Factor]:
    base = extrap_building_blocks(parameter, logs=logs)
    return [*base, *(Factor(parameter, -f.poly, f.log) for f in base if f.poly), Factor(parameter, saturating=True)]


def amdahl(
    names: tuple[str, ...],
    x: np.ndarray,
    values: list[list[float]],
    *,
    per_device: bool = False,
    bounded: bool = False,
) -> Fit:
    """Amdahl's law fitted to a throughput (p/(a + b·p)) or a per-device rate (1/(a + b·p)). `bounded`:
    with its serial part b ≥ 0 (see `bounded_linear`), so that it predicts a finite rate at every p."""
    per_unit = None if per_device else 0
    if bounded:
        fit = bounded_linear(names, x, values, per_unit=per_unit, inverse=True)
    else:
        fit = fit_hypothesis(names, LINEAR, x, values, per_unit=per_unit, inverse=True)
    means = np.array([float(np.mean(v)) for v in values])
    loo = _loo_back(fit, x, means) if len(values) > 2 else None
    return replace(fit, cv_smape=loo)


def bounded_linear(
    names: tuple[str, ...],
    x: np.ndarray,
    values: list[list[float]],
    *,
    per_unit: int | None = None,
    inverse: bool = False,
) -> Fit:
    """a + b·p (of the figure, or of its transform: fit_hypothesis's `per_unit` and `inverse`) fitted by
    least squares under b ≥ 0: Amdahl's serial part is not negative. Measurements that scale better than
    linearly (a cache that the split model fits in, or a noisy first point) give b < 0, and a + b·p then
    crosses 0: a throughput p/(a + b·p) with a pole, a step time that turns negative. The objective is a
    convex quadratic under one linear bound, so where the unconstrained b is negative the bounded optimum
    has b = 0: the constant a (the mean device-seconds per sample, weighted by the repetitions), i.e.
    linear scaling, the most Amdahl's law allows. Its band then rests on N − 1 degrees of freedom."""
    fit = fit_hypothesis(names, LINEAR, x, values, per_unit=per_unit, inverse=inverse)
    if fit.coefficients[1] < 0:
        fit = fit_hypothesis(names, (), x, values, per_unit=per_unit, inverse=inverse)
    return fit


def amdahl_fold_predictions(x: np.ndarray, values: list[list[float]], *, per_device: bool = False) -> np.ndarray:
    """At each point k, what `amdahl` fitted to every other point (their repetitions) predicts, every fold
    solved at once, as fit_hypothesis fits each (the transformed repetitions' means weighted by their
    counts)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    per_unit = None if per_device else 0
    counts, point, observed = observations_of(values)
    units = np.ones(len(values)) if per_unit is None else x[:, per_unit]
    transformed = np.bincount(point, weights=units[point] / observed, minlength=len(values)) / counts
    root = np.sqrt(counts)
    rows = design(LINEAR, x)
    others = fold_indices(len(values))
    coefficients = lstsq(rows[others] * root[others][..., None], transformed[others] * root[others])
    return back_transform(np.sum(rows * coefficients, axis=-1), x, per_unit=per_unit, inverse=True)


def serial_fraction(fit: Fit) -> float | None:
    """Amdahl's serial fraction b/(a + b) of a fit by `amdahl` (0 where `bounded` set b to 0; None for any
    other fit)."""
    if fit.inverse and fit.terms == ():
        return 0.0
    if not fit.inverse or fit.terms != LINEAR:
        return None
    a, b = fit.coefficients
    return b / (a + b) if a + b else None


def _loo_back(fit: Fit, x: np.ndarray, means: np.ndarray) -> float:
    """Leave-one-out SMAPE of a transformed fit, on the figure itself: each point mean predicted by the fit,
    transformed alike, to the other point means (one observation each), every fold solved at once."""
    count = len(means)
    units = np.ones(count) if fit.per_unit is None else x[:, fit.per_unit]
    transformed = units / means if fit.inverse else means / units  # as fit_hypothesis transforms them
    rows = design(fit.terms, x)
    others = fold_indices(count)
    coefficients = lstsq(rows[others], transformed[others])  # one fit per left-out point
    g = np.sum(rows * coefficients, axis=-1)
    predicted = back_transform(g, x, per_unit=fit.per_unit, inverse=fit.inverse)
    return smape(np.nan_to_num(predicted, nan=0.0), means)


def forward_error(terms: tuple[Term, ...], x: np.ndarray, means: np.ndarray) -> float | None:
    """Mean relative error of predicting each later point from the earlier ones (see the module docstring)."""
    order = np.argsort(x[:, 0], kind="stable")
    x, means = x[order], means[order]
    rows = design(terms, x)
    count = len(means)
    errors = []
    for k in range(max(3, count - 3), count):
        if k < rows.shape[1]:
            continue
        coefficients, *_ = np.linalg.lstsq(rows[:k], means[:k], rcond=None)
        errors.extend(np.abs(rows[k:] @ coefficients - means[k:]) / np.abs(means[k:]))
    if not errors or not np.all(np.isfinite(errors)):
        return None
    return float(np.mean(errors))


def forward_search(names: tuple[str, ...], x: np.ndarray, values: list[list[float]], kind: str) -> Fit:
    """The normal form chosen by forward validation, kept positive for a time (see the module docstring)."""
    means = np.array([float(np.mean(v)) for v in values])
    logs = bool(np.all(x[:, 0] >= 1))
    scored = []
    for terms in [(), *(((block,),) for block in building_blocks(0, logs=logs))]:
        if terms and len(values) <= 2:
            continue
        rows = design(terms, x)
        if not np.all(np.isfinite(rows)):
            continue
        fit = fit_hypothesis(names, terms, x, values)
        if not all(np.isfinite(fit.coefficients)) or (terms and fit.coefficients[-1] == 0):
            continue
        if kind == "time":
            ahead = np.linspace(x[:, 0].min(), HORIZON * x[:, 0].max(), 64)
            if np.any(fit.predict(ahead[:, None]) <= 0):
                continue
        forward = forward_error(terms, x, means) if len(values) >= 4 else None
        loo = loo_smape(terms, x, means) if len(values) > len(terms) + 1 else None
        scored.append((float("inf") if forward is None else forward, float("inf") if loo is None else loo, fit))
    if not scored:
        return search_extrap(names, x, values)
    forward, loo, best = min(scored, key=lambda item: (item[0], item[1]))
    # the forms the data cannot tell from the best one widen its band (regression.Fit.alternatives)
    if np.isfinite(forward):
        plausible = [
            fit for f, _, fit in scored if fit is not best and f <= max(2 * forward, forward + PLAUSIBLE_ERROR)
        ]
    else:
        plausible = [
            fit for _, cv, fit in scored if fit is not best and cv <= max(2 * loo, loo + 100 * PLAUSIBLE_ERROR)
        ]
    return replace(best, cv_smape=loo if np.isfinite(loo) else None, alternatives=tuple(plausible))
