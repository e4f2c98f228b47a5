"""Verdicts from launches (ddlbench.analysis.verdicts): Welch's t on logs, Holm's correction, and the
behaviour a reader relies on: no verdict from one launch, few false alarms between equal configurations,
a real 30 % change found at a few launches when launches are as steady as a quiet machine's."""

from __future__ import annotations

import math
import random

import pytest

from ddlbench.analysis.verdicts import (
    ALPHA,
    CV_FLOOR,
    MIN_LAUNCHES,
    ONE_LAUNCH,
    benjamini_hochberg,
    contrast,
    holm,
    judge,
    judge_cell,
    power,
)
from ddlbench.statistics import student_t_quantile


def test_welch_on_logs_matches_the_textbook_computation():
    a, b = [100.0, 110.0, 95.0, 105.0], [130.0, 140.0, 128.0]
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    mean_a, mean_b = sum(la) / 4, sum(lb) / 3
    var_a = sum((v - mean_a) ** 2 for v in la) / 3 / 4
    var_b = sum((v - mean_b) ** 2 for v in lb) / 2 / 3
    dof = (var_a + var_b) ** 2 / (var_a**2 / 3 + var_b**2 / 2)
    t = (mean_b - mean_a) / math.sqrt(var_a + var_b)
    got = contrast(a, b)
    assert got.ratio == pytest.approx(math.exp(mean_b - mean_a), rel=1e-12)
    assert got.dof == pytest.approx(dof, rel=1e-12)
    # the p-value is the two-sided tail at t: the quantile at 1 - p/2 gives t back
    assert student_t_quantile(1 - got.p_value / 2, dof) == pytest.approx(abs(t), rel=1e-6)
    half = student_t_quantile(0.975, dof) * math.sqrt(var_a + var_b)
    assert got.ci_low == pytest.approx(math.exp(mean_b - mean_a - half), rel=1e-9)
    assert got.ci_high == pytest.approx(math.exp(mean_b - mean_a + half), rel=1e-9)


def test_holm_adjusts_as_the_step_down_method_does():
    # sorted 0.01, 0.02, 0.04 with m = 3: 0.03, max(0.03, 0.04), max(0.04, 0.04)
    assert holm([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.04])  # type: ignore[arg-type]
    assert holm([0.5, 0.6]) == [1.0, 1.0]


@pytest.mark.parametrize("n_a, n_b, why", [(1, 5, ONE_LAUNCH), (5, 1, ONE_LAUNCH), (2, 3, "2 launches")])
def test_too_few_launches_give_no_verdict_however_different(n_a, n_b, why):
    verdict = judge([contrast([100.0 + i for i in range(n_a)], [200.0 + i for i in range(n_b)])])[0]
    assert verdict.direction is None and verdict.p_adjusted is None
    assert verdict.text.startswith(why)
    assert MIN_LAUNCHES == 3


def _launches(rng: random.Random, n: int, scale: float, cv: float) -> list[float]:
    return [scale * math.exp(rng.gauss(0, cv)) for _ in range(n)]


@pytest.mark.parametrize("cv", [0.02, 0.3])
def test_equal_configurations_are_called_different_at_most_alpha_of_the_time(cv):
    # a family of 4 A/A contrasts at 3 launches each, 1000 families: the family-wise error rate is ≤ α
    # (Holm), so at most 5 % of families hold any verdict; 1000 trials put a binomial SD of 0.7 % on it
    rng = random.Random(21)
    families = 1000
    alarms = sum(
        any(
            v.direction
            for v in judge([contrast(_launches(rng, 3, 100, cv), _launches(rng, 3, 100, cv)) for _ in range(4)])
        )
        for _ in range(families)
    )
    assert alarms / families <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / families)


def test_a_thirty_percent_slowdown_is_found_at_three_launches_when_launches_are_steady():
    # launches 3 % apart (a quiet node): a 30 % slowdown is ln(1.3) / (0.03 · sqrt(2/3)) ≈ 10 standard errors
    rng = random.Random(5)
    found = [judge([contrast(_launches(rng, 3, 100, 0.03), _launches(rng, 3, 100 / 1.3, 0.03))])[0] for _ in range(200)]
    assert sum(v.direction == "lower" for v in found) >= 190
    assert all(v.direction in ("lower", None) for v in found)


def _spread_exactly(n: int, cv: float) -> list[float]:
    """n launches whose log values have sample standard deviation exactly cv, about 100."""
    offsets = [i - (n - 1) / 2 for i in range(n)]
    sd = math.sqrt(sum(x * x for x in offsets) / (n - 1))
    return [100 * math.exp(cv * x / sd) for x in offsets]


