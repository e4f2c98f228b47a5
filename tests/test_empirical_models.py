"""Empirical scaling models (ddlbench.analysis.empirical): the normal form's search recovers the law that
made the data, its bands cover what they claim, and `ddlbench fit` reads a CSV as documented."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from ddlbench.analysis.empirical import regression
from ddlbench.analysis.empirical.cheapest import cheapest, parse_target
from ddlbench.analysis.empirical.extrapolation import (
    BAND_SPREAD,
    amdahl,
    forward_error,
    search_ddlbench,
    serial_fraction,
)
from ddlbench.analysis.empirical.holdout import hold_out
from ddlbench.analysis.empirical.laws import bounded_linear
from ddlbench.analysis.empirical.regression import fit_hypothesis, smape
from ddlbench.analysis.empirical.search import loo_smape, search_extrap
from ddlbench.analysis.empirical.series import Series
from ddlbench.analysis.empirical.terms import Factor
from ddlbench.errors import DdlbenchError
from ddlbench.statistics import student_t_quantile
from tests.conftest import REPO

P = np.array([2.0, 4, 8, 16, 32, 64])


def test_student_t_quantiles_are_the_tables():
    # two-sided 95 % and 99 % critical values (any statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
    for dof, value in ((1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert student_t_quantile(0.975, dof) == pytest.approx(value, abs=5e-4)
    assert student_t_quantile(0.995, 3) == pytest.approx(5.841, abs=5e-4)
    assert student_t_quantile(0.025, 5) == pytest.approx(-2.571, abs=5e-4)
    assert student_t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)


@pytest.mark.parametrize(
    ("law", "formula"),
    [
        (lambda p: 3 + 0.5 * p * np.log2(p), "3 + 0.5·p·log2(p)"),
        (lambda p: 1 + 2 * p**1.5, "1 + 2·p^(3/2)"),
        (lambda p: 7 + 0.25 * np.log2(p) ** 2, "7 + 0.25·log2(p)^2"),
    ],
)
def test_the_extrap_search_recovers_the_law_of_exact_data(law, formula):
    fit = search_extrap(("p",), P[:, None], [[v] for v in law(P)])
    assert fit.formula() == formula
    assert fit.predict([[256.0]])[0] == pytest.approx(law(np.array([256.0]))[0], rel=1e-9)


def test_a_constant_is_kept_unless_a_term_predicts_better_out_of_sample():
    noise = np.array([1.0, -1.0, 0.5, -0.5, 1.0, -1.0]) * 1e-3
    fit = search_extrap(("p",), P[:, None], [[5.0 + e] for e in noise])
    assert fit.terms == () and fit.coefficients[0] == pytest.approx(5.0, abs=1e-3)


def test_two_parameters_combine_each_ones_best_term():
    p, b = np.meshgrid([2.0, 4, 8, 16, 32], [16.0, 32, 64, 128, 256])
    x = np.column_stack([p.ravel(), b.ravel()])
    fit = search_extrap(("p", "b"), x, [[1 + 0.01 * pp * bb] for pp, bb in x])
    assert fit.formula() == "1 + 0.01·p·b"
    fit = search_extrap(("p", "b"), x, [[2 + 3 * np.log2(pp) + 0.5 * bb] for pp, bb in x])
    assert fit.formula() == "2 + 3·log2(p) + 0.5·b"


def test_leave_one_out_and_smape_are_their_definitions():
    x, y = np.array([[1.0], [2.0], [3.0], [5.0]]), np.array([1.0, 2.5, 2.9, 5.2])
    terms = ((Factor(0, 1),),)
    by_hand = []
    for k in range(4):
        keep = [i for i in range(4) if i != k]
        slope, intercept = np.polyfit(x[keep, 0], y[keep], 1)
        by_hand.append(slope * x[k, 0] + intercept)
    expected = 100 * np.mean([2 * abs(p - m) / (abs(p) + abs(m)) for p, m in zip(by_hand, y, strict=True)])
    assert loo_smape(terms, x, y) == pytest.approx(expected, rel=1e-12)
    assert smape(np.array([0.0, 2.0]), np.array([0.0, 1.0])) == pytest.approx(100 * (0 + 2 / 3) / 2)


# The band's coverage, checked by simulation. Design: y = 2 + 0.3·p + N(0, 0.5²), 2 repetitions at p = 16, 32,
# 64 (N = 6 observations, q = 2 coefficients, ν = N − q = 4), one new measurement at p = 128 (2× beyond). There
# (new − f(128)) / (s·√(1 + leverage)) is exactly Student's t with ν degrees of freedom, so a band with half-width
# c·s·√(1 + leverage) covers with probability P(|T₄| < c) = x·(1 + (1 − x²)/2), x = c/√(4 + c²) (the t₄ cdf in
# closed form). Few degrees of freedom are where t and z part most, and where sweeps live (a handful of points):
#   t_{0.975, 4} = 2.776 → 0.950 (correct);  z = 1.960 → 0.878 (the z-for-t mistake);
#   t_{0.975, 1} = 12.71 → 0.9998 (degrees of freedom of the points, P − q, instead of the observations).
# The share of TRIALS covered is Binomial(n, π)/n with SD √(π(1 − π)/n). At n = 1500 that is 0.0056 at π = 0.95
# and 0.0084 at π = 0.878 (σ₀, σ_z); the bound |share − 0.95| < k·σ₀ = 0.0286, k = 0.072/(σ₀ + σ_z) = 5.1, splits
# the 0.072 gap so that both coverages lie k of their SDs from its edge. Summed exactly over the binomial, whatever
# the seed, a correct band fails with probability 1.4·10⁻⁶ (the count of misses is skewed to the right) and a z band
# passes with 3·10⁻⁸.
TRIALS = 1500
REPETITIONS = 2
BAND_P = np.array([16.0, 32.0, 64.0])


def _t4_coverage(c: float) -> float:
    x = c / np.sqrt(4 + c * c)
    return float(x * (1 + (1 - x * x) / 2))


def _coverage_tolerance() -> tuple[float, float]:
    """TOL and k of the comment above, from the binomial SDs."""
    claimed, z_coverage = 0.95, _t4_coverage(1.959963984540054)
    sd_claimed = np.sqrt(claimed * (1 - claimed) / TRIALS)
    sd_z = np.sqrt(z_coverage * (1 - z_coverage) / TRIALS)
    k = (claimed - z_coverage) / (sd_claimed + sd_z)
    return k * sd_claimed, k


def _band_coverage() -> float:
    """The share of TRIALS seeded fits whose band at p = 128 holds a new measurement there."""
    rng = np.random.default_rng(12)
    noise = 0.5 * rng.standard_normal((TRIALS, len(BAND_P), REPETITIONS))
    new = 2 + 0.3 * 128 + 0.5 * rng.standard_normal(TRIALS)
    terms = ((Factor(0, 1),),)
    inside = 0
    for trial in range(TRIALS):
        values = [list(2 + 0.3 * p + noise[trial, k]) for k, p in enumerate(BAND_P)]
        fit = fit_hypothesis(("p",), terms, BAND_P[:, None], values)
        assert fit.observations - len(fit.coefficients) == 4
        low, high = fit.band([[128.0]])
        inside += bool(low[0] <= new[trial] <= high[0])
    return inside / TRIALS


@pytest.fixture
def fast_quantile(monkeypatch):
    """The band's t quantile, memoised: the same values (it is pure; its tables test is above), 10× faster."""
    monkeypatch.setattr(regression, "student_t_quantile", functools.cache(student_t_quantile))


