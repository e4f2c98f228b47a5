"""Verdicts on real launches: the same sweep run twice on the same host (an A/A pair) is never called
better or worse, at 1 repetition (no run-to-run interval) and at 3; a 30 % slowdown, injected into every
measured step (DDLBENCH_INJECT_FAULT=slower:0.3: each step holds its core busy for 0.3 × its own work), is
called worse at the default repetitions wherever the launches' spread gives that many the power to, and at
as many more as it takes (up to MAX_LAUNCHES) where it does not.
The runs are real local launches (one process, gloo), stored in a real results database and compared by
`ddlbench compare`, as a user would. The sides' launches alternate, so a slow spell of the host lands on
both. The A/A pair runs 30 steps per launch (as the issue asks); the slowdown pair runs longer windows
(SLOWDOWN_STEPS)."""

from __future__ import annotations

import json
import math
import os

import pytest
import yaml

from ddlbench.analysis.verdicts import ALPHA, contrast, power
from ddlbench.cli import main
from ddlbench.config import load_sweep_config
from ddlbench.history.compare import launches
from ddlbench.history.db import list_runs
from ddlbench.launch.runner import run_point
from ddlbench.records import record_path
from ddlbench.statistics import student_t_quantile
from ddlbench.sweep import expand_sweep

# timed launches judged against each other: alone on the machine (make test runs these after the parallel part)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS = 30  # measured steps per launch, as the A/A pair used
# Measured steps per launch of the slowdown pair: a 30-step window (about 1 s) lands inside one spell of the
# host's neighbour load (resnet8's median step 24 ms in one launch, 39 ms in the next).
SLOWDOWN_STEPS = 150
SLOWDOWN = 0.3  # every measured step of the slow side (1 + SLOWDOWN) times as long as its work
# How many launches a side needs to resolve 30 % depends on the host. On these 2-core VMs a one-thread conv
# loop's throughput drifts with a 1/f-like spectrum (no steal time shown): its log standard deviation is 0.15
# over 3-s windows, 0.12 over 12-s and still 0.10 over 24-s ones (2026-12-06), and 150-step resnet8 launches
# spread ×1.4 (log sd 0.11, 8 launches). Welch's t at 3 + 3 launches with σ = 0.1 resolves 30 % about
# half the time; retrying until the launches happened to look quiet (the old check) was wrong 6-9 % of the
# time and still skipped 27-70 % in simulation. So the pair is measured at the default repetitions and, while
# the power of the verdict at the launches' measured spreads (verdicts.power, which reads the spreads only,
# never the sides' difference) is below POWER, one more launch a side is added, up to MAX_LAUNCHES. In
# simulation (lognormal launches, σ 0.08-0.15, heavy-tailed or not) this calls 30 % worse in ≥ 99 % of the
# runs it demands a verdict of. MAX_LAUNCHES bounds the launches a side: 12 reach POWER up to a launch log sd
# of 0.12-0.14, 20 up to 0.16-0.19 (Holm's family of 6 figures to 1). A CI host's spread needed more than 12
# (power 0.983 at 12 + 12, 2026-12-06); a launch pair adds about 20 s, and only where the host is that noisy.
POWER = 0.99
MAX_LAUNCHES = 20
AA_FLOOR = 0.001  # an A/A pair's p below this would be certainty from noise: it fails 1 run in 1,000
CHANCE_BAND = 0.999  # the slowdown's measured ratio must hold 1/1.3 within its 99.9 % interval


def default_repetitions() -> int:
    return int(yaml.safe_load(open("workflow/config/default.yaml"))["repetitions"])


