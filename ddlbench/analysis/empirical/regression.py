"""One hypothesis fitted by linear least squares, with the uncertainty of what it predicts.

A hypothesis is c₀ + Σ c_k·t_k(x) over terms t_k (ddlbench.analysis.empirical.terms). The data are points
x (one row of parameter values each) with one or more repetitions y each. Formulas, with X the design
matrix (a column of ones for c₀, then each term's values), n_k the repetitions of point k, N = Σ n_k
observations and q the number of coefficients:

- coefficients: least squares over all N observations, i.e. of the point means weighted by n_k
  (with the same repetitions at every point, as a sweep has, this is Extra-P's fit of the means);
- rss: Σ_k (ȳ_k − f(x_k))², over the point means, as Extra-P reports it (unit: the figure's, squared);
- smape: 100/P · Σ_k 2|f(x_k) − ȳ_k| / (|ȳ_k| + |f(x_k)|) over the P points (percent, in-sample);
- s² = (Σ_k Σ_r (y_kr − f(x_k))²) / (N − q): the residual variance of an observation, so both the
  repetitions' spread and the model's misfit widen it;
- band at x₀ (95 % prediction interval of one new measurement there): f(x₀) ± t_{0.975, N−q} ·
  √(s² + x₀ᵀ·s²(XᵀWX)⁻¹·x₀), W = diag(n_k); None when N ≤ q (nothing is left to estimate s² from).
The band holds *given the hypothesis*. That the form was chosen from the same data is in it only as
far as the search names `alternatives` (hypotheses that predicted the measured points about as well):
the band is then the union of their intervals, wide wherever the forms part ways. Beyond the measured
range a search may also give a `spread` c: at r = x₀/x_max > 1 (the largest ratio over the parameters;
x_max, `reach`, the largest fitted value) the band is widened to at least f(x₀)·(1 + c)^(±log2 r), a
relative error that compounds with each doubling; c is calibrated on held-out public series
(ddlbench.analysis.empirical.selection), where the prediction interval alone held too few.

Two transformations, for figures whose simple form is not additive in y itself (the fit, s² and the band
are then of the transformed figure z; rss and smape stay of y):
- `per_unit` (a parameter's index s): z = y/x_s, y = x_s·g(x), g = c₀ + Σ c_k·t_k; a throughput per device;
- `inverse`: z = u/y, y = u/g(x), with u = x_s under `per_unit`, else 1; e.g. Amdahl's law in throughput
  form, R(p) = p/(a + b·p): the device-seconds per sample, p/R, grow linearly with p. The band of y is
  u/g's band reversed, open above (NaN) where g's lower end is not positive.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ddlbench.analysis.empirical.terms import Term, evaluate_term, term_text
from ddlbench.statistics import student_t_quantile

# pseudo-inverses by their matrix's exact bytes: the searches solve the same designs again and again (every
# series of a sweep over the same scales, every fold of a leave-one-out), and only the right-hand sides change
_PSEUDO_INVERSES: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}
_KEPT_PSEUDO_INVERSES = 4096


def pseudo_inverse(a: np.ndarray) -> np.ndarray:
    """numpy.linalg.pinv of `a` (one matrix or a stack), remembered: the same bytes give the same answer."""
    a = np.ascontiguousarray(a, dtype=float)
    key = (a.shape, a.tobytes())
    found = _PSEUDO_INVERSES.get(key)
    if found is None:
        if len(_PSEUDO_INVERSES) >= _KEPT_PSEUDO_INVERSES:
            _PSEUDO_INVERSES.clear()
        found = _PSEUDO_INVERSES[key] = np.linalg.pinv(a)
        found.flags.writeable = False
    return found


def lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares of every stacked system a (..., n, q)·c = b (..., n) at once (..., q): the
    minimum-norm solution, singular values below max(n, q)·eps of the largest counted as 0, as
    numpy.linalg.lstsq's with rcond=None solves one."""
    return (pseudo_inverse(a) @ np.asarray(b)[..., None])[..., 0]