def test_the_coverage_tolerance_separates_t_from_z():
    tolerance, k = _coverage_tolerance()
    assert _t4_coverage(student_t_quantile(0.975, 4)) == pytest.approx(0.95, abs=1e-9)
    assert k > 5 and 0.02 < tolerance < 0.95 - _t4_coverage(1.959963984540054) - 0.02


@pytest.mark.slow
def test_the_prediction_band_covers_new_measurements_as_often_as_it_claims(fast_quantile):
    tolerance, _ = _coverage_tolerance()
    assert abs(_band_coverage() - 0.95) < tolerance


@pytest.mark.slow
@pytest.mark.parametrize(
    "wrong_quantile",
    [
        pytest.param(lambda probability, dof: NormalDist().inv_cdf(probability), id="z-for-t"),
        pytest.param(lambda probability, dof: student_t_quantile(probability, 1), id="dof-of-the-points"),
    ],
)
def test_the_coverage_check_fails_a_band_with_the_wrong_quantile(monkeypatch, wrong_quantile):
    """The check above has the power it claims: the same trials with a wrong quantile miss its bound."""
    monkeypatch.setattr(regression, "student_t_quantile", functools.cache(wrong_quantile))
    tolerance, _ = _coverage_tolerance()
    assert abs(_band_coverage() - 0.95) >= tolerance


