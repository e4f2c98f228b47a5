"""A forecast combination: the mean of several searches' predictions, for where no single search predicted
held-out public series as well (ddlbench.analysis.empirical.selection decides where).

For members f_1 … f_m, each fitted by its own search to the same points:
- prediction at x: the mean of the members' predictions that are finite there (a law beyond its pole,
  Amdahl's with a negative serial part, has none), NaN where none is;
- band: the union of the members' bands (each its prediction interval, with its own alternatives), an end
  open in any member (NaN) open in the union; the mean lies between the members, so inside it. Beyond the
  fitted scales it is widened by the combination's `spread` as any fit's (regression.Fit);
- smape: of the mean over the point means (percent, in-sample); cv_smape: leave-one-out, every member's
  search refitted without each point in turn (percent), when the members' `folds` are given: for each
  member, the predictions at every point k of its search fitted to the others (`fold_predictions` makes
  them from any search; a search may have a faster way to the same numbers, candidates.py says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ddlbench.analysis.empirical.regression import Fit, smape, union

Search = Callable[[np.ndarray, list[list[float]]], Fit]
Folds = Callable[[np.ndarray, list[list[float]]], np.ndarray]  # x, values -> each point's leave-one-out prediction


def mean_of_finite(predictions: np.ndarray) -> np.ndarray:
    """Column-wise mean of the finite entries of a members × points array; NaN where none is finite."""
    finite = np.isfinite(predictions)
    count = finite.sum(axis=0)
    total = np.where(finite, predictions, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


@dataclass(frozen=True, kw_only=True)
class Combined(Fit):
    """The mean of its members (see the module docstring); its own terms and coefficients are empty."""

    members: tuple[Fit, ...] = ()

    def predict(self, x) -> np.ndarray:
        return mean_of_finite(np.vstack([member.predict(x) for member in self.members]))

    def band(self, x, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray] | None:
        bands = [b for b in (member.band(x, confidence) for member in self.members) if b is not None]
        if len(bands) < len(self.members):
            return None  # a member without observations to spare: no band for the mean either
        low, high = bands[0]
        for other in bands[1:]:
            low, high = union((low, high), other)
        return self._widen(x, low, high)

    def formula(self, digits: int = 4) -> str:
        return "mean(" + "; ".join(member.formula(digits) for member in self.members) + ")"


def combine(
    members: Sequence[Fit],
    x: np.ndarray,
    values: list[list[float]],
    *,
    folds: Sequence[Folds] = (),
    spread: float = 0.0,
) -> Combined:
    """The combination of fitted `members` (of the same points x, values); its leave-one-out SMAPE when the
    members' `folds` are given (one per member, in order) and there are 3 points or more."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    means = np.array([float(np.mean(v)) for v in values])
    first = members[0]
    shape = Combined(
        names=first.names,
        terms=(),
        coefficients=(),
        points=first.points,
        observations=first.observations,
        rss=0.0,
        smape=0.0,
        members=tuple(members),
        reach=first.reach,
        spread=spread,
    )
    fitted = shape.predict(x)
    cv = None
    if folds and len(values) > 2:
        predicted = mean_of_finite(np.vstack([member_folds(x, values) for member_folds in folds]))
        cv = smape(np.nan_to_num(predicted, nan=0.0), means)
    return Combined(
        names=first.names,
        terms=(),
        coefficients=(),
        points=first.points,
        observations=first.observations,
        rss=float(np.nansum((means - fitted) ** 2)),
        smape=smape(np.nan_to_num(fitted, nan=0.0), means),
        cv_smape=cv,
        members=tuple(members),
        reach=first.reach,
        spread=spread,
    )


def fold_predictions(search: Search) -> Folds:
    """The leave-one-out predictions of any search: at each point k, `search` fitted to the others."""

    def folds(x: np.ndarray, values: list[list[float]]) -> np.ndarray:
        predicted = np.empty(len(values))
        for k in range(len(values)):
            keep = [i for i in range(len(values)) if i != k]
            predicted[k] = search(x[keep], [values[i] for i in keep]).predict(x[k : k + 1])[0]
        return predicted

    return folds
