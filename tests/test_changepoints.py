"""Change points over a history (ddlbench.history.changepoints): E-divisive's split with a permutation test,
found where a step was injected and not where none was, and printed by `ddlbench history --changes` and by
`certify` over a partition's certificates."""

from __future__ import annotations

import json
import math
import random

import pytest

from ddlbench.cli import main
from ddlbench.history.changepoints import MAX_PVALUE, change_points
from ddlbench.history.db import store_run


def noisy(rng: random.Random, level: float, n: int, cv: float = 0.03) -> list[float]:
    return [level * math.exp(rng.gauss(0, cv)) for _ in range(n)]


def test_an_injected_step_is_found_where_it_is_with_its_size_and_none_without():
    rng = random.Random(11)
    step = noisy(rng, 100, 8) + noisy(rng, 80, 7)  # 20 % down from run 8, launches 3 % apart
    (found,) = change_points(step)
    assert found.index == 8 and found.p_value < MAX_PVALUE and found.size == pytest.approx(-0.2, abs=0.03)
    assert change_points(noisy(rng, 100, 15)) == []
    # two steps, both found; a series too short to hold one segment each side finds nothing
    both = change_points(noisy(rng, 100, 6) + noisy(rng, 80, 6) + noisy(rng, 120, 6))
    assert [point.index for point in both] == [6, 12]
    assert change_points([100.0, 100.0, 100.0, 50.0, 50.0]) == []


def test_the_permutation_test_keeps_its_false_alarm_rate_on_series_without_a_change():
    """300 series of 12 runs without a change (CV 5 %): the share flagged stays near MAX_PVALUE (1 %), within
    three binomial standard deviations."""
    rng = random.Random(5)
    draws = 300
    flagged = sum(bool(change_points(noisy(rng, 100, 12, cv=0.05))) for _ in range(draws))
    assert flagged / draws <= MAX_PVALUE + 3 * math.sqrt(MAX_PVALUE * (1 - MAX_PVALUE) / draws)


def _store(db, values: list[float], *, name: str = "nightly", kind: str = "sweep") -> list[int]:
    ids = []
    for day, value in enumerate(values):
        run = {
            "kind": kind, "name": name, "system": "s", "partition": "p", "config_hash": "h",
            "date": f"2026-11-{day + 1:02d}T00:00:00Z", "ddlbench_version": "0", "measurement_version": 4,
            "git_commit": None, "passed": None, "source": "test",
        }  # fmt: skip
        figure = {"name": "train/x/samples_per_s", "unit": "samples/s", "kind": "throughput", "value": value,
                  "n": 3, "basis": "b", "node": None}  # fmt: skip
        ids.append(store_run(run, [figure], db=db)[0])
    return ids


def test_history_changes_names_the_run_since_which_a_figure_changed(tmp_path, capsys):
    rng = random.Random(2)
    db = tmp_path / "h.sqlite"
    ids = _store(db, noisy(rng, 100, 7) + noisy(rng, 75, 6))
    _store(db, noisy(rng, 50, 13), name="steady")  # another series in the same database: no change
    assert main(["-q", "history", "--changes", "--db", str(db), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["name"], row["since_run"], row["runs"]) == ("train/x/samples_per_s", ids[7], 13)
    assert row["series"] == "sweep nightly on s:p, measurement 4" and row["size"] == pytest.approx(-0.25, abs=0.04)
    assert main(["-q", "history", "--changes", "--db", str(db)]) == 0
    assert f"{ids[7]}" in capsys.readouterr().out
