"""The adaptive sweep, for real: Snakemake's checkpoint loop measures short runs round by round, each
round choosing where the model's band is widest per node-second, until it stops; the summary's cost is
the records' own."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import yaml

from ddlbench.config import sweep_config_from_mapping
from ddlbench.errors import ConfigError
from ddlbench.point import Point
from ddlbench.records import read_record
from ddlbench.sampling.plan import plan_round
from ddlbench.sampling.settings import AdaptiveSettings
from ddlbench.sweep import expand_sweep
from tests.conftest import run_snakemake

SWEEP = {
    "models": ["resnet8"],
    "datasets": ["cifar10"],
    "strategies": ["ddp"],
    "nodes": [1],
    "batch_size": [4, 8, 16],
    "warmup_steps": 3,
    "steps": 30,
    "repetitions": 3,
    "timeout_s": 120,
    "adaptive": {
        "over": "batch_size",
        "initial": 2,
        "max_rounds": 3,
        "target_band": 0.001,
        "steps": 2,
        "warmup_steps": 1,
    },
}


@pytest.fixture(scope="module")
def adaptive(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adaptive")
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "ad", "results_dir": str(folder / "results")} | SWEEP))
    ran = run_snakemake("-s", "workflow/adaptive.smk", "--cores", "2", "--configfile", str(path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    return path, folder / "results" / "ad" / "adaptive"


@pytest.mark.slow
def test_each_round_measures_where_the_band_is_widest_per_node_second(adaptive):
    _, folder = adaptive
    rounds = [json.loads(p.read_text()) for p in sorted((folder / "rounds").glob("*.json"), key=lambda p: int(p.stem))]
    assert [r["round"] for r in rounds] == list(range(len(rounds))) and rounds[-1]["stop"]
    assert not any(r["stop"] for r in rounds[:-1])
    # round 0: both ends of the series, each as a short run (2 steps after 1 warm-up, one repetition)
    assert [c["batch_size"] for c in rounds[0]["configurations"]] == [4, 16]
    assert all((p["steps"], p["warmup_steps"], p["repetition"]) == (2, 1, 0) for p in rounds[0]["points"])
    measured = {4, 16}
    for entry in rounds[1:-1]:
        (config,) = entry["configurations"]
        open_ = [c for c in entry["candidates"] if c["half_width"] is None or c["half_width"] > 0.001]
        assert {c["batch_size"] for c in entry["candidates"]} == {4, 8, 16} - measured
        best = max(open_, key=lambda c: float("inf") if c["score"] is None else c["score"])
        assert config["batch_size"] == best["batch_size"]
        measured.add(config["batch_size"])
    assert rounds[-1]["why"] in ("every candidate measured", "2 rounds run")
    # exactly the chosen points were measured
    chosen = {Point.from_dict(p).point_id for r in rounds for p in r["points"]}
    assert {p.name for p in (folder / "points").iterdir()} == chosen


@pytest.mark.slow
def test_the_summary_costs_what_the_records_took(adaptive):
    _, folder = adaptive
    summary = json.loads((folder / "sampling.json").read_text())
    records = [read_record(p / "record.json") for p in (folder / "points").iterdir()]
    took = sum(
        r.point.nodes
        * (
            datetime.fromisoformat(r.provenance.end_time) - datetime.fromisoformat(r.provenance.start_time)
        ).total_seconds()
        for r in records
    )
    assert summary["measured_points"] == len(records) and summary["measured_node_s"] == pytest.approx(took)
    assert summary["full_sweep_points"] == 9  # 3 batches × 3 repetitions, each of 3 + 30 steps
    assert 0 < summary["saved_estimated"] < 1
    (model,) = summary["models"]
    assert model["figure"] == "step_time_s" and [p["x"][0] for p in model["predictions"]] == [4, 8, 16]


@pytest.mark.slow
def test_a_spent_budget_stops_the_next_round(adaptive):
    path, folder = adaptive
    plan = expand_sweep(sweep_config_from_mapping(yaml.safe_load(path.read_text())))
    records = [read_record(p / "record.json") for p in (folder / "points").iterdir()]
    settings = AdaptiveSettings(over="batch_size", initial=2, budget_node_s=1.0, target_band=0.001)
    entry = plan_round(1, plan.points, records[:2], settings)
    assert entry["stop"] and entry["why"].startswith("budget:") and entry["points"] == []


@pytest.mark.slow
def test_the_adaptive_workflow_lints_clean(adaptive):
    path, _ = adaptive
    lint = run_snakemake("-s", "workflow/adaptive.smk", "--lint", "--cores", "2", "--configfile", str(path))
    assert lint.returncode == 0 and "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"over": "colour"}, "adaptive.over"),
        ({"target_band": 2}, "adaptive.target_band"),
        ({"steps": 0}, "adaptive.steps"),
        ({"budget": 5}, "adaptive.budget"),
    ],
)
def test_bad_adaptive_settings_are_refused_by_key(settings, key):
    raw = {"name": "x", "results_dir": "/tmp/x"} | {k: v for k, v in SWEEP.items() if k != "adaptive"}
    with pytest.raises(ConfigError, match=key):
        sweep_config_from_mapping(raw | {"adaptive": settings})
