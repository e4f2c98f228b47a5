"""Latency + size / bandwidth (Hockney's α–β model) fitted to a collective's times over message sizes.

T(n) = α + β·n, n the message's bytes (ddlbench.train.calibration.kernels says which bytes per collective), α in
seconds, β in seconds per byte, bandwidth = 1/β in bytes per second. Times span orders of magnitude
over the sizes, so the fit minimises the squared *relative* residuals Σ((Tᵢ − α − β·nᵢ)/Tᵢ)², a weighted
least squares with weights 1/Tᵢ² (closed form); α and β are kept ≥ 0: a negative one is set to 0 and the
other refitted, and `clamped` names it. A negative slope means time did not grow with size over the sizes
measured (noise larger than the transfer): the fit then resolved no bandwidth, and says so. Its error
is the median and the largest |Tᵢ − T̂(nᵢ)| / Tᵢ over the sizes fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddlbench.statistics import percentile


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    alpha_s: float
    beta_s_per_byte: float
    rel_error_median: float
    rel_error_max: float
    sizes: int  # message sizes the fit rests on
    clamped: str | None = None  # "alpha" or "beta" when the unconstrained fit made it negative and it was set to 0

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else None

    def predict(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes


def fit_alpha_beta(sizes: list[float], times: list[float]) -> AlphaBeta:
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("an α–β fit needs the times of at least 2 message sizes")
    if min(times) <= 0:
        raise ValueError("times must be positive")
    w = [1.0 / t**2 for t in times]
    sw = math.fsum(w)
    swn = math.fsum(wi * n for wi, n in zip(w, sizes, strict=True))
    swnn = math.fsum(wi * n * n for wi, n in zip(w, sizes, strict=True))
    swt = math.fsum(wi * t for wi, t in zip(w, times, strict=True))
    swnt = math.fsum(wi * n * t for wi, n, t in zip(w, sizes, times, strict=True))
    det = sw * swnn - swn * swn
    clamped = None
    if det <= 0:  # one size only, repeated: a constant
        alpha, beta, clamped = swt / sw, 0.0, "beta"
    else:
        alpha, beta = (swt * swnn - swn * swnt) / det, (sw * swnt - swn * swt) / det
        if beta < 0:  # time falls with size: a constant
            alpha, beta, clamped = swt / sw, 0.0, "beta"
        elif alpha < 0:  # through the origin
            alpha, beta, clamped = 0.0, swnt / swnn, "alpha"
    errors = sorted(abs(t - (alpha + beta * n)) / t for n, t in zip(sizes, times, strict=True))
    return AlphaBeta(
        alpha_s=alpha,
        beta_s_per_byte=beta,
        rel_error_median=percentile(errors, 50),
        rel_error_max=errors[-1],
        sizes=len(sizes),
        clamped=clamped,
    )


# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md): busbw = (S / t) × factor, p ranks
def bus_factor(op: str, ranks: int) -> float:
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0  # broadcast; send_recv (one message of S bytes)


def nnls(a, b, *, iterations: int = 1000):
    """min ‖a·x − b‖ subject to x ≥ 0 (Lawson & Hanson 1974, the active-set method), numpy arrays. Solved on
    a's columns and b scaled to unit norm, so the method's tolerances are relative and the solution scales as
    the problem does (b × r gives x × r; a column × r gives its coefficient ÷ r): times measured on a host twice
    as slow fit coefficients exactly twice as large (ddlbench.analysis.machine.host_speed relies on it)."""
    import numpy as np

    columns = np.linalg.norm(a, axis=0)
    columns[columns <= 0] = 1.0
    size = float(np.linalg.norm(b)) or 1.0
    return _nnls(a / columns, b / size, iterations=iterations) * size / columns


def _nnls(a, b, *, iterations: int):
    import numpy as np

    n = a.shape[1]
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    gradient = a.T @ (b - a @ x)
    tolerance = 1e-10 * max(1.0, float(np.abs(gradient).max()))
    for _ in range(iterations):
        if passive.all() or not (gradient[~passive] > tolerance).any():
            break
        passive[int(np.argmax(np.where(passive, -np.inf, gradient)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = float(np.min(x[blocking] / (x[blocking] - z[blocking])))
            x = x + step * (z - x)
            passive &= x > 1e-15
        gradient = a.T @ (b - a @ x)
    return x


def fit_busy(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """A collective's cost per call in busy mode (ddlbench.train.calibration.kernels): t = α + β·S + κ·X over rows
    (S bytes, X the seconds the rank computed before the call, t the call's mean seconds), least squares on
    relative residuals with α, β, κ ≥ 0. κ is the wait per second of compute before the call: a peer
    that computed as long but was slowed or descheduled meanwhile arrives later, more so after longer work."""
    import numpy as np

    sizes, bursts, times = (np.array(column, dtype=float) for column in zip(*rows, strict=True))
    x = np.column_stack([np.ones_like(sizes), sizes, bursts])
    scale = x.max(axis=0)
    scale[scale <= 0] = 1.0
    weights = np.maximum(times, 1e-9)
    coefficients = nnls((x / scale) / weights[:, None], np.ones_like(times)) / scale
    predicted = x @ coefficients
    errors = np.abs(predicted - times) / weights
    return {
        "alpha_s": float(coefficients[0]),
        "beta_s_per_byte": float(coefficients[1]),
        "wait_per_compute_s": float(coefficients[2]),
        "rel_error_median": float(np.median(errors)),
        "rel_error_max": float(errors.max()),
    }
