"""ddlbench's reproduction of Extra-P's search (method "extrap") against the real Extra-P 4.2.5, run in an
environment of its own (envs/extrap.sh: Extra-P pins numpy < 2): the same hypothesis, coefficients,
cross-validated SMAPE and predictions on the same data, synthetic and public."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ddlbench.analysis.empirical.search import search_extrap
from tests.conftest import REPO

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


# envs/extrap.sh's exit status when the environment cannot be built on this machine (no CPython 3.11 or
# 3.12, no package index): the cross-check skips with the reason, unless DDLBENCH_REQUIRE_EXTRAP=1 (CI)
UNAVAILABLE = 3


def build_extrap(venv: Path, env: dict[str, str]) -> str | None:
    """Build Extra-P's environment in `venv` (or find it built); None when it is ready, else why it
    cannot be built here. Any other failure of envs/extrap.sh fails the test."""
    uv = REPO / ".venv" / "bin" / "uv"
    env = ({"UV": str(uv)} if uv.exists() else {}) | env
    built = subprocess.run(
        ["bash", str(REPO / "envs" / "extrap.sh"), str(venv)], capture_output=True, text=True, env=env, timeout=900
    )
    if built.returncode == UNAVAILABLE:
        said = [line.strip() for line in built.stderr.splitlines() if "unavailable:" in line or "error" in line]
        return "; ".join(said)[-500:] or f"envs/extrap.sh exited {UNAVAILABLE}"
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return None


def require_extrap(venv: Path, env: dict[str, str]) -> None:
    """Skip the calling test where Extra-P's environment cannot be built, naming why; fail instead under
    DDLBENCH_REQUIRE_EXTRAP=1 (in `env`)."""
    why = build_extrap(venv, env)
    if why is None:
        return
    if env.get("DDLBENCH_REQUIRE_EXTRAP") == "1":
        pytest.fail(f"DDLBENCH_REQUIRE_EXTRAP=1 but the Extra-P environment cannot be built: {why}")
    pytest.skip(f"the Extra-P environment cannot be built here (envs/extrap.sh): {why}")


@pytest.fixture(scope="module")
def extrap_replies():
    """Extra-P's selection for every case, from its own environment, in one process."""
    require_extrap(VENV, dict(os.environ))
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(REPO / "envs" / "extrap_driver.py")],
        input=json.dumps(list(CASES.values())),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(CASES, json.loads(done.stdout), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_selection_is_extra_ps(extrap_replies, name):
    case = CASES[name]
    fit = search_extrap(tuple(case["parameters"]), np.asarray(case["points"]), case["values"])
    _agree(fit, extrap_replies[name], case["predict_at"])
    assert all(isinstance(f.poly, Fraction) for term in fit.terms for f in term)


# --- where Extra-P's environment cannot be built ---------------------------------------------------


def _python_that_is_not_3_11(tmp_path: Path) -> Path:
    """An interpreter envs/extrap.sh must refuse (it answers no version check), as Python 3.13 would be."""
    fake = tmp_path / "python3.13"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return fake


def test_an_unsupported_python_skips_the_cross_check_with_the_reason(tmp_path):
    fake = _python_that_is_not_3_11(tmp_path)
    env = os.environ | {"EXTRAP_PYTHON": str(fake)}
    env.pop("DDLBENCH_REQUIRE_EXTRAP", None)
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"EXTRAP_PYTHON={fake} is not a CPython 3.11 or 3.12")):
        require_extrap(tmp_path / "venv", env)
    with pytest.raises(pytest.fail.Exception, match=r"DDLBENCH_REQUIRE_EXTRAP=1 but .* is not a CPython 3\.11"):
        require_extrap(tmp_path / "venv", env | {"DDLBENCH_REQUIRE_EXTRAP": "1"})
    assert not (tmp_path / "venv").exists()  # refused before anything was made


@pytest.mark.skipif(sys.version_info[:2] not in ((3, 11), (3, 12)), reason="needs a CPython 3.11 or 3.12 to start")
def test_an_unreachable_package_index_skips_the_cross_check_with_the_reason(tmp_path):
    """A usable interpreter, but no index to install from (a closed local port, an empty cache): the
    installer fails and the test skips naming the install and the index."""
    nowhere = "http://127.0.0.1:9/simple"
    env = {k: v for k, v in os.environ.items() if "INDEX" not in k and "FIND_LINKS" not in k}
    env |= {
        "EXTRAP_PYTHON": sys.executable,
        "UV_DEFAULT_INDEX": nowhere,
        "UV_INDEX_URL": nowhere,
        "UV_NO_CONFIG": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_HTTP_RETRIES": "0",
        "PIP_INDEX_URL": nowhere,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
    }
    env.pop("DDLBENCH_REQUIRE_EXTRAP", None)
    reachable = re.escape("installing extrap==4.2.5 failed (is a package index reachable?)")
    with pytest.raises(pytest.skip.Exception, match=reachable):
        require_extrap(tmp_path / "venv", env)
