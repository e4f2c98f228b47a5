"""The adaptive sweep, for real: Snakemake's checkpoint loop measures short runs round by round, several
per launch, each round choosing where the model's band is widest per node-second, until it stops; the
summary's cost is what the launches took, round 0's included; round 0 is bounded before it runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest
import yaml

from ddlbench.config import sweep_config_from_mapping
from ddlbench.config.adaptive import AdaptiveSettings
from ddlbench.errors import ConfigError
from ddlbench.launches import read_launch
from ddlbench.point import Point
from ddlbench.records import read_record
from ddlbench.sampling.costs import group_launches, launches_needed, round0_share_bound
from ddlbench.sampling.plan import plan_round, sampled
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
def test_the_summary_costs_what_the_launches_took_and_later_rounds_measured(adaptive):
    _, folder = adaptive
    summary = json.loads((folder / "sampling.json").read_text())
    rounds = [json.loads(p.read_text()) for p in sorted((folder / "rounds").glob("*.json"), key=lambda p: int(p.stem))]
    launches = [read_launch(p) for p in (folder / "launches").glob("*.json")]
    records = [read_record(p / "record.json") for p in (folder / "points").iterdir()]
    # every round's runs were measured in the launches it named: one launch per round here (one layout)
    assert sorted(launch.launch_id for launch in launches) == sorted(
        launch["id"] for entry in rounds for launch in entry["launches"]
    )
    for entry in rounds:
        for planned in entry["launches"]:
            launch = next(x for x in launches if x.launch_id == planned["id"])
            assert [span.point_id for span in launch.points] == planned["points"]
    assert {r.point_id for r in records} == {span.point_id for x in launches for span in x.points}
    assert summary["measured_launches"] == len(launches) == 2
    assert summary["measured_node_s"] == pytest.approx(sum(x.nodes * x.wall_s for x in launches))
    # round 0 chose two of three batch sizes; round 1 measured the third: the sweep adapted
    assert summary["rounds_measured_after_round_0"] == 1 and summary["measured_points"] == 3
    assert summary["launch_overhead_s"] > 0 and summary["point_overhead_s"] > 0
    assert summary["full_sweep_points"] == 9  # 3 batches × 3 repetitions, each of 3 + 30 steps
    assert 0 < summary["saved_estimated"] < 1
    assert summary["round0_share_bound"] == pytest.approx(2 / 9)  # its two points against the full sweep's nine
    for key in ("models", "models_extrap"):
        (model,) = summary[key]
        assert model["figure"] == "step_time_s" and [p["x"][0] for p in model["predictions"]] == [4, 8, 16]


@pytest.mark.slow
def test_a_spent_budget_stops_the_next_round(adaptive):
    path, folder = adaptive
    plan = expand_sweep(sweep_config_from_mapping(yaml.safe_load(path.read_text())))
    round0 = json.loads((folder / "rounds" / "0.json").read_text())
    records = [read_record(folder / "points" / Point.from_dict(p).point_id / "record.json") for p in round0["points"]]
    launches = [read_launch(folder / "launches" / f"{x['id']}.json") for x in round0["launches"]]
    spent = sum(x.node_s for x in launches)
    settings = AdaptiveSettings(over="batch_size", initial=2, budget_node_s=spent * 1.01, target_band=0.001)
    entry = plan_round(1, plan.points, records, settings, launches)
    assert entry["stop"] and entry["why"].startswith("budget:") and entry["points"] == []
    assert entry["spent_node_s"] == pytest.approx(spent)
    # with room for the third point (its priced cost and a launch's overhead), it is chosen
    roomy = dataclasses.replace(settings, budget_node_s=spent * 100)
    assert [c["batch_size"] for c in plan_round(1, plan.points, records, roomy, launches)["configurations"]] == [8]


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


def test_the_adaptive_key_names_the_figures_the_empirical_models_compute():
    # the config validates the key without importing the analysis; both lists must stay one
    from ddlbench.analysis.empirical.series import FIGURES
    from ddlbench.config.adaptive import MODELLED_FIGURES

    assert tuple(FIGURES) == MODELLED_FIGURES


def full_sweep(**changes):
    raw = {"name": "x", "results_dir": "/tmp/x"} | {k: v for k, v in SWEEP.items() if k != "adaptive"} | changes
    return expand_sweep(sweep_config_from_mapping(raw)).points


def test_round_0_is_refused_when_its_bound_exceeds_the_budget_share():
    points = full_sweep()
    settings = AdaptiveSettings(over="batch_size", initial=2, steps=2, warmup_steps=1, budget_share=0.2)
    # 1 launch, 2 points, 3 of 99 steps at a configuration, against 9 points of the full sweep: 2/9 > 0.2
    with pytest.raises(ConfigError, match=r"adaptive.budget_share.*0.222"):
        plan_round(0, points, [], settings, [])
    entry = plan_round(0, points, [], dataclasses.replace(settings, budget_share=0.25), [])
    assert entry["round0_share_bound"] == pytest.approx(2 / 9) and len(entry["points"]) == 2
    assert [len(x["points"]) for x in entry["launches"]] == [2]
    # one point per launch: two launches of two points make the launch ratio the larger: still 2/9
    alone = plan_round(0, points, [], dataclasses.replace(settings, budget_share=0.25, per_launch=1), [])
    assert [len(x["points"]) for x in alone["launches"]] == [1, 1]


@pytest.mark.parametrize(("seed", "sampled_steps"), [(0, 1), (1, 1), (2, 6), (3, 6), (4, 6)])
def test_round_0_never_costs_more_than_its_bound_whatever_the_costs(seed, sampled_steps):
    """For any non-negative launch, point and per-configuration step costs, round 0's cost over the full
    sweep's is at most the bound computed from the shapes alone (the mediant inequality); with 6 sampled
    steps the steps' ratio is the largest, with 1 the points'."""
    generator = random.Random(seed)
    points = full_sweep(batch_size=[4, 8, 16, 32], nodes=[1, 2], repetitions=2, steps=7, warmup_steps=1)
    settings = AdaptiveSettings(
        over="batch_size", initial=3, steps=sampled_steps, warmup_steps=1, repetitions=2, per_launch=4
    )
    chosen = [Point.from_dict(c) for c in plan_round(0, points, [], settings, [])["configurations"]]
    runs = [run for point in chosen for run in sampled(point, settings)]
    launches = group_launches(runs, settings.per_launch, 0)
    bound = round0_share_bound(points, runs, launches)
    nodes = {run.point_id: run.nodes for run in runs}
    for _ in range(200):
        launch_s, point_s = generator.choice([0, generator.random()]), generator.choice([0, generator.random()])
        step_s = {}
        for point in itertools.chain(points, runs):
            step_s.setdefault((point.batch_size, point.nodes), generator.random() * generator.choice([0, 1, 10]))

        def cost(run, launch_each, launch_s=launch_s, point_s=point_s, step_s=step_s):
            step = step_s[(run.batch_size, run.nodes)]
            return run.nodes * ((launch_s if launch_each else 0) + point_s + (run.warmup_steps + run.steps) * step)

        full = sum(cost(p, True) for p in points)
        round0 = sum(cost(r, False) for r in runs) + sum(nodes[x["points"][0]] * launch_s for x in launches)
        if full > 0:
            assert round0 / full <= bound + 1e-12


def test_no_launch_holds_two_repetitions_of_one_configuration():
    """Repetitions that share a launch are not independent samples: each configuration's repetitions go to
    launches of their own, so the step-time model's bands count launches."""
    points = full_sweep(batch_size=[4, 8, 16], nodes=[1], repetitions=1)
    settings = AdaptiveSettings(over="batch_size", initial=3, steps=2, warmup_steps=1, repetitions=2, per_launch=4)
    runs = [run for point in points for run in sampled(point, settings)]
    launches = group_launches(runs, settings.per_launch, 0)
    by_id = {run.point_id: run for run in runs}
    for launch in launches:
        configurations = [dataclasses.replace(by_id[i], repetition=0) for i in launch["points"]]
        assert len(set(configurations)) == len(configurations) <= settings.per_launch
    assert sorted(len(launch["points"]) for launch in launches) == [3, 3]  # 6 runs, 2 launches, not 4 + 2
    assert sorted(i for launch in launches for i in launch["points"]) == sorted(by_id)
    assert launches_needed(6, 2, 4) == 2 and launches_needed(2, 2, 4) == 2 and launches_needed(0, 2, 4) == 0
    assert len(group_launches(runs, 1, 0)) == 6