def test_no_band_without_observations_to_spare():
    fit = fit_hypothesis(("p",), ((Factor(0, 1),),), np.array([[1.0], [2.0]]), [[1.0], [2.0]])
    assert fit.band([[4.0]]) is None and fit.residual_variance is None


def test_amdahls_law_fits_a_throughput_and_a_per_device_rate_exactly():
    p = np.array([1.0, 2, 4, 8, 16, 32])
    rate = p / (0.01 + 0.0002 * p)  # 100 samples/s per device alone, a 2 % serial fraction
    fit = amdahl(("p",), p[:, None], [[v] for v in rate])
    assert fit.formula() == "p/(0.01 + 0.0002·p)"
    assert fit.predict([[128.0]])[0] == pytest.approx(128 / (0.01 + 0.0002 * 128), rel=1e-9)
    assert serial_fraction(fit) == pytest.approx(0.0002 / 0.0102, rel=1e-9)
    efficiency = amdahl(
        ("p",), p[:, None], [[v / p0 / 98.0392156862745] for v, p0 in zip(rate, p, strict=True)], per_device=True
    )
    assert efficiency.formula().startswith("1/(")


def test_a_throughputs_default_is_extra_ps_search_with_the_chosen_spread_and_two_points_amdahls_law():
    p = np.array([1.0, 2, 4, 8, 16, 32])
    rate = p / (0.01 + 0.0002 * p)
    values = [[v * (1 + e)] for v, e in zip(rate, (0.01, -0.02, 0.015, -0.01, 0.02, -0.015), strict=True)]
    fit = search_ddlbench(("p",), p[:, None], values, kind="throughput")
    extrap = search_extrap(("p",), p[:, None], values)
    at = np.array([[64.0], [128.0]])
    assert fit.formula() == extrap.formula()
    assert fit.predict(at) == pytest.approx(extrap.predict(at), rel=1e-12)
    assert fit.spread == BAND_SPREAD["law"] > 0
    # with two points nothing was scored out of sample: Amdahl's law alone, as before
    assert search_ddlbench(("p",), p[:2, None], values[:2], kind="throughput").formula().startswith("p/(")


def test_amdahls_law_alone_bounds_its_serial_part_so_superlinear_points_predict_linear_scaling():
    # two scales, two launches each, the second 3.3× the first (a noisy first point): unbounded, p/R = a + b·p
    # has b < 0 and crosses 0 before p = 4, a throughput with a pole there (what a CI run under load once met)
    p = np.array([[1.0], [2.0]])
    values = [[98.0, 102.0], [324.0, 336.0]]
    raw = amdahl(("p",), p, values)
    assert raw.coefficients[1] < 0 and not np.isfinite(raw.predict([[4.0]])[0])
    fit = search_ddlbench(("p",), p, values, kind="throughput")
    # bounded at b = 0: least squares of the constant a over every launch's device-seconds per sample
    a = np.mean([q / v for q, reps in zip((1.0, 2.0), values, strict=True) for v in reps])
    assert fit.coefficients == pytest.approx((a,), rel=1e-12) and serial_fraction(fit) == 0.0
    assert fit.predict([[4.0], [64.0]]) == pytest.approx([4 / a, 64 / a], rel=1e-12)
    # its band carries the misfit: linear scaling misses both scales by ~25 %, so s² (3 degrees of freedom)
    # lets a + b·p's lower end reach 0, and the band is open above
    low, high = fit.band([[4.0]])
    assert 0 < low[0] < 4 / a and np.isnan(high[0])
    close = search_ddlbench(("p",), p, [[98.0, 102.0], [196.0, 204.0]], kind="throughput")
    low, high = close.band([[4.0]])
    assert 0 < low[0] < close.predict([[4.0]])[0] < high[0] < np.inf
    # a step time under weak scaling (p·B₁/R, linear in p by the same law) stays positive: the constant
    steps = [[32 * q / v for v in reps] for q, reps in zip((1.0, 2.0), values, strict=True)]
    time = search_ddlbench(("p",), p, steps, kind="amdahl_time")
    assert time.predict([[4.0]])[0] == pytest.approx(np.mean(steps), rel=1e-12)
    assert bounded_linear(("p",), p, steps).coefficients == time.coefficients and len(time.coefficients) == 1
    # data that scale sublinearly are fitted as before: b > 0 is left alone
    sub = [[98.0, 102.0], [150.0, 154.0]]
    assert search_ddlbench(("p",), p, sub, kind="throughput").coefficients == amdahl(("p",), p, sub).coefficients


