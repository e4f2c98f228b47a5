"""The empirical searches' vectorised paths (issue 30: a study's thousands of series fitted in seconds)
against the per-hypothesis, per-fold references they replace: the same hypothesis chosen, the same
leave-one-out predictions, the same models over forked workers as in one process.

The references below are written out as the searches were before vectorising: one
numpy.linalg.lstsq per fit and per fold, one fit_hypothesis per building block."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlbench.analysis.empirical import search
from ddlbench.analysis.empirical.combine import fold_predictions
from ddlbench.analysis.empirical.laws import amdahl, amdahl_fold_predictions
from ddlbench.analysis.empirical.regression import fit_hypothesis, lstsq, smape
from ddlbench.analysis.empirical.series import Series
from ddlbench.analysis.empirical.sweep_models import model_all
from ddlbench.analysis.empirical.terms import extrap_building_blocks
from ddlbench.parallel import map_forked

SCALES = (
    np.array([1.0, 2, 4, 8, 16]),
    np.array([2.0, 4, 8, 16, 32, 64]),
    np.array([0.25, 0.5, 1, 2]),  # below 1: no log terms
    np.array([1.0, 3, 9]),
)


def random_series(rng: np.random.Generator, scales: np.ndarray) -> list[list[float]]:
    """Repetitions (1 to 5 a point) of a noisy law drawn at random: a power, a log, a saturation, a constant."""
    kind = rng.integers(4)
    a, b = rng.uniform(1, 100), rng.uniform(0.1, 10)
    law = {
        0: a + b * scales ** rng.uniform(0.2, 2.5),
        1: a + b * np.log2(np.maximum(scales, 1)) ** rng.integers(1, 3),
        2: scales / (a / 100 + b / 100 * scales),
        3: np.full_like(scales, a),
    }[int(kind)]
    noise = rng.choice([0.0, 0.01, 0.1])
    return [list(v * (1 + noise * rng.standard_normal(rng.integers(1, 6)))) for v in law]


def reference_loo_smape(terms, x: np.ndarray, means: np.ndarray) -> float | None:
    rows = search.design(terms, x)
    predicted = np.empty(len(means))
    for k in range(len(means)):
        keep = np.arange(len(means)) != k
        coefficients, *_ = np.linalg.lstsq(rows[keep], means[keep], rcond=None)
        smallest = float(np.min(means[keep]))
        if abs(coefficients[0]) < search.MIN_TERM_SHARE * (abs(smallest) if smallest != 0 else 1.0):
            coefficients[0] = 0.0
        predicted[k] = rows[k] @ coefficients
    return smape(predicted, means) if np.all(np.isfinite(predicted)) else None


def reference_search_single(x: np.ndarray, values: list[list[float]]):
    """Extra-P's single-parameter search, one hypothesis after another (search.py's docstring)."""
    rows = x.reshape(-1, 1)
    means = np.array([float(np.mean(v)) for v in values])
    best = fit_hypothesis(("p",), (), rows, values)
    best_score = best.smape
    if best.rss == 0:
        return best.terms, None
    for block in extrap_building_blocks(0, logs=bool(np.all(x >= 1))):
        terms = ((block,),)
        full = fit_hypothesis(("p",), terms, rows, values)
        if not search._contributes(full, rows, means):
            continue
        score = reference_loo_smape(terms, rows, means)
        if score is None or not score < best_score:
            continue
        best, best_score = full, score
    return best.terms, (best_score if best.terms else None)


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_lstsq_solves_each_stacked_system_as_numpy_lstsq_solves_it_alone():
    rng = np.random.default_rng(0)
    stacks = rng.standard_normal((7, 6, 3))
    stacks[2, :, 2] = stacks[2, :, 1]  # rank-deficient: lstsq's minimum-norm solution
    right = rng.standard_normal((7, 6))
    solved = lstsq(stacks, right)
    for a, b, c in zip(stacks, right, solved, strict=True):
        expected, *_ = np.linalg.lstsq(a, b, rcond=None)
        np.testing.assert_allclose(c, expected, rtol=1e-10, atol=1e-12)


def test_the_vectorised_extrap_search_chooses_as_the_one_by_one_search():
    """The same hypothesis, or one the reference scores the same to rounding (a tie, which the order of
    floating-point operations breaks either way: 3 points at 1, 3, 9 make p and log2(p)^2 tie exactly)."""
    rng = np.random.default_rng(1)
    chosen_terms, ties = set(), 0
    for trial in range(240):
        x = SCALES[trial % len(SCALES)]
        values = random_series(rng, x)
        terms, score = reference_search_single(x, values)
        fit = search.search_single("p", x, values)
        assert close(fit.cv_smape, score), (fit.cv_smape, score)
        if fit.terms != terms:
            means = np.array([float(np.mean(v)) for v in values])
            theirs = reference_loo_smape(fit.terms, x[:, None], means)
            assert math.isclose(theirs, score, rel_tol=1e-9, abs_tol=1e-12), (x, values, fit.terms, terms)
            ties += 1
        chosen_terms.add(fit.terms)
    assert len(chosen_terms) > 5  # the draws exercise many hypotheses, the constant among them
    assert () in chosen_terms
    assert ties <= 5


@pytest.mark.parametrize("per_device", [False, True])
def test_the_fold_predictions_are_those_of_refitting_without_each_point(per_device):
    rng = np.random.default_rng(2)
    for trial in range(60):
        x = SCALES[trial % len(SCALES)]
        values = random_series(rng, x)
        rows = x[:, None]
        fast = search.single_fold_predictions(rows, values)
        slow = fold_predictions(lambda xs, vs: search.search_extrap(("p",), xs, vs))(rows, values)
        np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12)

        fast = amdahl_fold_predictions(rows, values, per_device=per_device)
        slow = fold_predictions(lambda xs, vs: amdahl(("p",), xs, vs, per_device=per_device))(rows, values)
        np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-12, equal_nan=True)


def test_amdahls_leave_one_out_is_that_of_refitting_each_fold():
    rng = np.random.default_rng(3)
    for trial in range(40):
        x = SCALES[trial % 2][:, None]
        values = random_series(rng, x[:, 0])
        fit = amdahl(("p",), x, values)
        means = np.array([np.mean(v) for v in values])
        predicted = []
        for k in range(len(values)):
            keep = [i for i in range(len(values)) if i != k]
            again = fit_hypothesis(("p",), fit.terms, x[keep], [[means[i]] for i in keep], per_unit=0, inverse=True)
            predicted.append(again.predict(x[k : k + 1])[0])
        assert close(fit.cv_smape, smape(np.nan_to_num(predicted, nan=0.0), means))


def square(v: int) -> int:
    return v * v


def test_forked_workers_return_every_result_in_order():
    items = list(range(103))
    assert map_forked(square, items, least=1, workers=2) == [v * v for v in items]
    assert map_forked(square, items, least=1000) == [v * v for v in items]  # too few for a worker: here


def test_models_fitted_by_workers_are_those_fitted_in_one_process():
    rng = np.random.default_rng(4)
    series = []
    for i in range(12):
        x = SCALES[i % 2]
        figure = ("samples_per_s", "step_time_s", "efficiency")[i % 3]
        series.append(
            Series(
                figure=figure,
                parameters=("nodes",),
                label=f"s{i}",
                x=tuple((float(v),) for v in x),
                values=tuple(tuple(v) for v in random_series(rng, x)),
            )
        )
    one = model_all(series, method="ddlbench", at=[], workers=1)
    forked = model_all(series, method="ddlbench", at=[], workers=2)
    assert forked == one
    assert [m["label"] for m in one] == [f"s{i}" for i in range(12)]
