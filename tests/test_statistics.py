"""The statistics every figure is summarised with: Le Boudec's intervals of the median, CV, the noise flag."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlbench.statistics import coefficient_of_variation, is_noisy, median_ci, median_ci_ranks, percentile


@pytest.mark.parametrize(("n", "ranks"), [(1, None), (5, None), (6, (1, 6)), (10, (2, 9)), (20, (6, 15))])
def test_median_ci_ranks_match_le_boudecs_table(n, ranks):
    assert median_ci_ranks(n) == ranks


@pytest.mark.parametrize("n", range(6, 120))
def test_median_ci_covers_95_percent_and_is_the_narrowest_symmetric_interval_that_does(n):
    j, k = median_ci_ranks(n)
    assert k == n + 1 - j

    def coverage(j: int) -> float:  # P(x(j) ≤ median ≤ x(n+1-j)) for Binomial(n, 1/2) counts below it
        return sum(math.comb(n, i) for i in range(j, n + 1 - j)) / 2**n

    assert coverage(j) >= 0.95 and coverage(j + 1) < 0.95


def test_the_large_n_approximation_continues_the_exact_ranks():
    exact, approximate = median_ci_ranks(2000), median_ci_ranks(2001)
    assert abs(exact[0] - approximate[0]) <= 1


def test_median_ci_returns_order_statistics():
    values = sorted(np.random.default_rng(1).random(20))
    assert median_ci(values) == (values[5], values[14])
    assert median_ci(values[:5]) is None


def test_coefficient_of_variation_is_the_sample_stdev_over_the_mean():
    values = [1.0, 2.0, 4.0, 8.0]
    assert coefficient_of_variation(values) == pytest.approx(np.std(values, ddof=1) / np.mean(values))
    assert coefficient_of_variation([3.0]) is None and coefficient_of_variation([0.0, 0.0]) is None


def test_noisy_means_an_interval_wider_than_five_percent_or_none_at_all():
    assert not is_noisy(100.0, (96.0, 104.0))
    assert is_noisy(100.0, (94.0, 106.0))
    assert is_noisy(100.0, None)


@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_interpolates_as_numpy_does(q):
    values = sorted(np.random.default_rng(2).random(37))
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))