def test_a_figure_of_unknown_kind_gets_extra_ps_search_and_a_time_the_forward_validated_normal_form():
    p = np.array([1.0, 2, 4, 8, 16, 32])
    noisy = [[3 + 0.5 * v**0.75 * (1 + e)] for v, e in zip(p, (0.01, -0.02, 0.015, -0.01, 0.02, -0.015), strict=True)]
    fit = search_ddlbench(("p",), p[:, None], noisy, kind="other")
    assert fit.formula() == search_extrap(("p",), p[:, None], noisy).formula()
    assert fit.spread == BAND_SPREAD["unknown"] > 0
    # forward validation: a law fitted on the first points predicts the later ones exactly
    law = 2 + 0.1 * p * np.log2(p)
    assert forward_error(((Factor(0, Fraction(1), 1),),), p[:, None], law) == pytest.approx(0, abs=1e-12)
    fit = search_ddlbench(("p",), p[:, None], [[v] for v in law], kind="time")
    assert fit.formula() == "2 + 0.1·p·log2(p)" and fit.spread == 0


def test_bands_of_a_transformed_fit_are_the_transformed_band():
    p = np.array([1.0, 2, 4, 8])
    values = [[v * 0.99, v * 1.01] for v in p / (0.01 + 0.001 * p)]
    fit = amdahl(("p",), p[:, None], values)
    low, high = fit.band([[16.0], [32.0]])
    centre = fit.predict([[16.0], [32.0]])
    assert np.all(low < centre) and np.all(centre < high)
    # the band is p / (the band of p/R): recompute it from the linear fit of the device-seconds per sample
    linear = fit_hypothesis(
        ("p",),
        ((Factor(0, Fraction(1)),),),
        p[:, None],
        [[q / v for v in reps] for q, reps in zip(p, values, strict=True)],
    )
    g_low, g_high = linear.band([[16.0], [32.0]])
    assert np.allclose(low, [16 / g_high[0], 32 / g_high[1]]) and np.allclose(high, [16 / g_low[0], 32 / g_low[1]])


