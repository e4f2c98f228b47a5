"""A local correction of an operator fit: what the fit missed at the calibration's shapes nearest a call.

An operator kind's fit (ddlbench.analysis.analytic.operators) is one law over every shape the calibration drew, from
3 to 2,048 channels and 1 to 50,000 pixels, weighted by time: its per-FLOP terms are set by the long shapes, and it
misses whole regions of shapes the same way. On one calibration here (2026-12-07) most 3×3 conv2d shapes of 8-16
channels on maps past 30² came out 1.3-1.7× their timings, stride-2 ones 2.3-3.9× forward, while most 40-56-channel
ones on the same maps came out at 0.86-1.1; resnet56 on 3×160² (16, 32 and 64 channels) was then predicted 1.2-1.5×
its measured blocks (docs/analytic.md, "What the fit misses near a shape"). Such misses are smooth in the shape:
neighbouring shapes share them. So each fit carries its residuals at the calibration's shapes,
r_i = log(t_i / t̂_i), and a call's time is the fit's times exp(r̂), with r̂ a kernel-weighted mean of the
residuals of the shapes near it (Nadaraya-Watson's estimator, shrunk towards 0 where no shape is near):

    r̂(x) = Σ_i w_i·r_i / (Σ_i w_i + λ),   w_i = exp(−|x − x_i|² / 2h²)

over x = the logs of (batch × rows, channels in, channels out, pixels in, pixels out, kernel elements): distance
in e-folds of each. h and λ are chosen per kind and direction by leave-one-out over the calibration's own shapes
(each shape's residual from the fit without it, r̂ from the others; CANDIDATES), or no correction where none
lowers that error: a choice made on the calibration alone, never on a model or a measured step. A call far from
every shape (Σ w ≪ λ) keeps the fit's time. Torch-free; numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class OpCall(Protocol):
    """What the correction reads of a call (ddlbench.analysis.analytic.operators.OpCall; not imported: operators
    imports this module)."""

    rows: int
    in_channels: int
    out_channels: int
    in_pixels: int
    out_pixels: int
    kernel_elements: int


# (h, λ) tried for each kind and direction: bandwidths of a third of an e-fold to 1.4 (a shape 2× another in one
# dimension is 0.69 e-folds from it), priors of a quarter of one shape at distance 0 to four
BANDWIDTHS = (0.35, 0.5, 0.7, 1.0, 1.4)
PRIORS = (0.25, 1.0, 4.0)
CANDIDATES = tuple((h, prior) for h in BANDWIDTHS for prior in PRIORS)


def shape_features(call: OpCall, batch: float) -> tuple[float, ...]:
    """Where a call lies among the calibration's shapes: the logs of its rows (batch × a linear's rows), channels
    in and out, pixels in and out per sample, and kernel elements."""
    return (
        math.log(max(batch * call.rows, 1e-9)),
        math.log(max(call.in_channels, 1)),
        math.log(max(call.out_channels, 1)),
        math.log(max(call.in_pixels, 1)),
        math.log(max(call.out_pixels, 1)),
        math.log(max(call.kernel_elements, 1)),
    )


@dataclass(frozen=True, kw_only=True)
class LocalCorrection:
    """The residuals log(t / t̂) of one fit at the calibration's shapes (`features`: shape_features of each) and
    the kernel's bandwidth `h` (e-folds) and prior weight `prior` (λ)."""

    features: tuple[tuple[float, ...], ...]
    residuals: tuple[float, ...]
    h: float
    prior: float
    loo_error_median: float  # |t̂·exp(r̂) − t| / t over the shapes, each left out of the fit and of r̂
    loo_error_mean: float
    _arrays: dict = field(default_factory=dict, compare=False, repr=False)  # numpy arrays and factors, made once

    def log_factor(self, features: Sequence[float]) -> float:
        """r̂ at a call's features."""
        import numpy as np

        if "x" not in self._arrays:
            self._arrays["x"] = np.array(self.features, dtype=float)
            self._arrays["r"] = np.array(self.residuals, dtype=float)
        squared = np.sum((self._arrays["x"] - np.asarray(features, dtype=float)) ** 2, axis=1)
        weights = np.exp(-squared / (2.0 * self.h * self.h))
        return float(weights @ self._arrays["r"] / (float(np.sum(weights)) + self.prior))

    def factor(self, call: OpCall, batch: float) -> float:
        """exp(r̂): what the fit's time at this call is multiplied by (kept per call: a prediction asks again)."""
        known = self._arrays.setdefault("factors", {})
        key = (call, batch)
        if key not in known:
            known[key] = math.exp(self.log_factor(shape_features(call, batch)))
        return known[key]


def fit_correction(features, residuals, loo_residuals) -> LocalCorrection | None:
    """The (h, λ) of CANDIDATES with the least mean |log error| over the shapes, each shape's error its
    leave-one-out residual (`loo_residuals`: log(t / t̂) with the fit made without it) less r̂ from the other
    shapes' in-sample `residuals`; None where none does better than the fit alone."""
    import numpy as np

    x = np.asarray(features, dtype=float)
    r = np.asarray(residuals, dtype=float)
    loo = np.asarray(loo_residuals, dtype=float)
    if len(r) < 4:
        return None
    squared = np.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=2)
    np.fill_diagonal(squared, np.inf)  # a shape's own residual never corrects it
    best, chosen = float(np.mean(np.abs(loo))), None
    for h, prior in CANDIDATES:
        weights = np.exp(-squared / (2.0 * h * h))
        left = loo - weights @ r / (np.sum(weights, axis=1) + prior)
        if (error := float(np.mean(np.abs(left)))) < best:
            best, chosen = error, (h, prior, left)
    if chosen is None:
        return None
    h, prior, left = chosen
    errors = np.abs(np.expm1(left))
    return LocalCorrection(
        features=tuple(tuple(float(v) for v in row) for row in x),
        residuals=tuple(float(v) for v in r),
        h=h,
        prior=prior,
        loo_error_median=float(np.median(errors)),
        loo_error_mean=float(np.mean(errors)),
    )
