"""Scaling models of a real sweep: Snakemake runs the points, the report rule models them (ddlbench.finish)
and the report draws them; `ddlbench fit` answers from the same records, and the cheapest configuration
follows from them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ddlbench.analysis.keys import point_of_row
from tests.conftest import run_cli, run_snakemake
from tests.report_data import between

pytestmark = pytest.mark.slow

SWEEP = {
    "models": ["resnet8"],
    "datasets": ["cifar10"],
    "strategies": ["ddp"],
    "nodes": [1, 2],
    "batch_size": [8],
    "warmup_steps": 1,
    "steps": 3,
    "repetitions": 2,
    "timeout_s": 120,
    "scaling": {"at": {"nodes": [4]}, "price_per_node_hour": 2.5},
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scaling")
    path = folder / "sweep.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"name": "scaling", "results_dir": str(folder / "results")} | SWEEP))
    ran = run_snakemake("--cores", "2", "--configfile", str(path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    return path, folder / "results" / "scaling"


def test_the_workflow_models_every_figure_and_the_report_draws_them(swept):
    _, sweep_dir = swept
    table = pd.read_parquet(sweep_dir / "table.parquet")
    ok = table[table["status"] == "ok"]
    models = {m["figure"]: m for m in json.loads((sweep_dir / "models.json").read_text())["models"]}
    assert set(models) == {
        "step_time_s", "samples_per_s", "speedup", "efficiency", "cost_node_h_per_epoch", "cost_per_epoch"
    }  # fmt: skip
    rate = models["samples_per_s"]
    # the measured points are the records' window throughputs, every repetition kept
    for point in rate["measured"]:
        reps = ok[ok["nodes"] == point["x"][0]]["samples_per_s_overall"]
        assert point["n"] == len(reps) == 2 and point["median"] == pytest.approx(float(np.median(reps)))
    assert rate["observations"] == 4 and rate["points"] == 2
    # step time is B/R of the same repetitions; cost is nodes · 50000 samples / R / 3600, priced at 2.5
    step = {p["x"][0]: p["median"] for p in models["step_time_s"]["measured"]}
    node_h = {p["x"][0]: p["median"] for p in models["cost_node_h_per_epoch"]["measured"]}
    for point in rate["measured"]:
        nodes = point["x"][0]
        reps = ok[ok["nodes"] == nodes]
        assert step[nodes] == pytest.approx(float(np.median(reps["global_batch_size"] / reps["samples_per_s_overall"])))
        assert node_h[nodes] == pytest.approx(float(np.median(nodes * 50_000 / reps["samples_per_s_overall"] / 3600)))
    priced = {p["x"][0]: p["median"] for p in models["cost_per_epoch"]["measured"]}
    assert all(priced[n] == pytest.approx(2.5 * node_h[n]) for n in node_h)
    # the prediction asked for (nodes=4) is an extrapolation, with a band around it (4 observations, 2
    # coefficients: 2 degrees of freedom left for s²); Amdahl's band is open above where its denominator's
    # band reaches 0, which 2 degrees of freedom (t = 4.30) allow
    (four,) = rate["predictions"]
    assert four["x"] == [4.0] and four["beyond"] == pytest.approx(2.0)
    assert four["low"] < four["value"] and (four["high"] is None or four["value"] < four["high"])
    html = (sweep_dir / "report.html").read_text()
    section = between(html, "<h3>Scaling models</h3>", "</section>")  # in its model × dataset's section
    assert section.count("<svg") == 2  # samples/s and efficiency of the one series
    assert rate["formula"] in section.replace("&#39;", "'")


def test_fit_on_the_records_matches_the_workflow_and_refuses_what_it_cannot_model(swept):
    path, sweep_dir = swept
    done = run_cli(
        "fit", "--configfile", str(path), "--format", "json", "--figure", "samples_per_s", "--extrapolate-to", "nodes=4"
    )
    assert done.returncode == 0, done.stderr
    (model,) = json.loads(done.stdout)["models"]
    workflow = next(
        m for m in json.loads((sweep_dir / "models.json").read_text())["models"] if m["figure"] == "samples_per_s"
    )
    assert model["formula"] == workflow["formula"] and model["predictions"] == workflow["predictions"]
    refused = run_cli("fit", "--configfile", str(path), "--over", "threads")
    assert refused.returncode == 2 and "no series over threads with 2 or more measured points" in refused.stderr
    refused = run_cli("fit", "--configfile", str(path), "--over", "colour")
    assert refused.returncode == 2 and "cannot model over 'colour'" in refused.stderr


def test_the_cheapest_configuration_meets_the_target_at_the_least_node_hours(swept):
    path, sweep_dir = swept
    table = pd.read_parquet(sweep_dir / "table.parquet")
    best = table[table["status"] == "ok"].groupby("nodes")["samples_per_s_overall"].median()
    target = 0.9 * float(best.min())  # every measured scale meets it: the fewest nodes per sample wins
    done = run_cli(
        "fit", "--configfile", str(path), "--cheapest", "--target", f"samples_per_s>={target}", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    cheapest = answer["cheapest"]
    assert all(c["value"] >= target for c in answer["choices"])
    assert cheapest["cost"] == min(c["cost"] for c in answer["choices"])
    assert cheapest["cost_node_h_per_epoch"] == pytest.approx(cheapest["x"] * 50_000 / cheapest["samples_per_s"] / 3600)
    # two launches of each configuration: the band is run-to-run, and the step's work is Point's global batch
    assert answer["band"] == "" and all(
        c["band"] == "95 % prediction interval over launches" for c in answer["choices"]
    )
    measured = table.iloc[0].to_dict()
    step = run_cli("fit", "--configfile", str(path), "--cheapest", "--target", "step_time_s<=100", "--format", "json")
    choices = json.loads(step.stdout)["choices"]
    assert {c["x"] for c in choices} == {1.0, 2.0, 4.0}  # measured, and the sweep's scaling.at
    for choice in choices:
        batch = point_of_row(measured, nodes=int(choice["x"])).global_batch_size  # 8 per rank, 1 rank per node
        assert choice["global_batch_size"] == batch
        assert choice["value"] == pytest.approx(batch / choice["samples_per_s"])
    # the first launch of each alone: no run-to-run band, so nothing is claimed surely, and the output says why
    once = sweep_dir.parent / "once.parquet"
    table[table["repetition"] == 0].to_parquet(once)
    single = run_cli("fit", "--table", str(once), "--cheapest", "--target", f"samples_per_s>={target}")
    assert single.returncode == 0, single.stderr
    assert "one launch per configuration: no run-to-run band" in single.stdout
    assert "across its band" not in single.stdout
    unreachable = run_cli("fit", "--configfile", str(path), "--cheapest", "--target", "samples_per_s>=1e12")
    assert unreachable.returncode == 1 and "no candidate meets the target" in unreachable.stdout
    bad = run_cli("fit", "--configfile", str(path), "--cheapest", "--target", "speed>5")
    assert bad.returncode == 2 and "samples_per_s>=N" in bad.stderr