def _fit_csv(csv_text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlbench", "-q", "fit", *args],
        input=csv_text,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.slow
def test_fit_reads_a_csv_and_prints_a_prediction_per_value():
    rows = ["p,t"] + [f"{p:g},{2 + 0.3 * p + d:g}" for p in P for d in (-0.1, 0.1)]
    done = _fit_csv("\n".join(rows) + "\n", "--x", "p", "--y", "t", "128", "256")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert [line[0] for line in lines] == ["128", "256"]
    for (_, value, low, high), p in zip(lines, (128, 256), strict=True):
        assert float(low) < float(value) < float(high)
        assert float(value) == pytest.approx(2 + 0.3 * p, rel=1e-6)
    assert "t = 2 + 0.3·p" in done.stderr and "95 % prediction interval" in done.stderr
    # two parameters, values comma-separated
    rows = ["p,b,t"] + [f"{p:g},{b},{1 + 0.01 * p * b:g}" for p in (2, 4, 8, 16, 32) for b in (16, 32, 64, 128, 256)]
    done = _fit_csv("\n".join(rows) + "\n", "--x", "p", "--x", "b", "--y", "t", "64,512")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[1]) == pytest.approx(1 + 0.01 * 64 * 512, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("csv_text", "args", "message"),
    [
        ("p,t\n1,2\n2,3\n", ("--x", "p", "--y", "q"), "column 'q' not in the CSV"),
        ("p,t\n1,2\n1,3\n", ("--x", "p", "--y", "t"), "1 distinct x"),
        ("p,t\n1,2\nx,3\n", ("--x", "p", "--y", "t"), "line 3"),
        ("p,t\n1,2\n2,3\n", ("--x", "p", "--y", "t", "4,5"), "give one per --x"),
        ("p,t\n0,2\n2,3\n", ("--x", "p", "--y", "t"), "must be positive"),
    ],
)
def test_bad_csv_input_is_refused_by_name(csv_text, args, message):
    done = _fit_csv(csv_text, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_hold_out_fits_the_smaller_scales_and_scores_the_larger_ones():
    data = {1.0: [10.0], 2.0: [19.0, 21.0], 4.0: [40.0], 8.0: [80.0], 16.0: [150.0], 32.0: [330.0]}
    seen = {}

    def search(x, values):
        seen["x"], seen["values"] = x[:, 0].tolist(), values
        return fit_hypothesis(("p",), ((Factor(0, Fraction(1)),),), x, values)

    first, second = hold_out(data, search)
    assert seen["x"] == [1.0, 2.0, 4.0, 8.0] and seen["values"][1] == [19.0, 21.0]
    assert (first.scale, first.beyond, second.beyond) == (16.0, 2.0, 4.0)
    assert first.predicted == pytest.approx(160.0) and second.predicted == pytest.approx(320.0)  # 10·p exactly
    assert first.accuracy == pytest.approx(1 - 10 / 150) and second.accuracy == pytest.approx(1 - 10 / 330)
    with pytest.raises(ValueError, match="fewer than 2"):
        hold_out({1.0: [1.0], 2.0: [2.0], 4.0: [4.0]}, search)


def test_the_cheapest_configuration_meets_a_deadline_at_the_fewest_node_hours():
    nodes = [1.0, 2.0, 4.0, 8.0]
    rate = [n / (0.01 + 0.0005 * n) for n in nodes]  # Amdahl: 100 samples/s alone, saturating at 2000
    series = Series(
        figure="samples_per_s",
        parameters=("nodes",),
        label="ddp resnet8 cifar10 b32",
        x=tuple((n,) for n in nodes),
        values=tuple((r * 0.99, r * 1.01) for r in rate),
        fixed={"dataset": "cifar10", "batch_size": 32, "ranks_per_node": 1},
    )
    # an epoch of CIFAR-10 (50 000 samples) within 60 s needs R ≥ 833.3: 8 nodes give 800, 16 give 1143
    answer = cheapest([series], parse_target("epoch_time_s<=60"), at=[(16.0,), (32.0,)])
    best = answer["cheapest"]
    assert best["x"] == 16.0 and best["value"] == pytest.approx(50_000 / best["samples_per_s"])
    # the throughput's model: the default search for a throughput (Extra-P's, since the 8-collection choice),
    # fitted to the same repetitions
    x, values = np.array(nodes)[:, None], [list(v) for v in series.values]
    expected = search_ddlbench(("nodes",), x, values, kind="throughput").predict([[16.0]])[0]
    assert expected == pytest.approx(search_extrap(("nodes",), x, values).predict([[16.0]])[0], rel=1e-12)
    assert best["samples_per_s"] == pytest.approx(expected, rel=1e-9)
    assert best["cost_node_h_per_epoch"] == pytest.approx(16 * 50_000 / best["samples_per_s"] / 3600)
    assert [c["x"] for c in answer["choices"]] == [16.0, 32.0]  # cheapest first: 32 nodes cost more per epoch
    # a step-time target divides the global batch (32 per rank × 1 rank per node × nodes) by R
    answer = cheapest([series], parse_target("step_time_s<=0.02"), at=[(16.0,)])
    assert all(c["value"] == pytest.approx(32 * c["x"] / c["samples_per_s"]) for c in answer["choices"])
    with pytest.raises(DdlbenchError, match="samples_per_s>=N"):
        parse_target("samples_per_s<=5")


@pytest.mark.slow
def test_a_sweep_whose_points_all_failed_has_no_series_and_the_workflow_goes_on(tmp_path):
    import pandas as pd

    from ddlbench.analysis.empirical.series import series_from_table

    failed = pd.DataFrame({"point_id": ["a", "b"], "status": ["oom", "failed"], "nodes": [1, 2], "reason": ["x", "y"]})
    assert series_from_table(failed) == []
    failed.to_parquet(tmp_path / "table.parquet")
    done = subprocess.run(
        [sys.executable, "-m", "ddlbench", "-q", "fit", "--table", str(tmp_path / "table.parquet"), "--allow-none",
         "--format", "json", "--out", str(tmp_path / "models.json")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "models.json").read_text())
    assert written["models"] == [] and "no series over nodes" in written["why"]
