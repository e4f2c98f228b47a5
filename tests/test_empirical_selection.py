"""ddlbench's default search chosen out of sample (ddlbench.analysis.empirical.selection): the rule keeps
Extra-P's search unless a candidate beats it at 2× and at 4×, each collection is scored by a pick made
without it, a combination predicts its members' mean inside their united band, the band widens beyond the
fitted scales as calibrated, and the committed defaults are what the procedure chooses on the public series."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from ddlbench.analysis.empirical.candidates import FAMILIES, candidate
from ddlbench.analysis.empirical.combine import combine
from ddlbench.analysis.empirical.extrapolation import BAND_SPREAD, DEFAULT_SEARCH, amdahl, search_ddlbench
from ddlbench.analysis.empirical.holdout import HeldOut
from ddlbench.analysis.empirical.regression import fit_hypothesis
from ddlbench.analysis.empirical.search import search_extrap
from ddlbench.analysis.empirical.selection import (
    ALPHA,
    EXACT,
    FLIPS,
    PublicSeries,
    Scored,
    calibrate,
    calibrate_spread,
    load_collection,
    means,
    paired_gain_p,
    pick,
    score,
    select,
)
from ddlbench.analysis.empirical.terms import Factor
from ddlbench.errors import DdlbenchError
from tests.conftest import REPO

LINE = ((Factor(0, Fraction(1)),),)


def test_the_rule_keeps_extra_ps_search_unless_a_candidate_beats_it_at_both_scales_beyond_chance():
    names = ("extrap", "forward", "extrap+forward")
    n = 8
    accuracy = {
        "extrap": [(0.95, 0.90)] * n,
        "forward": [(0.99, 0.80)] * n,  # far better at 2×, worse at 4×: not taken
        "extrap+forward": [(0.96, 0.90)] * n,  # better at 2× on every series, equal at 4×: taken
    }
    assert pick(accuracy, names) == "extrap+forward"  # all 8 gains positive: p = 1/256
    accuracy["extrap+forward"] = [(0.96, 0.89)] * n  # worse at 4×
    assert pick(accuracy, names) == "extrap"
    # a higher mean at both scales, but from one series of 8 while the others lose a little: chance
    accuracy["extrap+forward"] = [(0.99, 0.94)] + [(0.949, 0.899)] * (n - 1)
    assert all(m > b for m, b in zip(means(accuracy["extrap+forward"]), means(accuracy["extrap"]), strict=True))
    assert pick(accuracy, names) == "extrap"


def test_the_paired_sign_flip_p_counts_sign_patterns():
    assert paired_gain_p([1.0] * 5) == pytest.approx(1 / 32)  # only the observed pattern is as large
    assert paired_gain_p([0.0] * 5) == 1.0 and paired_gain_p([-1.0, 0.5]) == 1.0 and paired_gain_p([]) == 1.0
    # ±3 ±1 ±1 sums to 5, 3, 3, 1, −1, −3, −3, −5: the observed 5 is reached by 1 pattern of 8, 3 by 3
    assert paired_gain_p([3.0, 1.0, 1.0]) == pytest.approx(1 / 8)
    assert paired_gain_p([3.0, -1.0, 1.0]) == pytest.approx(3 / 8)
    # beyond the exact count, the drawn p agrees with the exact one within its sampling error
    gains = [0.3, -0.1, 0.2, 0.05, 0.4, -0.2, 0.1, 0.15, 0.25, -0.05, 0.3, 0.1, 0.2, -0.15, 0.05, 0.1]
    assert len(gains) == EXACT
    exact = paired_gain_p(gains)
    drawn = paired_gain_p([*gains, 0.0])  # a zero gain changes no pattern's sum, only the method
    assert abs(drawn - exact) <= 4 * math.sqrt(exact * (1 - exact) / FLIPS)
    assert 0 < exact < ALPHA


def _held(predicted: tuple[float, float]) -> Scored:
    fit = fit_hypothesis(("p",), (), np.array([[1.0], [2.0]]), [[1.0], [1.0]])
    return Scored(
        fit=fit,
        held=tuple(
            HeldOut(scale=s, beyond=s / 2, predicted=p, measured=1.0)
            for s, p in zip((4.0, 8.0), predicted, strict=True)
        ),
    )


def test_each_collection_is_scored_by_a_pick_made_without_it():
    # forward beats extrap in collections a and b, loses badly in c
    errors = {"a": (0.02, 0.04), "b": (0.02, 0.04), "c": (0.30, 0.50)}
    series, scored = [], []
    for collection, (at2, at4) in [(c, e) for c, e in errors.items() for _ in range(3)]:  # 3 series each
        series.append(PublicSeries(name=collection, collection=collection, kind="throughput", data={}))
        scored.append(
            {
                "extrap": _held((1.05, 1.10)),
                "forward": _held((1 + at2, 1 + at4)),
                "extrap+forward": _held((1 + (0.05 + at2) / 2, 1 + (0.10 + at4) / 2)),
            }
        )
    chosen = select(series, scored, "unknown")
    picks = {fold.collection: fold.chosen for fold in chosen.folds}
    # without c, forward looks best; with c in the training set, forward and the mean lose at 4×
    assert picks == {"a": "extrap", "b": "extrap", "c": "forward"}
    assert chosen.out_of_sample[6] == pytest.approx((0.70, 0.50))  # c scored by the pick made on a and b
    lost = zip(means(chosen.out_of_sample), means(chosen.baseline), strict=True)
    assert all(ours < theirs for ours, theirs in lost)  # the procedure lost to Extra-P, out of sample
    assert chosen.default == "extrap"


def test_a_combination_predicts_its_members_mean_inside_their_united_band():
    p = np.array([[1.0], [2.0], [4.0], [8.0]])
    values = [[v * 0.98, v * 1.02] for v in (100.0, 190.0, 350.0, 600.0)]
    members = [search_extrap(("p",), p, values), amdahl(("p",), p, values)]
    both = combine(members, p, values)
    at = np.array([[16.0], [32.0]])
    assert both.predict(at) == pytest.approx((members[0].predict(at) + members[1].predict(at)) / 2, rel=1e-12)
    low, high = both.band(at)
    for member in members:
        own_low, own_high = member.band(at)
        assert np.all(low <= own_low) and np.all(np.isnan(high) | (np.nan_to_num(own_high, nan=np.inf) <= high))
    # a member with no prediction (Amdahl's law past its pole) leaves the other's
    saturating = amdahl(("p",), p, [[100.0], [250.0], [600.0], [1500.0]])  # superlinear: a negative serial part
    assert not np.isfinite(saturating.predict([[1e4]])[0])
    mixed = combine([members[0], saturating], p, values)
    assert mixed.predict([[1e4]])[0] == pytest.approx(members[0].predict([[1e4]])[0])


def test_the_band_widens_beyond_the_fitted_scales_by_the_spread_per_doubling():
    p = np.array([[1.0], [2.0], [4.0], [8.0]])
    fit = fit_hypothesis(("p",), LINE, p, [[3 + 2 * v[0] - 1e-3, 3 + 2 * v[0] + 1e-3] for v in p])
    wide = replace(fit, spread=0.25)
    inside = np.array([[3.0], [8.0]])
    assert np.allclose(wide.band(inside), fit.band(inside))  # inside the fitted range: the interval alone
    at = np.array([[16.0], [32.0]])
    centre = wide.predict(at)
    low, high = wide.band(at)
    assert low == pytest.approx(centre / np.array([1.25, 1.25**2]), rel=1e-9)
    assert high == pytest.approx(centre * np.array([1.25, 1.25**2]), rel=1e-9)


def test_a_need_is_the_spread_that_just_holds_the_measurement():
    p = np.array([[1.0], [2.0], [4.0]])
    fit = fit_hypothesis(("p",), LINE, p, [[10.0, 10.001], [20.0, 20.001], [40.0, 40.001]])
    held = (HeldOut(scale=8.0, beyond=2.0, predicted=float(fit.predict([[8.0]])[0]), measured=60.0),)
    need = Scored(fit=fit, held=held).need(0)
    assert need == pytest.approx(80.0005 / 60.0 - 1, rel=1e-4)
    for spread, holds in ((need * 1.001, True), (need * 0.999, False)):
        low, high = replace(fit, spread=spread).band([[8.0]])
        assert bool(low[0] <= 60.0 <= high[0]) == holds


def test_the_spread_holds_the_asked_share_of_the_needs():
    needs = [0.0] * 15 + [0.1, 0.2, 0.3, 0.4, math.inf]
    assert calibrate_spread(needs, coverage=0.8) == 0.1  # 16 of 20
    assert calibrate_spread(needs, coverage=0.95) == 0.4  # 19 of 20
    assert calibrate_spread([0.1234], coverage=0.95) == 0.124  # rounded up: it still holds


def test_candidates_are_named_and_the_law_only_for_its_kinds():
    x, values = np.array([[1.0], [2.0], [4.0]]), [[100.0], [190.0], [350.0]]
    assert candidate("law", "throughput")(("p",), x, values).formula().startswith("p/(")
    with pytest.raises(DdlbenchError, match="no law for a figure of kind 'other'"):
        candidate("law", "other")
    with pytest.raises(DdlbenchError, match="candidates: extrap, law, forward"):
        candidate("mean", "throughput")


@pytest.fixture(scope="module")
def public():
    series = load_collection(REPO / "benchmarks" / "empirical" / "data")
    return series, [score(s, FAMILIES["law"]) for s in series]


def test_the_development_collection_has_fifty_six_series_from_eight_collections(public):
    series, _ = public
    assert len(series) >= 56 and len({s.collection for s in series}) >= 8
    assert all(len(s.data) >= 5 for s in series)  # 3 or more fitted, 2 held out


def test_the_defaults_are_what_the_procedure_chooses_and_no_worse_than_extra_p_out_of_sample(public):
    series, scored = public
    for family in FAMILIES:
        chosen = select(series, scored, family)
        assert DEFAULT_SEARCH[family] == chosen.default
        default = chosen.accuracy[chosen.default]
        assert all(d >= b for d, b in zip(means(default), means(chosen.baseline), strict=True))
        band = calibrate(series, scored, chosen.default)
        assert BAND_SPREAD[family] == band.spread
        assert abs(band.inside_out_of_sample / band.held_out - 0.95) <= 0.05


def test_search_ddlbench_applies_the_defaults(public):
    series, _ = public
    one = series[0]
    scales = sorted(one.data)
    x, values = np.asarray([[s] for s in scales]), [one.data[s] for s in scales]
    for kind, family in (("throughput", "law"), ("other", "unknown")):
        fit = search_ddlbench(("p",), x, values, kind=kind)
        expected = candidate(DEFAULT_SEARCH[family], kind)(("p",), x, values)
        assert fit.formula() == expected.formula() and fit.spread == BAND_SPREAD[family]


def test_a_series_of_another_kind_is_scored_without_the_law_and_left_out_of_its_family():
    data = {p: [100.0 * p / (1 + 0.02 * p)] for p in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)}
    rate = PublicSeries(name="rate", collection="a", kind="throughput", data=data)
    other = PublicSeries(name="other", collection="b", kind="other", data=data)
    scored = [score(rate, FAMILIES["law"]), score(other, FAMILIES["law"])]
    assert set(scored[0]) == set(FAMILIES["law"]) and set(scored[1]) == set(FAMILIES["unknown"])
    law = select([rate, other], scored, "law")
    assert law.series == ("rate",) and law.folds[0].chosen == "extrap"  # nothing else to choose on
    assert select([rate, other], scored, "unknown").series == ("rate", "other")
    assert calibrate([rate, other], scored, "extrap+law").held_out == 2
