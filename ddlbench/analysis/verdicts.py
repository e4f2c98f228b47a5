"""Verdicts drawn from launches: is B faster (or slower) than A, beyond what running again would change?

The unit of a verdict is a launch. The steps of one launch share its process placement, its clocks, its
neighbours and its memory layout, so they are not independent samples of the machine: two launches of the
same configuration differ by more than their step intervals say (run to run, ±35 % on the project's 2-core
hosts, a few percent on a quiet GPU node). Every better/worse, faster/slower and regression in ddlbench
therefore compares the per-launch figures of A with those of B (one value per repetition: its window
throughput, its mean step time, …), never the steps inside them.

The test: Welch's t-test on the logarithms of the per-launch values, two-sided, and the 95 % interval of
the ratio of geometric means, exp(d ± t₀.₉₇₅,ν · se), with d = mean(log b) − mean(log a),
se² = s²_a/n_a + s²_b/n_b and ν Welch–Satterthwaite's degrees of freedom. Why this and not another:

- Logarithms, because launch-to-launch variation is multiplicative (a slower clock, a busy neighbour, a
  worse placement scale the whole run), and a ratio is what a user asks for ("1.3× faster").
- Not Mann–Whitney U: with the launches people can afford it cannot reach 5 % at all: its smallest
  two-sided exact p is 2/C(6,3) = 0.10 at 3 + 3 launches and 2/C(8,4) = 0.029 at 4 + 4, before any
  correction for several comparisons. Not a bootstrap: resampling 3 values gives 10 distinct means, an
  interval that covers far less than it claims.
- Student's t with Welch's ν pays for the small n in its tails (t₀.₉₇₅ is 4.30 at ν = 2, 2.78 at ν = 4),
  and does not assume both sides equally noisy.

Several figures compared at once (a certificate's figures, two runs' figures) are one family: their
p-values are corrected by Holm's step-down method (family-wise error rate ≤ ALPHA, valid under any
dependence between the figures), and a difference is called only when its adjusted p < ALPHA.

One question, one family (`judge_cell`): "which candidate of this cell is fastest?" picks its winner from the
data, and testing that winner against the others as if it had been named beforehand calls differences that
are not there (the report's old procedure, on equal strategies: 4.3 % at 3 strategies × 3 launches, 8.7 %
at 5 × 10, 15 % at 10 × 10; benchmarks/verdict_errors.py). The cell's claim "the winner is fastest" is an
intersection-union test whose level pays for the selection: each of the winner's comparisons at α/(k − 1)
two-sided, k the candidates (a false claim needs the winner to beat the true best in its favour, one of k − 1
pairs fixed before the data: ≤ α/2).
Where it does not hold, every pair of the cell is tested, Holm at α/2, for what can still be said ("ahead of
X", with no fastest named). Any false "faster" of the cell has probability ≤ ALPHA, whatever else the sweep
holds. Why not Hsu's multiple comparisons with the best: its critical values assume equal variances and
equal launch counts, which Welch's pairs do not need.

No certainty from nothing: each side's spread of log values is floored at log(1 + CV_FLOOR), the launch-to-
launch variation every machine has (1 %: a quiet GPU node repeats its throughput to about that; the
clock's resolution, ~100 ns over windows of a second or more, is 10⁻⁷ of it), so launches that happen to
agree exactly are not taken as proof.

With fewer than MIN_LAUNCHES launches on either side there is no run-to-run interval and no verdict:
one launch says "one launch: no run-to-run interval"; two say how many are needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ddlbench.statistics import student_t_quantile, student_t_two_sided_p

ALPHA = 0.05  # family-wise error rate of a family of verdicts (Holm)
CV_FLOOR = 0.01  # the smallest launch-to-launch variation taken as known (module docstring)
MIN_LAUNCHES = 3  # per side: below it the sample variance of 2 values is too unsure to carry a verdict
TEST = "Welch's t on log per-launch values, Holm-corrected"
TEST_CELL = (
    "Welch's t on log per-launch values; 'fastest' when the winner beats every other strategy of the cell at "
    "α/(k−1) (k candidates: the winner's selection paid for), else every pair, Holm at α/2; each cell's error "
    "rate ≤ 5 %, whatever else the sweep holds"
)
ONE_LAUNCH = "one launch: no run-to-run interval"


@dataclass(frozen=True, kw_only=True)
class Contrast:
    """B against A, from their per-launch values (e.g. each repetition's window throughput)."""

    n_a: int
    n_b: int
    ratio: float | None  # geometric mean of B ÷ geometric mean of A (dimensionless)
    ci_low: float | None  # 95 % interval of that ratio (not adjusted for multiplicity)
    ci_high: float | None
    p_value: float | None  # two-sided, before the family's correction; None without a test
    dof: float | None  # Welch–Satterthwaite degrees of freedom
    why_no_test: str = ""  # why there is no p-value (too few launches, a value not positive)

    @property
    def tested(self) -> bool:
        return self.p_value is not None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A contrast judged within its family: `direction` is 'higher', 'lower' or None (no verdict)."""

    contrast: Contrast
    p_adjusted: float | None  # Holm-adjusted p-value within the family
    direction: str | None
    text: str  # what a reader sees: 'higher (×1.31 [1.18, 1.45], p=0.004 Holm, 3+3 launches)', …


def too_few(n_a: int, n_b: int) -> str:
    """Why a pair with these launch counts gets no test, or '' when it gets one."""
    fewest = min(n_a, n_b)
    if fewest >= MIN_LAUNCHES:
        return ""
    if fewest == 0:
        return "not measured"
    if fewest == 1:
        return ONE_LAUNCH
    return f"{fewest} launches: too few for a run-to-run test (needs {MIN_LAUNCHES})"


def contrast(a: Sequence[float], b: Sequence[float], *, cv_floor: float = CV_FLOOR) -> Contrast:
    """Welch's t-test on log values of B against A, each side's spread floored (see the module's docstring)."""
    n_a, n_b = len(a), len(b)
    ratio = _geometric_mean(b) / _geometric_mean(a) if _positive(a) and _positive(b) and a and b else None
    why = too_few(n_a, n_b)
    if not why and ratio is None:
        why = "a value is not positive: no ratio"
    if why:
        return Contrast(
            n_a=n_a, n_b=n_b, ratio=ratio, ci_low=None, ci_high=None, p_value=None, dof=None, why_no_test=why
        )
    log_a, log_b = [math.log(v) for v in a], [math.log(v) for v in b]
    difference = math.fsum(log_b) / n_b - math.fsum(log_a) / n_a
    se, dof = _welch(log_a, log_b, cv_floor)
    if se == 0:  # only with cv_floor 0: both sides without spread
        p_value, half = (1.0 if difference == 0 else 0.0), 0.0
    else:
        p_value = student_t_two_sided_p(difference / se, dof)
        half = student_t_quantile(0.975, dof) * se
    return Contrast(
        n_a=n_a,
        n_b=n_b,
        ratio=math.exp(difference),
        ci_low=math.exp(difference - half),
        ci_high=math.exp(difference + half),
        p_value=p_value,
        dof=dof,
    )


def power(
    a: Sequence[float], b: Sequence[float], *, ratio: float, alpha: float = ALPHA, cv_floor: float = CV_FLOOR
) -> float | None:
    """How likely `contrast`'s test, at these launch counts and these sides' spreads, calls a true ratio
    `ratio` (B ÷ A, ≠ 1) different at two-sided level `alpha`: with se and ν as `contrast` computes them from
    the launches (each side's variance of log values, floored) and δ = |log ratio| ÷ se, the power is
    P(T > t₁₋α/₂,ν) for T noncentral t(ν, δ), taken as 1 − F_ν(t₁₋α/₂,ν − δ) (a central t shifted by δ, the
    usual approximation; the far tail, a call the wrong way, neglected). It reads the spreads only, never
    the sides' means: under normal launch-to-launch variation the sample variances are independent of the
    difference of the means, so deciding on it to add launches does not bias that difference. None where
    either side has fewer than MIN_LAUNCHES launches or a value that is not positive."""
    if min(len(a), len(b)) < MIN_LAUNCHES or not (_positive(a) and _positive(b)):
        return None
    if not ratio > 0 or ratio == 1:
        raise ValueError(f"ratio {ratio!r}: the power is to call a ratio other than 1, and a ratio is positive")
    se, dof = _welch([math.log(v) for v in a], [math.log(v) for v in b], cv_floor)
    if se == 0:
        return 1.0
    shortfall = student_t_quantile(1 - alpha / 2, dof) - abs(math.log(ratio)) / se
    beyond = student_t_two_sided_p(abs(shortfall), dof) / 2  # P(T > |shortfall|) for a central t
    return beyond if shortfall > 0 else 1 - beyond


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count in the family):
    sorted ascending, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j))."""
    order = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])  # type: ignore[arg-type, return-value]
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[index]))  # type: ignore[operator]
        adjusted[index] = running
    return adjusted


def judge(contrasts: Sequence[Contrast], *, alpha: float = ALPHA) -> list[Verdict]:
    """The verdicts of one family of contrasts (Holm over those that have a test)."""
    adjusted = holm([c.p_value for c in contrasts])
    verdicts = []
    for item, p in zip(contrasts, adjusted, strict=True):
        if p is None:
            verdicts.append(Verdict(contrast=item, p_adjusted=None, direction=None, text=item.why_no_test))
            continue
        direction = ("higher" if item.ratio > 1 else "lower") if p < alpha and item.ratio != 1 else None  # type: ignore[operator]
        word = direction or "not separable"
        verdicts.append(Verdict(contrast=item, p_adjusted=p, direction=direction, text=f"{word} ({describe(item, p)})"))
    return verdicts


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One cell's question judged as one family (judge_cell): its winner, whether it is fastest, and the winner
    against each candidate of another group."""

    winner: int | None  # index of the candidate with the highest geometric mean over its launches
    fastest: bool  # the winner beats every candidate of another group within the family
    p_claim: float | None  # the claim's p: the largest Holm-adjusted p of the winner's comparisons
    against: dict[int, Verdict]  # candidate index -> the winner against it (candidates of other groups)
    comparisons: int  # tests in the family: the cell's pairs of candidates of different groups, with a test


