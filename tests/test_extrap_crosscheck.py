"""ddlbench's reproduction of Extra-P's search (method "extrap") against the real Extra-P 4.2.5, run in an
environment of its own (envs/extrap.sh: Extra-P pins numpy < 2): the same hypothesis, coefficients,
cross-validated SMAPE and predictions on the same data, synthetic and public."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ddlbench.analysis.empirical.search import search_extrap
from tests.conftest import REPO

pytestmark = pytest.mark.slow

VENV = Path(os.environ.get("DDLBENCH_EXTRAP_VENV", REPO / ".venv-extrap"))
PUBLIC = sorted((REPO / "benchmarks" / "empirical" / "data").glob("*.csv"))


def _noisy(law, xs, reps=3, seed=1):
    rng = np.random.default_rng(seed)
    return [[float(law(*x) * (1 + 0.01 * rng.uniform(-1, 1))) for _ in range(reps)] for x in xs]


def _terms(fit):
    """Our selection as Extra-P writes it: {(parameter, poly, log), …} per term, with its coefficient."""
    return sorted(
        (tuple(sorted((fit.names[f.parameter], float(f.poly), float(f.log)) for f in term)), c)
        for c, term in zip(fit.coefficients[1:], fit.terms, strict=True)
    )


def _their_terms(reply):
    return sorted(
        (
            tuple(sorted((f["parameter"], f["exponent_poly"], f["exponent_log"]) for f in term["factors"])),
            term["coefficient"],
        )
        for term in reply["terms"]
    )


def _agree(fit, reply, predict_at=()):
    ours, theirs = _terms(fit), _their_terms(reply)
    assert [t for t, _ in ours] == [t for t, _ in theirs], (fit.formula(), reply["function"])
    # least squares of the same columns in another order: equal to rounding, relative to the data's scale
    assert [c for _, c in ours] == pytest.approx([c for _, c in theirs], rel=1e-6, abs=1e-9)
    assert fit.coefficients[0] == pytest.approx(
        reply["constant"], rel=1e-6, abs=1e-9 * max(1.0, abs(reply["constant"]))
    )
    if fit.terms and len(fit.names) == 1:  # one parameter: both report the leave-one-out SMAPE compared
        assert fit.cv_smape == pytest.approx(reply["smape"], rel=1e-6, abs=1e-9)
    if predict_at:
        assert list(fit.predict(np.asarray(predict_at, float))) == pytest.approx(reply["predictions"], rel=1e-6)


P = [[2.0], [4.0], [8.0], [16.0], [32.0], [64.0]]
GRID = [[p, b] for p in (2.0, 4.0, 8.0, 16.0, 32.0) for b in (16.0, 32.0, 64.0, 128.0, 256.0)]
ONE = {
    "p_log_p": lambda p: 3 + 0.5 * p * np.log2(p),
    "p^1.5": lambda p: 1 + 2 * p**1.5,
    "log^2": lambda p: 7 + 0.25 * np.log2(p) ** 2,
    "falling sqrt": lambda p: 40 - 3 * p**0.5,
    "constant": lambda p: 5.0,
}
TWO = {
    "p*b": lambda p, b: 1 + 0.01 * p * b,
    "log p + b": lambda p, b: 2 + 3 * np.log2(p) + 0.5 * b,
    "sqrt(p)*b": lambda p, b: 4 + 0.2 * p**0.5 * b,
}


def _public(path: Path) -> dict:
    """The benchmark's use: every scale but the two largest, predicted at those two."""
    data: dict[float, list[float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            data.setdefault(float(row["scale"]), []).append(float(row["value"]))
    scales = sorted(data)
    return {
        "parameters": ["p"],
        "points": [[s] for s in scales[:-2]],
        "values": [data[s] for s in scales[:-2]],
        "predict_at": [[s] for s in scales[-2:]],
    }


CASES = {
    **{
        f"one: {name}": {"parameters": ["p"], "points": P, "values": _noisy(law, P), "predict_at": [[128.0], [256.0]]}
        for name, law in ONE.items()
    },
    **{
        f"two: {name}": {
            "parameters": ["p", "b"],
            "points": GRID,
            "values": _noisy(law, GRID, reps=2, seed=3),
            "predict_at": [[64.0, 512.0]],
        }
        for name, law in TWO.items()
    },
    **{f"public: {path.stem}": _public(path) for path in PUBLIC},
}


@pytest.fixture(scope="module")
def extrap_replies():
    """Extra-P's selection for every case, from its own environment, in one process."""
    uv = REPO / ".venv" / "bin" / "uv"
    env = os.environ | ({"UV": str(uv)} if uv.exists() else {})
    built = subprocess.run(
        ["bash", str(REPO / "envs" / "extrap.sh"), str(VENV)], capture_output=True, text=True, env=env, timeout=900
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(REPO / "envs" / "extrap_driver.py")],
        input=json.dumps(list(CASES.values())),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(CASES, json.loads(done.stdout), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_the_selection_is_extra_ps(extrap_replies, name):
    case = CASES[name]
    fit = search_extrap(tuple(case["parameters"]), np.asarray(case["points"]), case["values"])
    _agree(fit, extrap_replies[name], case["predict_at"])
    assert all(isinstance(f.poly, Fraction) for term in fit.terms for f in term)
