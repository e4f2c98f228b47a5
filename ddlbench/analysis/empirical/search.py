"""Which hypothesis: Extra-P's model search, reproduced (method "extrap"), and ddlbench's for extrapolation.

**extrap** (Extra-P 4.2, extrap/modelers/single_parameter/basic.py and abstract_base.py,
multi_parameter/multi_parameter_modeler.py; Calotoiu et al., SC13):
- one parameter: the constant c₀ (the mean of the point means, scored in-sample), then every building block
  b of ddlbench.analysis.empirical.terms.extrap_building_blocks as c₀ + c₁·b(x), scored by leave-one-out
  cross-validation (each point predicted by the fit to the others; SMAPE averaged over the points). A
  hypothesis replaces the incumbent only with a strictly lower SMAPE; it is rejected if a coefficient is 0,
  if its term contributes less than 0.0005 of y at every point, or if its error is not finite. Log terms
  are left out when a parameter value is below 1. The winner is refitted on all points.
- several parameters: each parameter's best single term is found on a line of points where the others
  are fixed (the longest such line; ties to the smallest other values); then the combinations of those
  terms (two parameters: a·b, a+b, a·b+a, a·b+b; more: the full sum and the full product) are fitted
  on all points and the lowest in-sample SMAPE wins.

Fits are of the point means, as Extra-P's default; every repetition enters the band (regression.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ddlbench.analysis.empirical.regression import Fit, design, fit_hypothesis, smape
from ddlbench.analysis.empirical.terms import Factor, Term, extrap_building_blocks
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
    singles: list[Factor | None] = []
    for parameter in range(len(names)):
        line = _line(x, parameter)
        fit = search_single(
            names[parameter], x[line, parameter], [values[i] for i in line], parameter=parameter, names=names
        )
        singles.append(fit.terms[0][0] if fit.terms else None)
    factors = [f for f in singles if f is not None]
    if not factors:
        return fit_hypothesis(names, (), x, values)
    candidates: list[tuple[Term, ...]] = [tuple((f,) for f in factors), (tuple(factors),)]
    if len(factors) == 2:
        a, b = factors
        candidates += [((a, b), (a,)), ((a, b), (b,))]
    if len(factors) == 1:
        candidates = [((factors[0],),)]
    means = np.array([float(np.mean(v)) for v in values])
    fits = [fit_hypothesis(names, terms, x, values) for terms in candidates]
    kept = [fit for fit in fits if _contributes(fit, x, means)] or fits
    best = min(kept, key=lambda fit: fit.smape)
    return _with_cv(best, loo_smape(best.terms, x, means) if len(values) > len(best.coefficients) else None)


def _line(x: np.ndarray, parameter: int) -> list[int]:
    """Indices of the longest line of points along `parameter` (the others fixed), smallest others first."""
    others = [c for c in range(x.shape[1]) if c != parameter]
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, row in enumerate(x):
        groups.setdefault(tuple(row[others]), []).append(i)
    key = min(groups, key=lambda k: (-len({x[i, parameter] for i in groups[k]}), k))
    return sorted(groups[key], key=lambda i: x[i, parameter])


def _with_cv(fit: Fit, cv: float | None) -> Fit:
    return replace(fit, cv_smape=cv)