def judge_cell(launches: Sequence[Sequence[float]], groups: Sequence[str], *, alpha: float = ALPHA) -> Cell:
    """Which candidate is fastest, as one family of error rate ≤ alpha (module docstring), in two halves:

    - the claim: the winner (highest geometric mean) is `fastest` when its Welch test against every candidate
      of another group rejects at two-sided level alpha / (k − 1), k the candidates tested (an
      intersection-union test: a false claim needs the winner to beat the true best in its favour, a pair
      fixed before the data, one of k − 1 at most, each at α/(2(k − 1)) one-sided: ≤ α/2 whatever the
      winner's selection); the claim's p is min(1, (k − 1) · the largest of those p-values);
    - without the claim, what can still be said: every pair of candidates of different groups tested, Holm
      over the pairs at alpha / 2; the winner's comparisons that reject read "faster" (the cell then names
      no fastest: the winner is ahead of some, not of all).

    The two halves share alpha, so any false 'faster' of the cell has probability ≤ alpha. Verdicts show the
    adjusted p: (k − 1) · p for the claim's, 2 × Holm's for the others."""
    means = [_geometric_mean(values) if values and _positive(values) else None for values in launches]
    ranked = [index for index, mean in enumerate(means) if mean is not None]
    if not ranked:
        return Cell(winner=None, fastest=False, p_claim=None, against={}, comparisons=0)
    winner = max(ranked, key=lambda index: means[index])  # type: ignore[arg-type, return-value]
    others = [index for index in range(len(launches)) if groups[index] != groups[winner]]
    mine = {other: contrast(launches[other], launches[winner]) for other in others}  # B is the winner
    factor = max(1, len(ranked) - 1)  # k − 1: the pairs a false claim could come from
    claimed = [min(1.0, factor * test.p_value) if test.p_value is not None else None for test in mine.values()]
    fastest = bool(mine) and all(
        p is not None and p < alpha and test.ratio is not None and test.ratio > 1
        for p, test in zip(claimed, mine.values(), strict=True)
    )
    p_claim = max(claimed) if mine and all(p is not None for p in claimed) else None  # type: ignore[type-var]
    pairs = [(i, j) for i in range(len(launches)) for j in range(i + 1, len(launches)) if groups[i] != groups[j]]
    tests = [contrast(launches[i], launches[j]) for i, j in pairs]
    holm_p = dict(zip(pairs, holm([test.p_value for test in tests]), strict=True))
    against: dict[int, Verdict] = {}
    for (other, item), p_claimed in zip(mine.items(), claimed, strict=True):
        if item.p_value is None:
            against[other] = Verdict(contrast=item, p_adjusted=None, direction=None, text=item.why_no_test)
            continue
        if fastest:
            text = f"faster ({describe(item, p_claimed, method='×(k−1): the winner chosen')})"
            against[other] = Verdict(contrast=item, p_adjusted=p_claimed, direction="higher", text=text)
            continue
        pair_p = holm_p[(min(other, winner), max(other, winner))]
        p = None if pair_p is None else min(1.0, 2 * pair_p)
        direction = "higher" if p is not None and p < alpha and item.ratio is not None and item.ratio > 1 else None
        word = "faster" if direction else "not separable"
        text = f"{word} ({describe(item, p, method='Holm over the cell')})"
        against[other] = Verdict(contrast=item, p_adjusted=p, direction=direction, text=text)
    comparisons = sum(test.p_value is not None for test in tests)
    return Cell(winner=winner, fastest=fastest, p_claim=p_claim, against=against, comparisons=comparisons)


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg q-values (None stays None): sorted ascending, q_(i) = min_{j ≥ i} min(1, m·p_(j)/j).
    Rejecting every q < α keeps the expected share of false rejections ≤ α (independent or positively
    dependent tests)."""
    order = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])  # type: ignore[arg-type, return-value]
    q: list[float | None] = [None] * len(p_values)
    running = 1.0
    m = len(order)
    for rank in range(m, 0, -1):
        index = order[rank - 1]
        running = min(running, m * p_values[index] / rank)  # type: ignore[operator]
        q[index] = running
    return q


def describe(item: Contrast, p_adjusted: float | None, *, method: str = "Holm") -> str:
    """'×1.31 [1.18, 1.45], p=0.004 (Holm), 3+3 launches'; `method` names the adjustment."""
    parts = []
    if item.ratio is not None:
        interval = f" [{item.ci_low:.3g}, {item.ci_high:.3g}]" if item.ci_low is not None else ""
        parts.append(f"×{item.ratio:.3g}{interval}")
    if p_adjusted is not None:
        parts.append(f"p={p_adjusted:.2g} ({method})")
    parts.append(f"{item.n_a}+{item.n_b} launches")
    return ", ".join(parts)


def _positive(values: Sequence[float]) -> bool:
    return all(v > 0 and math.isfinite(v) for v in values)


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def _welch(log_a: Sequence[float], log_b: Sequence[float], cv_floor: float) -> tuple[float, float]:
    """Welch's standard error of mean(log b) − mean(log a) and its Welch–Satterthwaite degrees of freedom,
    each side's variance floored at log(1 + cv_floor)² (module docstring); (0, inf) where both are 0."""
    floor = math.log1p(cv_floor) ** 2
    var_a, var_b = max(_variance(log_a), floor) / len(log_a), max(_variance(log_b), floor) / len(log_b)
    if var_a + var_b == 0:
        return 0.0, math.inf
    dof = (var_a + var_b) ** 2 / (var_a**2 / (len(log_a) - 1) + var_b**2 / (len(log_b) - 1))
    return math.sqrt(var_a + var_b), dof


def _variance(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
