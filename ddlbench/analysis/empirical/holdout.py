"""How well a model search extrapolates: fit a series without its largest scales and predict them.

accuracy = 1 − |predicted − measured| / measured (dimensionless; ParaDL's and Extra-Deep's definition),
with `measured` the mean of the held-out scale's repetitions (what Extra-P models). `beyond` is the
held-out scale over the largest fitted one (2 and 4 for a doubling series with two held out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ddlbench.analysis.empirical.regression import Fit


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    scale: float
    beyond: float
    predicted: float
    measured: float

    @property
    def accuracy(self) -> float:
        return 1.0 - abs(self.predicted - self.measured) / abs(self.measured)


def hold_out(
    data: dict[float, list[float]], search: Callable[[np.ndarray, list[list[float]]], Fit], *, held: int = 2
) -> list[HeldOut]:
    """Fit `search` on all scales but the `held` largest, and predict each of those."""
    scales = sorted(data)
    if len(scales) < held + 2:
        raise ValueError(f"{len(scales)} scales: holding {held} out leaves fewer than 2 to fit")
    fitted, kept = scales[:-held], scales[-held:]
    fit = search(np.asarray([[s] for s in fitted]), [data[s] for s in fitted])
    predicted = fit.predict(np.asarray([[s] for s in kept]))
    return [
        HeldOut(scale=s, beyond=s / fitted[-1], predicted=float(p), measured=float(np.mean(data[s])))
        for s, p in zip(kept, predicted, strict=True)
    ]
