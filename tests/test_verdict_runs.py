"""Verdicts on real launches: the same sweep run twice on the same host (an A/A pair) is never called
better or worse, at 1 repetition (no run-to-run interval) and at 3; a 30 % slower step, injected into
every measured step (DDLBENCH_INJECT_FAULT=slow:<s>), is called worse at the default repetitions.
The runs are real local launches (one process, gloo), stored in a real results database and compared by
`ddlbench compare`, as a user would. The sides' launches alternate, so a slow spell of the host lands on
both. The A/A pair runs 30 steps per launch (as the issue asks); the slowdown pair runs longer windows
(SLOWDOWN_STEPS), which average over the host's spells of neighbour load, and demands its verdict only
on a host steady enough to give one (QUIET_SPREAD)."""

from __future__ import annotations

import json
import os
import statistics

import pytest
import yaml

from ddlbench.cli import main
from ddlbench.config import load_sweep_config
from ddlbench.history.db import list_runs
from ddlbench.launch.runner import run_point
from ddlbench.records import read_record, record_path
from ddlbench.sweep import expand_sweep

# timed launches judged against each other: alone on the machine (make test runs these after the parallel part)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS = 30  # measured steps per launch, as the A/A pair used
# Measured steps per launch of the slowdown pair. On these hosts a launch's throughput moves with its
# neighbours' load in spells of 0.1 s to several seconds (resnet8's median step 24 ms in one launch, 39 ms
# in the next; a matmul loop pinned to one core swings 21 ↔ 27 ms in the same spells). A 30-step window
# (about 1 s) lands inside one spell, so launches of one side spread up to ×1.6 and 3 + 3 launches cannot
# resolve 30 % (measured here: A/A ×1.29 [0.73, 2.28]). A 150-step window (about 5 s) averages over the
# spells; the unit of the verdict is still the launch.
SLOWDOWN_STEPS = 150
# The slowdown's verdict needs a steady host: each side's 3 launches within ×1.2 of each other. This
# 2-core VM's neighbours make even 150-step launches spread ×1.26 at times with nothing else running here;
# Welch's t at 3 + 3 launches then cannot resolve 30 % (nor should it). The pair is measured again, up to
# QUIET_ATTEMPTS times in all; if the host is still that noisy, the test asserts only what no noise excuses
# (the slow run is not called better, and its ratio is below 1) and skips the demand for a verdict, saying
# why. The check reads the spread within each side, never the difference between the sides nor the verdict,
# so the retry cannot pick a favourable ratio. Both sides: a CI run (2026-12-04) had the base side steady
# (×1.15) and the slow side not (×1.48 by median step), and got "same within noise" at ×0.81 [0.55, 1.20].
QUIET_SPREAD = 1.2
QUIET_ATTEMPTS = 3
AA_FLOOR = 0.001  # an A/A pair's p below this would be certainty from noise: it fails 1 run in 1,000


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
    into `db`; {name: run id}. A sweep named in `slow` sleeps that many seconds in every measured step."""
    plans = {name: plan_sweep(tmp_path, name, reps, steps) for name, reps in sweeps.items()}
    for round_ in range(max(sweeps.values())):
        for name, (_, plan) in plans.items():
            if round_ >= len(plan.points):
                continue
            point = plan.points[round_]
            with monkeypatch.context() as patch:
                if slow and name in slow:
                    patch.setenv("DDLBENCH_INJECT_FAULT", f"slow:{slow[name]:.6f}")
                record = run_point(point, out=record_path(plan.config.sweep_dir, point.point_id), launcher="local")
            assert record.status == "ok", record.reason
    ids = {}
    for name, (path, _) in plans.items():
        assert main(["-q", "report", "--configfile", str(path), "--history", str(db)]) == 0
        ids[name] = max(run.id for run in list_runs(db=db))
    return ids


def compare(db, a: int, b: int, capsys) -> dict:
    capsys.readouterr()
    assert main(["-q", "compare", str(a), str(b), "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["figures"]
    (row,) = [r for r in rows if r["name"].endswith("/samples_per_s")]
    return row


def launch_spread(tmp_path, name: str) -> float:
    """Fastest ÷ slowest launch of a side (window throughput): how busy the host was while it ran."""
    values = [read_record(p).metrics.samples_per_s_overall for p in (tmp_path / name).rglob("record.json")]
    return max(values) / min(values)


def median_step_s(tmp_path, name: str) -> float:
    records = [read_record(p) for p in (tmp_path / name).rglob("record.json")]
    return statistics.median(r.metrics.step_time_s.median for r in records)


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

    # a base and B' at the default repetitions, B' with every measured step 30 % longer (a sleep inside
    # the step), interleaved, over windows long enough to average the host's spells (SLOWDOWN_STEPS)
    slow_s = 0.3 * median_step_s(tmp_path, "a")
    for attempt in range(QUIET_ATTEMPTS):  # a busy spell gets another try (QUIET_SPREAD)
        base, slow = f"base{attempt or ''}", f"slow{attempt or ''}"
        pair = run_sweeps(tmp_path, {base: reps, slow: reps}, db, monkeypatch, {slow: slow_s}, SLOWDOWN_STEPS)
        spread = max(launch_spread(tmp_path, base), launch_spread(tmp_path, slow))  # the noisier side's
        if spread <= QUIET_SPREAD:
            break
    row = compare(db, pair[base], pair[slow], capsys)
    with capsys.disabled():  # shown with -s, not swallowed by the next compare
        print("30 % slower:", {k: row.get(k) for k in ("change", "ratio", "ratio_ci", "p", "verdict")}, end=" ")
        print(f"(the noisier side's launches spread ×{spread:.3f}, attempt {attempt + 1})")
    assert row["verdict"] != "better" and row["ratio"] < 1, row  # what no host's noise excuses
    if spread > QUIET_SPREAD:  # a skip, counted: DDLBENCH_REQUIRE_QUIET=1 (CI) makes it a failure
        why = (
            f"the host's launches spread ×{spread:.2f} (over ×{QUIET_SPREAD}) {QUIET_ATTEMPTS} times: too noisy to "
            f"demand a verdict on 30 % at {reps} launches (it gave: {row['verdict']}, ×{row['ratio']:.3g})"
        )
        if os.environ.get("DDLBENCH_REQUIRE_QUIET") == "1":
            pytest.fail(f"DDLBENCH_REQUIRE_QUIET=1 but {why}")
        pytest.skip(why)
    assert row["verdict"] == "worse", row
    # about throughput ÷ 1.3: the sleep is 30 % of a step timed earlier, and a busy spell lengthens the rest
    assert 1 / 1.3 * 0.6 < row["ratio"] < 1 / 1.3 * 1.2
    # certify: the slow run, judged against the base's certificate, is a regression (what compare said)
    check_certify(tmp_path, base, slow, regression=row["name"])


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