@pytest.mark.parametrize(("n", "cv", "ratio"), [(6, 0.12, 1 / 1.3), (8, 0.2, 1.3), (10, 0.15, 1 / 1.3), (12, 0.1, 0.9)])
def test_the_power_at_measured_spreads_is_the_rate_at_which_such_launches_are_called_different(n, cv, ratio):
    # launches whose spread is cv on both sides: power() against the rate at which Welch's test calls
    # lognormal launches of that spread and that ratio different (4,000 draws: binomial SD ≤ 0.8 %). The
    # shifted-t approximation and the draws' own varying spreads are within 3 % of it at these sizes
    stated = power(_spread_exactly(n, cv), _spread_exactly(n, cv), ratio=ratio)
    assert stated is not None and 0.3 < stated < 0.99  # a size where a wrong power shows
    rng = random.Random(11)
    draws = 4000
    called = sum(
        judge([contrast(_launches(rng, n, 100, cv), _launches(rng, n, 100 * ratio, cv))])[0].direction is not None
        for _ in range(draws)
    )
    assert abs(called / draws - stated) < 0.03, (called / draws, stated)


def test_the_power_grows_with_launches_and_falls_with_spread_and_needs_three_launches():
    power_at = [power(_spread_exactly(n, 0.1), _spread_exactly(n, 0.1), ratio=1 / 1.3) for n in (3, 4, 6, 10)]
    assert power_at == sorted(power_at) and power_at[0] < 0.8 < 0.99 < power_at[-1]
    assert power(_spread_exactly(6, 0.05), _spread_exactly(6, 0.05), ratio=1 / 1.3) > power_at[2]
    # the smaller side's spread counts as the larger's does
    assert power(_spread_exactly(6, 0.3), _spread_exactly(6, 0.1), ratio=1 / 1.3) < power_at[2]
    assert power([100.0, 101.0], _spread_exactly(6, 0.1), ratio=1 / 1.3) is None
    with pytest.raises(ValueError, match="ratio 1"):
        power(_spread_exactly(3, 0.1), _spread_exactly(3, 0.1), ratio=1)


def test_identical_launches_agree_and_distinct_steady_ones_differ():
    assert judge([contrast([10.0, 10.0, 10.0], [10.0, 10.0, 10.0])])[0].direction is None
    assert judge([contrast([10.0, 10.0, 10.0], [12.0, 12.0, 12.0])])[0].direction == "higher"


def test_a_value_that_is_not_positive_gets_no_test():
    verdict = judge([contrast([1.0, 2.0, 0.0], [1.0, 2.0, 3.0])])[0]
    assert verdict.direction is None and "not positive" in verdict.text


def test_launches_that_agree_exactly_are_no_proof_of_a_small_difference():
    # no spread on either side: the floor (CV_FLOOR, 1 %) stands in for it, so 1 % apart is not separable and
    # 20 % apart still is
    assert CV_FLOOR == 0.01
    assert judge([contrast([10.0, 10.0, 10.0], [10.1, 10.1, 10.1])])[0].direction is None
    assert contrast([10.0, 10.0, 10.0], [10.0, 10.0, 10.0]).p_value == pytest.approx(1.0)


@pytest.mark.parametrize(("strategies", "launches"), [(5, 3), (3, 6)])
def test_the_cells_false_alarm_rate_over_simulated_draws_stays_within_alpha(strategies, launches):
    """The procedure, not one pair: cells of equal strategies (lognormal launches, CV 5 %); the share of cells
    that say anything is faster (the winner's claim or any comparison beside it) stays ≤ α, within three
    binomial standard deviations of 600 draws (the selection of the winner included)."""
    rng = random.Random(7)
    draws = 600
    groups = [str(i) for i in range(strategies)]
    alarms = 0
    for _ in range(draws):
        cell = judge_cell([_launches(rng, launches, 100, 0.05) for _ in groups], groups)
        alarms += any(verdict.direction for verdict in cell.against.values())
    assert alarms / draws <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / draws), alarms


def test_a_cell_names_its_winner_fastest_only_when_it_beats_every_other_strategy():
    steady = [[100.0, 101.0, 99.0], [60.0, 61.0, 59.0], [58.0, 59.0, 57.0]]
    cell = judge_cell(steady, ["ddp", "zero2", "gpipe"])
    assert cell.winner == 0 and cell.fastest and cell.comparisons == 3
    assert {other: verdict.direction for other, verdict in cell.against.items()} == {1: "higher", 2: "higher"}
    close = [[100.0, 101.0, 99.0], [99.5, 100.5, 98.5], [60.0, 61.0, 59.0]]  # the runner-up within noise
    cell = judge_cell(close, ["ddp", "zero2", "gpipe"])
    assert not cell.fastest and cell.against[1].direction is None and cell.against[2].direction == "higher"
    # two configurations of one strategy are not compared with each other: only the other strategy counts
    same = judge_cell([[100.0, 101.0, 99.0], [99.5, 100.5, 98.5], [60.0, 61.0, 59.0]], ["ddp", "ddp", "zero2"])
    assert same.fastest and same.comparisons == 2 and set(same.against) == {2}


def test_benjamini_hochberg_q_values_as_the_step_up_method_gives_them():
    # sorted 0.01, 0.02, 0.04 with m = 3: q = min over later of m·p/rank: 0.03, 0.03, 0.04
    assert benjamini_hochberg([0.04, 0.01, None, 0.02]) == pytest.approx([0.04, 0.03, None, 0.03])  # type: ignore[arg-type]
