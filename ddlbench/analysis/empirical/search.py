"""Which hypothesis: Extra-P's model search, reproduced (method "extrap"), and ddlbench's for extrapolation.

**extrap** (Extra-P 4.2, extrap/modelers/single_parameter/basic.py and abstract_base.py,
multi_parameter/multi_parameter_modeler.py; Calotoiu et al., SC13):
- one parameter: the constant c₀ (the mean of the point means, scored in-sample), then every building block
  b of ddlbench.analysis.empirical.terms.extrap_building_blocks as c₀ + c₁·b(x), scored by leave-one-out
  cross-validation (each point predicted by the fit to the others; SMAPE averaged over the points). A
  hypothesis replaces the incumbent only with a strictly lower SMAPE; it is rejected if a coefficient is 0,
  if its term contributes less than 0.0005 of y at every point, or if its error is not finite. Log terms
  are left out when a parameter value is below 1. The winner is refitted on all points.
- several parameters: each parameter's best single term is found on its lines of points (the others
  fixed; the longest lines, averaged value by value); parameters whose model is constant drop out. One
  left: its term, with its own coefficients or refitted on all points, whichever has the lower SMAPE.
  Two: a·b first, then a+b, a+a·b, b+a·b, each fitted on all points and taken only with a strictly lower
  in-sample SMAPE and every term contributing. Three or more: the full product, then the full sum (Extra-P
  also tries 21 mixes of three parameters, which this leaves out).

Fits are of the point means, as Extra-P's default; every repetition enters the band (regression.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ddlbench.analysis.empirical.regression import Fit, design, fit_hypothesis, smape
from ddlbench.analysis.empirical.terms import Term, extrap_building_blocks
from ddlbench.errors import DdlbenchError

# a term whose share of y stays below this at every point is noise (Extra-P's phi/epsilon: 0.0005)
MIN_TERM_SHARE = 0.0005


def loo_smape(terms: tuple[Term, ...], x: np.ndarray, means: np.ndarray) -> float | None:
    """Leave-one-out SMAPE (percent) of c₀ + Σ c_k·t_k over the point means; None if not finite."""
    rows = design(terms, x)
    predicted = np.empty(len(means))
    for k in range(len(means)):
        keep = np.arange(len(means)) != k
        coefficients, *_ = np.linalg.lstsq(rows[keep], means[keep], rcond=None)
        smallest = float(np.min(means[keep]))
        # Extra-P zeroes a negligible constant in each fold (hypotheses.py, clean_constant_coefficient)
        if abs(coefficients[0]) < MIN_TERM_SHARE * (abs(smallest) if smallest != 0 else 1.0):
            coefficients[0] = 0.0
        predicted[k] = rows[k] @ coefficients
    if not np.all(np.isfinite(predicted)):
        return None
    return smape(predicted, means)


def _contributes(fit: Fit, x: np.ndarray, means: np.ndarray) -> bool:
    rows = design(fit.terms, x)
    for column, c in enumerate(fit.coefficients[1:], start=1):
        if c == 0 or not np.any(np.abs(c * rows[:, column]) >= MIN_TERM_SHARE * np.abs(means)):
            return False
    return all(math.isfinite(c) for c in fit.coefficients)


def search_single(name: str, x: Sequence[float], values: list[list[float]], *, parameter: int = 0, names=None) -> Fit:
    """Extra-P's single-parameter search over one parameter's points (see the module docstring)."""
    names = names or (name,)
    column = np.asarray(x, dtype=float).reshape(-1)
    rows = np.zeros((len(column), len(names)))
    rows[:, parameter] = column
    means = np.array([float(np.mean(v)) for v in values])
    best = fit_hypothesis(names, (), rows, values)  # the constant, scored in-sample
    best_score = best.smape
    if best.rss == 0:
        return best
    logs = bool(np.all(column >= 1))
    for block in extrap_building_blocks(parameter, logs=logs):
        terms = ((block,),)
        full = fit_hypothesis(names, terms, rows, values)
        if not _contributes(full, rows, means):
            continue
        score = loo_smape(terms, rows, means)
        if score is None or not score < best_score:
            continue
        best, best_score = full, score
    return _with_cv(best, best_score if best.terms else None)


def search_extrap(names: tuple[str, ...], x: np.ndarray, values: list[list[float]]) -> Fit:
    """Extra-P's search, one parameter or several (see the module docstring)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    if x.shape[1] != len(names):
        raise DdlbenchError(f"{x.shape[1]} parameter columns but {len(names)} names")
    if len(values) < 2:
        raise DdlbenchError(f"a model needs at least 2 points, got {len(values)}")
    if len(names) == 1:
        return search_single(names[0], x[:, 0], values, names=names)
    means = np.array([float(np.mean(v)) for v in values])
    singles: list[Fit] = []
    for parameter in range(len(names)):
        line_x, line_y = _lines(x, means, parameter)
        fit = search_single(names[parameter], line_x, [[v] for v in line_y], parameter=parameter, names=names)
        if fit.terms:
            singles.append(fit)
    if not singles:
        return fit_hypothesis(names, (), x, values)
    factors = [fit.terms[0][0] for fit in singles]
    if len(factors) == 1:
        refit = fit_hypothesis(names, singles[0].terms, x, values)
        reused = _on(singles[0], x, values)
        return _with_cv(min((reused, refit), key=lambda fit: fit.smape), None)
    if len(factors) == 2:
        a, b = factors
        candidates = [((a, b),), ((a,), (b,)), ((a,), (a, b)), ((b,), (a, b))]
    else:
        candidates = [(tuple(factors),), tuple((f,) for f in factors)]
    best = fit_hypothesis(names, candidates[0], x, values)  # the product, kept without the contribution test
    for terms in candidates[1:]:
        fit = fit_hypothesis(names, terms, x, values)
        if _contributes(fit, x, means) and fit.smape < best.smape:
            best = fit
    return _with_cv(best, None)


def _lines(x: np.ndarray, means: np.ndarray, parameter: int) -> tuple[np.ndarray, list[float]]:
    """Extra-P's point selection for one parameter ('auto', as 'all'): the longest lines of points along it
    (the other parameters fixed), averaged value by value."""
    others = [c for c in range(x.shape[1]) if c != parameter]
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, row in enumerate(x):
        groups.setdefault(tuple(row[others]), []).append(i)
    longest = max(len(members) for members in groups.values())
    by_value: dict[float, list[float]] = {}
    for members in groups.values():
        if len(members) == longest:
            for i in members:
                by_value.setdefault(float(x[i, parameter]), []).append(float(means[i]))
    ordered = sorted(by_value)
    return np.array(ordered), [float(np.mean(by_value[v])) for v in ordered]


def _on(single: Fit, x: np.ndarray, values: list[list[float]]) -> Fit:
    """A single-parameter model's own coefficients, scored on all points."""
    means = np.array([float(np.mean(v)) for v in values])
    predicted = design(single.terms, x) @ np.asarray(single.coefficients)
    refit = fit_hypothesis(single.names, single.terms, x, values)
    return replace(
        refit,
        coefficients=single.coefficients,
        rss=float(np.sum((means - predicted) ** 2)),
        smape=smape(predicted, means),
    )


def _with_cv(fit: Fit, cv: float | None) -> Fit:
    return replace(fit, cv_smape=cv)