def plan_sweep(tmp_path, name: str, repetitions: int, steps: int):
    """A one-configuration sweep of `repetitions` launches of `steps` measured steps: its file and points."""
    raw = {
        "name": "aa", "results_dir": str(tmp_path / name), "models": ["resnet8"], "datasets": ["cifar10"],
        "strategies": ["ddp"], "nodes": [1], "batch_size": [16], "warmup_steps": 3, "steps": steps,
        "repetitions": repetitions, "timeout_s": 120,
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, expand_sweep(load_sweep_config(path))


def run_sweeps(
    tmp_path, sweeps: dict[str, int], db, monkeypatch, slow: dict[str, float] | None = None, steps: int = STEPS
) -> dict:
    """Run the sweeps {name: repetitions} for real, their launches interleaved round by round (a_0, b_0,
    a_1, b_1, ...) so that a spell of other work on the host slows every side alike, then aggregate each
    into `db`; {name: run id}. A launch that already has its record (a sweep run before with fewer
    repetitions) is kept, not run again. A sweep named in `slow` makes every measured step that fraction
    longer (DDLBENCH_INJECT_FAULT=slower:<fraction>)."""
    plans = {name: plan_sweep(tmp_path, name, reps, steps) for name, reps in sweeps.items()}
    for round_ in range(max(sweeps.values())):
        for name, (_, plan) in plans.items():
            if round_ >= len(plan.points):
                continue
            point = plan.points[round_]
            out = record_path(plan.config.sweep_dir, point.point_id)
            if out.exists():
                continue
            with monkeypatch.context() as patch:
                if slow and name in slow:
                    patch.setenv("DDLBENCH_INJECT_FAULT", f"slower:{slow[name]}")
                record = run_point(point, out=out, launcher="local")
            assert record.status == "ok", record.reason
    ids = {}
    for name, (path, _) in plans.items():
        assert main(["-q", "report", "--configfile", str(path), "--history", str(db)]) == 0
        ids[name] = max(run.id for run in list_runs(db=db))
    return ids


def compare(db, a: int, b: int, capsys) -> dict:
    """`ddlbench compare a b`'s row of the configuration's throughput, with `family`: how many of the
    comparison's rows were tested (Holm's family)."""
    capsys.readouterr()
    assert main(["-q", "compare", str(a), str(b), "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["figures"]
    (row,) = [r for r in rows if r["name"].endswith("/samples_per_s")]
    return row | {"family": sum(r.get("p") is not None for r in rows)}


def resolving_power(db, a: int, b: int, capsys) -> float:
    """The power of compare's verdict to call a 30 % slowdown at these runs' launch counts and measured
    spreads, at the level Holm gives the smallest p of the family (its spreads read, never its difference)."""
    row = compare(db, a, b, capsys)
    chance = power(launches(row["a"]), launches(row["b"]), ratio=1 / (1 + SLOWDOWN), alpha=ALPHA / row["family"])
    assert chance is not None, row
    return chance


def test_an_aa_pair_is_never_called_different_and_a_thirty_percent_slowdown_is(tmp_path, monkeypatch, capsys):
    db = tmp_path / "history.sqlite"
    reps = default_repetitions()
    assert reps >= 3, "the default sweep must run the launches a verdict needs"
    # one launch each: no run-to-run interval, whatever the two medians
    ones = run_sweeps(tmp_path, {"one_a": 1, "one_b": 1}, db, monkeypatch)
    row = compare(db, ones["one_a"], ones["one_b"], capsys)
    assert row["verdict"] == "one launch: no run-to-run interval"
    # A/A at 3 launches of 30 steps, interleaved
    runs = run_sweeps(tmp_path, {"a": 3, "b": 3}, db, monkeypatch)
    row = compare(db, runs["a"], runs["b"], capsys)
    with capsys.disabled():  # shown with -s, not swallowed by the next compare
        print("A/A at 3 launches:", {k: row.get(k) for k in ("change", "ratio", "ratio_ci", "p", "verdict")})
    # an A/A pair is separated 5 % of the time by design (α): what none may show is certainty. p below
    # AA_FLOOR fails one run in a thousand; the procedure's rate itself is test_verdicts.py's, over draws
    assert row["launches"] == [3, 3] and row["p"] is not None and row["p"] >= AA_FLOOR, row
    # certify the A/A pair: A's own references (±30 %) pass it, and B (A again), judged against A's
    # certificate (the last passing one of the suite), is a regression exactly when compare says worse
    check_certify(tmp_path, "a", "b", regression=row["name"] if row["verdict"] == "worse" else None)

    # a base and B' at the default repetitions, B' with every measured step 30 % longer than its work,
    # interleaved; one more launch a side while the launches' spread leaves the verdict short of POWER
    per_side = reps
    pair = run_sweeps(tmp_path, {"base": reps, "slow": reps}, db, monkeypatch, {"slow": SLOWDOWN}, SLOWDOWN_STEPS)
    while (chance := resolving_power(db, pair["base"], pair["slow"], capsys)) < POWER and per_side < MAX_LAUNCHES:
        per_side += 1
        pair = run_sweeps(tmp_path, {"base": per_side, "slow": per_side}, db, monkeypatch, {"slow": SLOWDOWN},
                          SLOWDOWN_STEPS)  # fmt: skip
    row = compare(db, pair["base"], pair["slow"], capsys)
    with capsys.disabled():  # shown with -s, not swallowed by the next compare
        shown = ("change", "ratio", "ratio_ci", "p", "verdict", "launches")
        print("30 % slower:", {k: row.get(k) for k in shown}, end=" ")
        print(f"(power {chance:.4f} at the launches' spreads)")
    assert row["verdict"] != "better" and row["ratio"] < 1, row  # what no host's noise excuses
    if chance < POWER:  # a skip, counted: DDLBENCH_REQUIRE_QUIET=1 (CI) makes it a failure
        why = (
            f"the host's launches spread so that even {MAX_LAUNCHES} + {MAX_LAUNCHES} launches resolve 30 % with "
            f"power {chance:.3f} (< {POWER}) (it gave: {row['verdict']}, ×{row['ratio']:.3g})"
        )
        if os.environ.get("DDLBENCH_REQUIRE_QUIET") == "1":
            pytest.fail(f"DDLBENCH_REQUIRE_QUIET=1 but {why}")
        pytest.skip(why)
    assert row["verdict"] == "worse", row
    # the size: 1/1.3 within the ratio's 99.9 % interval (Welch's, from the same launches)
    measured = contrast(launches(row["a"]), launches(row["b"]))
    se = math.log(measured.ci_high / measured.ratio) / student_t_quantile(0.975, measured.dof)
    wide = student_t_quantile(1 - (1 - CHANCE_BAND) / 2, measured.dof) * se
    assert abs(math.log(measured.ratio * (1 + SLOWDOWN))) < wide, (measured, wide)
    # certify: the slow run, judged against the base's certificate, is a regression (what compare said)
    check_certify(tmp_path, "base", "slow", regression=row["name"])


def check_certify(tmp_path, first: str, second: str, *, regression: str | None) -> None:
    """`first`'s own references (±30 %) pass it; `second`, judged against its certificate, shows exactly
    `regression` (or none)."""
    refs, certs = tmp_path / f"refs-{first}.yaml", tmp_path / f"certs-{first}.sqlite"
    assert certify(tmp_path, first, certs, "--write-references", str(refs), "--min-tolerance", "0.3")[0] == 1
    assert certify(tmp_path, first, certs, "--references", str(refs))[1]["passed"] is True
    _, judged = certify(tmp_path, second, certs, "--references", str(refs))
    assert judged["compared_with"], judged["notes"]
    assert [r["name"] for r in judged["regressions"]] == ([regression] if regression else []), judged


def certify(tmp_path, name: str, db, *args: str) -> tuple[int, dict]:
    """`ddlbench certify --from-records` on a sweep's records, as the suite 'aa' (every folder the same)."""
    out = tmp_path / f"certificate-{name}.json"
    folder = tmp_path / name / "aa"
    code = main(["-q", "certify", "--system", "here", "--partition", "local", "--from-records", str(folder),
                 "--json", str(out), "--db", str(db), *args])  # fmt: skip
    return code, json.loads(out.read_text()) if out.exists() else {}
