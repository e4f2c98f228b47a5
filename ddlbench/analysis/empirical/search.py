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

import functools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ddlbench.analysis.empirical.regression import (
    Fit,
    design,
    fit_hypothesis,
    lstsq,
    observations_of,
    point_means,
    pseudo_inverse,
    smape,
)
from ddlbench.analysis.empirical.terms import Term, extrap_building_blocks
from ddlbench.errors import DdlbenchError

# a term whose share of y stays below this at every point is noise (Extra-P's phi/epsilon: 0.0005)
MIN_TERM_SHARE = 0.0005


def loo_predictions(rows: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Each point mean predicted by the fit to the other points' means (unweighted), Extra-P's negligible
    constant zeroed in each fold (hypotheses.py, clean_constant_coefficient); `rows` (..., P, q), a design
    matrix or a stack of them (one per hypothesis), all folds solved at once."""
    return _loo_with(rows, pseudo_inverse(rows[..., fold_indices(means.shape[-1]), :]), means)


def _loo_with(rows: np.ndarray, folds_inverse: np.ndarray, means: np.ndarray) -> np.ndarray:
    """loo_predictions, given the pseudo-inverses of the folds' designs (..., P, q, P−1)."""
    others = fold_indices(means.shape[-1])
    coefficients = (folds_inverse @ means[others][..., None])[..., 0]  # (..., P folds, q)
    smallest = means[others].min(axis=-1)
    negligible = MIN_TERM_SHARE * np.where(smallest != 0, np.abs(smallest), 1.0)
    coefficients[..., 0] = np.where(np.abs(coefficients[..., 0]) < negligible, 0.0, coefficients[..., 0])
    return np.sum(rows * coefficients, axis=-1)


@functools.cache
def fold_indices(count: int) -> np.ndarray:
    """Row k: the points a leave-one-out fit keeps when point k is left out (count × count − 1)."""
    found = np.array([[i for i in range(count) if i != k] for k in range(count)], dtype=int).reshape(count, -1)
    found.flags.writeable = False
    return found


def smapes(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """regression.smape of each row of `predicted` (..., P) against `measured` (P) (percent)."""
    denominator = np.abs(measured) + np.abs(predicted)
    share = np.divide(
        2 * np.abs(predicted - measured), denominator, out=np.zeros_like(denominator), where=denominator > 0
    )
    return 100 * share.mean(axis=-1)


def loo_smape(terms: tuple[Term, ...], x: np.ndarray, means: np.ndarray) -> float | None:
    """Leave-one-out SMAPE (percent) of c₀ + Σ c_k·t_k over the point means; None if not finite."""
    predicted = loo_predictions(design(terms, x), np.asarray(means, dtype=float))
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
    if best.rss == 0:
        return best
    logs = bool(np.all(column >= 1))
    blocks = extrap_building_blocks(parameter, logs=logs)
    counts = np.array([len(v) for v in values], dtype=float)
    chosen, score = _best_block(column, logs, means, counts, best.smape)
    if chosen is None:
        return _with_cv(best, None)
    return _with_cv(fit_hypothesis(names, ((blocks[chosen],),), rows, values), score)


def single_fold_predictions(x: np.ndarray, values: list[list[float]]) -> np.ndarray:
    """At each point k, what search_single fitted to every other point (their repetitions) predicts: the
    leave-one-out predictions a combination scores (combine.py), one parameter, without a Fit per fold. The
    same choice as search_single on the same numbers: the constant's fit and score, the blocks' designs
    (one cache) and the winner's weighted fit are computed alike."""
    column = np.asarray(x, dtype=float).reshape(-1)
    others = fold_indices(len(column))
    counts, _, _ = observations_of(values)
    kept_means, kept_counts = point_means(values)[others], counts[others].astype(float)
    root = np.sqrt(kept_counts)
    constants = lstsq(root[..., None], kept_means * root)[..., 0]  # each fold's constant, as fit_hypothesis's
    predicted = constants.copy()
    for k, kept in enumerate(others):
        fitted = np.full(len(kept), constants[k])
        if float(np.sum((kept_means[k] - fitted) ** 2)) == 0:
            continue
        scales = column[kept]
        logs = bool(np.all(scales >= 1))
        chosen, _ = _best_block(scales, logs, kept_means[k], kept_counts[k], smape(fitted, kept_means[k]))
        if chosen is None:
            continue
        _, rows, _ = _single_design(np.ascontiguousarray(scales).tobytes(), logs)
        coefficients = lstsq(rows[chosen] * root[k][:, None], kept_means[k] * root[k])
        block = extrap_building_blocks(0, logs=logs)[chosen]
        predicted[k] = (design(((block,),), column[k : k + 1, None]) @ coefficients)[0]
    return predicted


@functools.lru_cache(maxsize=1024)
def _single_design(column: bytes, logs: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What every series over these scales shares (column: the scales' bytes): Extra-P's building blocks'
    values (blocks × points), their designs c₀ + c₁·b (blocks × points × 2) and the pseudo-inverses of
    every leave-one-out fold's design (blocks × points × 2 × points − 1)."""
    scales = np.frombuffer(column, dtype=float)
    terms = np.array([block.evaluate(scales) for block in extrap_building_blocks(0, logs=logs)])
    rows = np.stack([np.ones_like(terms), terms], axis=-1)
    folds = np.linalg.pinv(rows[:, fold_indices(len(scales)), :])
    for array in (terms, rows, folds):
        array.flags.writeable = False
    return terms, rows, folds


def _best_block(
    column: np.ndarray, logs: bool, means: np.ndarray, counts: np.ndarray, incumbent: float
) -> tuple[int | None, float]:
    """Extra-P's choice among one-term hypotheses c₀ + c₁·b(x) over the scales `column`, every b at once.
    Each is fitted to all points as regression.fit_hypothesis fits (the means weighted by the repetitions),
    dropped unless every coefficient is finite and its term contributes (_contributes), and scored by its
    leave-one-out SMAPE; the first with the lowest score below `incumbent` (the constant's in-sample SMAPE)
    wins. Returns its index among extrap_building_blocks and its score; (None, incumbent) if none beats the
    constant."""
    terms, rows, folds = _single_design(np.ascontiguousarray(column, dtype=float).tobytes(), logs)
    root = np.sqrt(counts)
    coefficients = lstsq(rows * root[:, None], np.broadcast_to(means * root, terms.shape))
    slope = coefficients[:, 1]
    contributes = (
        (slope != 0)
        & np.any(np.abs(slope[:, None] * terms) >= MIN_TERM_SHARE * np.abs(means), axis=1)
        & np.all(np.isfinite(coefficients), axis=1)
    )
    predicted = _loo_with(rows, folds, means)
    scores = np.where(np.all(np.isfinite(predicted), axis=1), smapes(predicted, means), np.inf)
    chosen, best = None, incumbent
    for index in np.flatnonzero(contributes):
        if scores[index] < best:
            chosen, best = int(index), float(scores[index])
    return chosen, best


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
