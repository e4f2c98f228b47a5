"""Summary statistics of a sample, after Hoefler & Belli, "Scientific Benchmarking of Parallel
Computing Systems" (SC15): nonparametric by default, because step times are rarely normal.

Pure Python (no numpy, no torch), so records, aggregation and reports share one definition.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

CONFIDENCE = 0.95
# Hoefler & Belli's reading of "noisy": the 95 % interval of the median is wider than ±5 % of it
NOISE_HALF_WIDTH = 0.05
# below this n the exact binomial sum is cheap; above it the normal approximation is within one rank
_EXACT_LIMIT = 2000


def percentile(ordered: Sequence[float], q: float) -> float:
    """q-th percentile of a sorted sample: value at rank (n-1)·q/100, interpolated (numpy's 'linear')."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (j, k) of the order statistics bounding a `confidence` interval of the median.

    The number of observations below the true median is Binomial(n, 1/2), so
    P(x(j) ≤ median ≤ x(k)) = F(k−1) − F(j−1) with F its cdf; the interval is symmetric (k = n+1−j)
    and j is the largest rank whose coverage is still ≥ `confidence` (Le Boudec, Performance
    Evaluation of Computer and Communication Systems, 2010, §2.2.1). None when even [x(1), x(n)]
    covers less, which is n ≤ 5 at 95 %.
    """
    if n < 1:
        return None
    if n > _EXACT_LIMIT:  # normal approximation of the binomial (Le Boudec's large-n formula)
        z = _z(confidence)
        j = max(1, math.floor((n - z * math.sqrt(n)) / 2))
        return j, n + 1 - j
    total = 2**n
    cumulative = [0] * (n + 1)  # cumulative[i] = 2^n · F(i)
    running = 0
    for i in range(n + 1):
        running += math.comb(n, i)
        cumulative[i] = running
    best = None
    for j in range(1, n // 2 + 1):
        k = n + 1 - j
        covered = cumulative[k - 1] - cumulative[j - 1]
        if covered / total >= confidence:
            best = (j, k)
        else:
            break
    return best


def _z(confidence: float) -> float:
    """Two-sided standard-normal quantile, by bisection on erf (no scipy on a login node)."""
    target = confidence
    low, high = 0.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        if math.erf(mid / math.sqrt(2)) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def median_ci(ordered: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Nonparametric `confidence` interval of the median of a sorted sample; None for n ≤ 5 (at 95 %)."""
    ranks = median_ci_ranks(len(ordered), confidence)
    if ranks is None:
        return None
    j, k = ranks
    return ordered[j - 1], ordered[k - 1]


def quantile_ci_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (j, k) of the order statistics bounding a `confidence` interval of the q-quantile (0 < q < 1).

    The number of observations below the true quantile is B ~ Binomial(n, q), so
    P(x(j) ≤ ξ_q ≤ x(k)) = P(j ≤ B ≤ k − 1) (Le Boudec 2010, §2.2.1, for any quantile). The counts covered grow
    from B's mode, each time by the neighbour with the larger probability, until they cover `confidence`;
    above _EXACT_LIMIT the normal approximation gives j, k. None when [x(1), x(n)] covers less: for the
    5th percentile at 95 %, any n below 59, since 1 − 0.95ⁿ − 0.05ⁿ < 0.95 there.
    """
    if n < 2 or not 0 < q < 1:
        return None
    if n > _EXACT_LIMIT:
        half = _z(confidence) * math.sqrt(n * q * (1 - q))
        j, k = math.floor(n * q - half), math.ceil(n * q + half) + 1
        return (j, k) if j >= 1 and k <= n else None
    log_pmf = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(q) + (n - i) * math.log1p(-q)
        for i in range(n + 1)
    ]
    pmf = [math.exp(value) for value in log_pmf]
    low = high = min(max(math.floor((n + 1) * q), 1), n - 1)  # counts low..high covered; ranks (low, high + 1)
    covered = pmf[low]
    while covered < confidence:
        below = pmf[low - 1] if low > 1 else -1.0
        above = pmf[high + 1] if high < n - 1 else -1.0
        if below < 0 and above < 0:
            return None
        if below >= above:
            low -= 1
            covered += below
        else:
            high += 1
            covered += above
    return low, high + 1


def quantile_ci(ordered: Sequence[float], q: float, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Nonparametric `confidence` interval of the q-quantile of a sorted sample (quantile_ci_ranks), or None."""
    ranks = quantile_ci_ranks(len(ordered), q, confidence)
    if ranks is None:
        return None
    j, k = ranks
    return ordered[j - 1], ordered[k - 1]


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n−1) over the mean; dimensionless. None for n < 2 or a zero mean."""
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    if mean == 0:
        return None
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance) / abs(mean)


def is_noisy(median: float, ci: tuple[float, float] | None) -> bool:
    """True when the interval's half-width, (high − low)/2, exceeds NOISE_HALF_WIDTH of the median, or
    when there are too few samples for an interval at all (nothing then bounds the noise)."""
    if ci is None or median == 0:
        return True
    return (ci[1] - ci[0]) / 2 > NOISE_HALF_WIDTH * abs(median)


@functools.lru_cache(maxsize=4096)  # fits and bands ask for the same few (probability, dof) again and again
def student_t_quantile(probability: float, dof: float) -> float:
    """The `probability` quantile of Student's t with `dof` degrees of freedom (e.g. 0.975 for a two-sided
    95 % interval), by bisection on its cdf written with the regularised incomplete beta function:
    P(|T| > t) = I_{ν/(ν+t²)}(ν/2, 1/2). Pure Python, no scipy on a login node."""
    if not 0 < probability < 1 or dof <= 0:
        raise ValueError(f"need 0 < probability < 1 and dof > 0, not {probability}, {dof}")
    if probability == 0.5:
        return 0.0
    tail = 2 * (1 - probability) if probability > 0.5 else 2 * probability  # two-sided tail mass
    low, high = 0.0, 1.0
    while _beta_regularized(dof / (dof + high * high), dof / 2, 0.5) > tail:
        high *= 2
    while high - low > 1e-13 * high:  # to double precision's last digits, about 45 halvings
        mid = (low + high) / 2
        if _beta_regularized(dof / (dof + mid * mid), dof / 2, 0.5) > tail:
            low = mid
        else:
            high = mid
    value = (low + high) / 2
    return value if probability > 0.5 else -value


def _beta_regularized(x: float, a: float, b: float) -> float:
    """I_x(a, b), by Lentz's continued fraction (Press et al., Numerical Recipes, 3rd ed., §6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point: use the symmetry
        return 1.0 - _beta_regularized(1 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * result / a


def student_t_two_sided_p(t: float, dof: float) -> float:
    """P(|T| ≥ |t|) for Student's t with `dof` degrees of freedom: I_{ν/(ν+t²)}(ν/2, 1/2) (the identity
    student_t_quantile inverts). 1 at t = 0, 0 at an infinite t."""
    if dof <= 0:
        raise ValueError(f"need dof > 0, not {dof}")
    if math.isinf(t):
        return 0.0
    return min(1.0, _beta_regularized(dof / (dof + t * t), dof / 2, 0.5))
