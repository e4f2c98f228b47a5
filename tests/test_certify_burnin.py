"""`ddlbench certify --level burn-in`: this node loaded for real in rounds for a given duration, each figure
judged at its worst (the 5th percentile, with its order-statistics interval), the replays of every round
compared bit for bit, health read, the certificate stored in the results database."""

from __future__ import annotations

import json

import pytest
import yaml

from ddlbench.certify.burnin import WORST_PERCENT, _worst_figure, replay_check_figures
from ddlbench.cli import main
from ddlbench.history.db import list_runs
from ddlbench.statistics import quantile_ci_ranks


def burn_in(tmp_path, refs: dict, duration: str = "3s") -> int:
    args = ["-q", "certify", "--level", "burn-in", "--duration", duration, "--system", "lab", "--partition", "cpu"]
    args += ["--json", str(tmp_path / "burn.json"), "--db", str(tmp_path / "h.sqlite")]
    (tmp_path / "refs.yaml").write_text(yaml.safe_dump({"systems": {"lab:cpu": refs}}))
    args += ["--references", str(tmp_path / "refs.yaml"), "--write-references", str(tmp_path / "proposed.yaml")]
    return main(args)


@pytest.mark.slow
def test_a_burn_in_loads_the_node_for_its_duration_and_judges_the_worst_runs(tmp_path, capsys):
    bands = {
        "burn-in/matmul_flop_per_s/fp32": {"min": 1e6, "unit": "FLOP/s"},
        "burn-in/memory_bandwidth_bytes_per_s": {"min": 1e18, "unit": "B/s"},  # beyond any machine: slow
    }
    assert burn_in(tmp_path, bands) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("ddlbench certify burn-in lab:cpu") and "slow: burn-in/memory_bandwidth_bytes_per_s" in line
    assert "health: not measurable here: no NVML" in line
    cert = json.loads((tmp_path / "burn.json").read_text())
    by_name = {entry["name"]: entry for entry in cert["figures"]}
    assert set(by_name) == {
        "burn-in/matmul_flop_per_s/fp32", "burn-in/memory_bandwidth_bytes_per_s", "burn-in/replay", "health/gpus"
    }  # fmt: skip
    matmul = by_name["burn-in/matmul_flop_per_s/fp32"]
    assert matmul["status"] == "pass" and "5th percentile of" in matmul["basis"]
    median = float(matmul["basis"].split("median ")[1].split(",")[0])
    assert matmul["value"] <= median  # the worst runs, not the typical one
    if matmul["n"] >= 59:  # enough runs for an interval of the 5th percentile
        assert matmul["ci_low"] <= matmul["value"] <= matmul["ci_high"]
    rounds = int(cert["notes"][0].split(" round")[0])
    replay = by_name["burn-in/replay"]
    assert replay["n"] == rounds and rounds >= 1 and replay["status"] == ("pass" if rounds > 1 else "no reference")
    assert by_name["health/gpus"]["status"] == "no reference"
    assert by_name["health/gpus"]["why_missing"].startswith("not measurable here: no NVML")
    runs = list_runs(db=tmp_path / "h.sqlite")
    assert [(run.kind, run.name, run.passed) for run in runs] == [("certificate", "burn-in", False)]
    # the references it proposes are burn-in figures (the checks judge themselves: none proposed)
    proposed = yaml.safe_load((tmp_path / "proposed.yaml").read_text())["systems"]["lab:cpu"]
    assert set(proposed) == {"burn-in/matmul_flop_per_s/fp32", "burn-in/memory_bandwidth_bytes_per_s"}


@pytest.mark.parametrize(
    ("duration", "words"),
    [(None, "needs one"), ("soon", "'soon' is not a positive duration"), ("-3m", "is not a positive"), ("0", "not a")],
)
def test_a_bad_duration_is_refused_in_one_line(tmp_path, capsys, duration, words):
    args = ["certify", "--level", "burn-in", "--system", "s", "--partition", "p", "--write-references", "x.yaml"]
    assert main(args + ([f"--duration={duration}"] if duration else [])) == 2
    err = capsys.readouterr().err
    assert "--duration" in err and words in err


def test_duration_belongs_to_burn_in_only(capsys):
    args = ["certify", "--level", "quick", "--duration", "3m", "--system", "s", "--partition", "p"]
    assert main([*args, "--write-references", "x.yaml"]) == 2
    assert "--duration: only with --level burn-in" in capsys.readouterr().err


def test_the_worst_figure_is_the_5th_percentile_with_its_order_statistics_interval():
    values = [float(v) for v in range(1, 201)]  # 200 runs: the 5th percentile at rank 0.05 × 199 = 9.95
    figure = _worst_figure("burn-in/x", values, "B/s", "a load", [100.0, 90.0], rounds=2)
    assert figure.value == pytest.approx(1 + 9.95) and WORST_PERCENT == 5
    j, k = quantile_ci_ranks(200, 0.05)
    assert (figure.ci_low, figure.ci_high) == (values[j - 1], values[k - 1]) and j < 11 < k
    assert "first round's median 100, last round's 90" in figure.basis


def test_a_device_whose_replay_changes_between_rounds_is_named_with_the_round():
    same = {"digest": "a", "repeatable": True}
    replays = [("cuda:0", r, same) for r in range(3)] + [("cuda:1", 0, same), ("cuda:1", 1, same | {"digest": "b"})]
    figures = {f.name: f for f in replay_check_figures(replays, devices={"cuda:0": "/cuda:0", "cuda:1": "/cuda:1"})}
    assert figures["burn-in/replay/cuda:0"].check == "pass"
    hot = figures["burn-in/replay/cuda:1"]
    assert (hot.check, hot.value, hot.finding) == ("failed", 1, "round 1: digest differs")