def design(terms: tuple[Term, ...], x: np.ndarray) -> np.ndarray:
    x = np.atleast_2d(np.asarray(x, dtype=float))
    return np.column_stack([np.ones(x.shape[0]), *(evaluate_term(term, x) for term in terms)])


def smape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Symmetric mean absolute percentage error, 100/P·Σ 2|p − m|/(|m| + |p|) (percent); 0/0 counts 0."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    denominator = np.abs(measured) + np.abs(predicted)
    share = np.divide(
        2 * np.abs(predicted - measured), denominator, out=np.zeros_like(denominator), where=denominator > 0
    )
    return float(100 * share.mean())


@dataclass(frozen=True, kw_only=True)
class Fit:
    """A hypothesis with its coefficients, its errors and what is needed for its band."""

    names: tuple[str, ...]
    terms: tuple[Term, ...]
    coefficients: tuple[float, ...]  # c0 first
    points: int
    observations: int
    rss: float
    smape: float
    cv_smape: float | None = None  # leave-one-out, percent; set by the search
    residual_variance: float | None = None  # s², None when N ≤ q
    unscaled_covariance: tuple[tuple[float, ...], ...] = ()  # (XᵀWX)⁻¹
    per_unit: int | None = None
    inverse: bool = False
    # hypotheses that predicted the measured points about as well (the search says which): the band spans
    # theirs too, so that where the data cannot tell the forms apart, the band says so
    alternatives: tuple[Fit, ...] = ()
    reach: tuple[float, ...] = ()  # the largest fitted value of each parameter
    spread: float = 0.0  # c of the widening beyond `reach` (see the module docstring); 0: none

    def predict(self, x) -> np.ndarray:
        rows = self._rows(x)
        return self._back(design(self.terms, rows) @ np.asarray(self.coefficients), rows)

    def _back(self, g: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return back_transform(g, rows, per_unit=self.per_unit, inverse=self.inverse)

    def band(self, x, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray] | None:
        """Lower and upper ends of the `confidence` prediction interval at each x, widened to the intervals
        of the alternatives; None without s²."""
        own = self._own_band(x, confidence)
        if own is None:
            return None
        low, high = own
        for other in self.alternatives:
            theirs = other._own_band(x, confidence)
            if theirs is not None:
                low, high = union((low, high), theirs)
        return self._widen(x, low, high)

    def _widen(self, x, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The band beyond `reach` widened to the prediction times (1 + spread)^(±log2 r)."""
        if not self.spread or not self.reach:
            return low, high
        rows = self._rows(x)
        reach = np.asarray(self.reach, dtype=float)
        ratio = np.max(np.divide(rows, reach, out=np.ones_like(rows), where=reach > 0), axis=1)
        factor = (1.0 + self.spread) ** np.log2(np.maximum(ratio, 1.0))
        centre = self.predict(rows)
        return union(
            (low, high), (np.fmin(centre / factor, centre * factor), np.fmax(centre / factor, centre * factor))
        )

    def _own_band(self, x, confidence: float) -> tuple[np.ndarray, np.ndarray] | None:
        if self.residual_variance is None:
            return None
        points = self._rows(x)
        rows = design(self.terms, points)
        leverage = np.einsum("ij,jk,ik->i", rows, np.asarray(self.unscaled_covariance), rows)
        half = student_t_quantile(0.5 + confidence / 2, self.observations - len(self.coefficients)) * np.sqrt(
            self.residual_variance * (1 + leverage)
        )
        centre = rows @ np.asarray(self.coefficients)
        if self.inverse:
            return self._back(centre + half, points), self._back(centre - half, points)
        return self._back(centre - half, points), self._back(centre + half, points)

    def formula(self, digits: int = 4) -> str:
        """c₀ + c₁·term₁ + …, as Extra-P prints a function."""
        text = f"{self.coefficients[0]:.{digits}g}"
        for c, term in zip(self.coefficients[1:], self.terms, strict=True):
            text += f" {'-' if c < 0 else '+'} {abs(c):.{digits}g}·{term_text(term, self.names)}"
        unit = "1" if self.per_unit is None else self.names[self.per_unit]
        if self.inverse:
            return f"{unit}/({text})"
        return text if self.per_unit is None else f"{unit}·({text})"

    def _rows(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return x.reshape(-1, len(self.names)) if x.ndim < 2 else x


def back_transform(g: np.ndarray, rows: np.ndarray, *, per_unit: int | None, inverse: bool) -> np.ndarray:
    """The figure y from the fitted g at `rows` (see the module docstring): u·g, or u/g where g > 0 (NaN
    elsewhere) for an inverse fit; u = the `per_unit` parameter's value, else 1."""
    unit = np.ones(rows.shape[0]) if per_unit is None else rows[:, per_unit]
    if not inverse:
        return g * unit
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(g > 0, unit / np.where(g > 0, g, 1.0), np.nan)


def union(first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The smallest band holding both; an end open in either (NaN) stays open."""
    low = np.where(np.isnan(first[0]) | np.isnan(second[0]), np.nan, np.fmin(first[0], second[0]))
    high = np.where(np.isnan(first[1]) | np.isnan(second[1]), np.nan, np.fmax(first[1], second[1]))
    return low, high


def observations_of(values: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The repetitions of each point, flat: their counts (per point), each observation's point, and the
    observations."""
    counts = np.array([len(reps) for reps in values])
    point = np.repeat(np.arange(len(values)), counts)
    observed = np.fromiter(itertools.chain.from_iterable(values), dtype=float, count=int(counts.sum()))
    return counts, point, observed


def point_means(values: list[list[float]]) -> np.ndarray:
    """Each point's mean of its repetitions, summed as fit_hypothesis sums them."""
    counts, point, observed = observations_of(values)
    return np.bincount(point, weights=observed, minlength=len(values)) / counts


def fit_hypothesis(
    names: tuple[str, ...],
    terms: tuple[Term, ...],
    x: np.ndarray,
    values: list[list[float]],
    *,
    per_unit: int | None = None,
    inverse: bool = False,
) -> Fit:
    """Least squares of c₀ + Σ c_k·t_k over every repetition of every point (see the module docstring)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    counts, point, observed = observations_of(values)
    original_means = np.bincount(point, weights=observed, minlength=len(values)) / counts
    units = np.ones(len(values)) if per_unit is None else x[:, per_unit]
    if inverse:
        observed = units[point] / observed
    elif per_unit is not None:
        observed = observed / units[point]
    means = (
        np.bincount(point, weights=observed, minlength=len(values)) / counts
        if inverse or per_unit is not None
        else original_means
    )
    root = np.sqrt(counts)
    rows = design(terms, x)
    weighted = rows * root[:, None]
    coefficients = lstsq(weighted, means * root)
    fitted = rows @ coefficients
    observations = int(counts.sum())
    q = rows.shape[1]
    residual_variance, unscaled = None, ()
    if observations > q:
        squares = float(np.bincount(point, weights=(observed - fitted[point]) ** 2, minlength=len(values)).sum())
        residual_variance = squares / (observations - q)
        unscaled = tuple(map(tuple, pseudo_inverse(weighted.T @ weighted)))
    back = back_transform(fitted, x, per_unit=per_unit, inverse=inverse)
    return Fit(
        names=names,
        terms=terms,
        coefficients=tuple(float(c) for c in coefficients),
        points=len(values),
        observations=observations,
        rss=float(np.sum((original_means - back) ** 2)),
        smape=smape(back, original_means),
        residual_variance=residual_variance,
        unscaled_covariance=unscaled,
        per_unit=per_unit,
        inverse=inverse,
        reach=tuple(float(v) for v in x.max(axis=0)),
    )
