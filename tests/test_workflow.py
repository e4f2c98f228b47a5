"""The real Snakemake, end to end: a tiny sweep with one failing point runs through to the report."""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest

from ddlbench.config import REPO_CONFIGS, load_sweep_config
from ddlbench.sweep import expand_sweep
from tests.browser import Browser, find_chromium
from tests.conftest import REPO, job_counts, run_snakemake
from tests.report_data import between, tables

pytestmark = pytest.mark.slow

TINY = {
    "models": ["resnet8"],
    "datasets": ["cifar10"],
    "strategies": ["ddp"],
    "nodes": [1, 2],
    "batch_size": [8],
    "warmup_steps": 1,
    "steps": 2,
    "timeout_s": 120,
}


def test_sweep_with_a_failing_point_reaches_the_report(write_sweep, tmp_path):
    path = write_sweep(**TINY)
    plan = expand_sweep(load_sweep_config(path))
    failing = next(p for p in plan.points if p.nodes == 2)
    result = run_snakemake(
        "--cores", "2", "--configfile", str(path), env={"DDLBENCH_INJECT_FAULT": f"raise@{failing.point_id}"}
    )
    assert result.returncode == 0, result.stderr[-3000:]

    sweep_dir = tmp_path / "results" / "tiny"
    table = pd.read_parquet(sweep_dir / "table.parquet")
    assert sorted(table["point_id"]) == sorted(p.point_id for p in plan.points)  # one row per point
    by_status = table.set_index("point_id")["status"].to_dict()
    assert by_status[failing.point_id] == "failed"
    ok = table[table["status"] == "ok"].iloc[0]
    assert ok["samples_per_s_median"] > 0 and ok["steps"] == 2
    assert len(pd.read_csv(sweep_dir / "table.csv")) == len(table)

    html = (sweep_dir / "report.html").read_text()
    failed_section = between(html, "<h2>Failed points</h2>", "<h2>All points</h2>")
    assert failing.point_id in failed_section
    assert "InjectedFault: fault injected by DDLBENCH_INJECT_FAULT" in failed_section
    assert "| failed | InjectedFault | 1 |" in (sweep_dir / "report.md").read_text()  # the summary beside it
    section = between(html, '<section id="pair-1">', "</section>")
    assert "<h2>resnet8 on cifar10</h2>" in section
    # throughput alone: one node count ran (no speedup to draw), and one warm-up step probes no memory
    assert section.count('<svg class="chart"') == 1
    # and one drawing of a step of every rank, for the one configuration that ran
    drawings = section[section.index("<h3>One step, every rank</h3>") :]
    assert drawings.count("<svg") == 1
    # self-contained: nothing fetched; its only scripts are inline (the data and the page's own)
    assert "src=" not in html and 'href="http' not in html and html.count("<script") == 2
    opens_in_a_browser(sweep_dir / "report.html")

    again = run_snakemake("--cores", "2", "--configfile", str(path))
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr  # a failed point's record is data, not a rerun

    # deleting a record reruns that point and no other (then the table and the report)
    (sweep_dir / "points" / failing.point_id / "record.json").unlink()
    rerun = run_snakemake("--cores", "2", "--configfile", str(path))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert job_counts(rerun) == {"run_point": 1, "report": 1, "all": 1, "total": 3}
    table = pd.read_parquet(sweep_dir / "table.parquet")
    assert len(table) == len(plan.points)
    assert set(table["status"]) == {"ok"}
    # the same with the report gone too (the table stays): the missing record is still asked for by name
    other = next(p for p in plan.points if p.point_id != failing.point_id)
    (sweep_dir / "points" / other.point_id / "record.json").unlink()
    (sweep_dir / "report.html").unlink()
    rerun = run_snakemake("--cores", "2", "--configfile", str(path))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert job_counts(rerun) == {"run_point": 1, "report": 1, "all": 1, "total": 3}
    assert (sweep_dir / "points" / other.point_id / "record.json").exists()


def test_dry_run_and_lint_are_clean():
    dry = run_snakemake("-n", "--cores", "2")
    assert dry.returncode == 0, dry.stderr
    lint = run_snakemake("--lint", "--cores", "2")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_a_strategy_comparison_sweep_reaches_the_comparison_report(write_sweep, tmp_path):
    """The seeds sweep's shape, shrunk: data parallel against model and pipeline parallel, through
    the real Snakemake; the 1-node pipeline points are skipped at plan time, not failed at run time."""
    path = write_sweep(
        **TINY | {"strategies": ["ddp", "model_parallel", "gpipe", "1f1b"], "micro_batches": [2], "steps": 2}
    )
    plan = expand_sweep(load_sweep_config(path))
    assert sorted((p.strategy, p.nodes) for p in plan.points) == [
        ("1f1b", 2), ("ddp", 1), ("ddp", 2), ("gpipe", 2), ("model_parallel", 2)
    ]  # fmt: skip
    result = run_snakemake("--cores", "2", "--configfile", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir = tmp_path / "results" / "tiny"
    table = pd.read_parquet(sweep_dir / "table.parquet")
    assert set(table["status"]) == {"ok"}, table[["point_id", "reason"]].to_string()
    pipelines = table[table["strategy"].isin(["gpipe", "1f1b"])]
    assert set(pipelines["stages"]) == {2} and set(pipelines["micro_batches"]) == {2}
    html = (sweep_dir / "report.html").read_text()
    section = between(html, '<section id="pair-1">', "</section>")
    best = between(html, '<table class="sortable words" id="best">', "</table>")
    # like for like on one host: at 2 "nodes" the three model splits run 8 samples a step and meet; ddp runs
    # 16 and stands alone; one launch each, so no verdict
    two = "2 processes as nodes on one host"
    assert best.count(f"{two}, global batch 8") == 1 and best.count(f"{two}, global batch 16") == 1
    assert "only ddp ran at this scale" in best and "one launch: no run-to-run interval" in best
    assert set(tables(html)["configs"]["strategy"]) == {"ddp", "model_parallel", "gpipe", "1f1b"}
    for strategy in ("ddp", "model_parallel", "gpipe", "1f1b"):
        assert f"</span>{strategy}" in section  # a line in the charts' legend
    skipped = between(html, "<h2>Skipped combinations</h2>", "<h2>All points</h2>")
    assert skipped.count("needs at least 2") == 3  # model_parallel, gpipe and 1f1b on one rank


def test_the_seeds_sweep_plans_every_strategy_at_both_node_counts():
    from ddlbench.config import REPO_CONFIGS

    plan = expand_sweep(load_sweep_config(REPO_CONFIGS / "seeds.yaml"))
    # on one rank the model-splitting strategies cannot run: 3 strategies × 2 models
    assert len(plan.skipped) == 6 and all(p.world_size == 1 for p, _ in plan.skipped)
    assert {(p.model, p.strategy, p.nodes) for p in plan.points} == {
        (model, strategy, nodes)
        for model in ("resnet18", "vgg11")
        for strategy in ("ddp", "horovod", "model_parallel", "gpipe", "1f1b")
        for nodes in (1, 2)
    }


def test_shipped_sweeps_fit_the_default_cores():
    """`make run` grants CORES cores (the Makefile's default); no shipped sweep may need more per point."""
    cores = int(re.search(r"^CORES\s*\?=\s*(\d+)", (REPO / "Makefile").read_text(), re.M).group(1))
    for sweep in sorted(REPO_CONFIGS.glob("*.yaml")):
        for point in expand_sweep(load_sweep_config(sweep)).points:
            assert point.world_size * point.threads <= cores, f"{sweep.name}: {point.point_id} needs more than {cores}"


def opens_in_a_browser(report) -> None:
    """A real run's report in headless Chromium (tests/test_report_browser.py tests the page in depth):
    its charts are drawn, and it logs no error and asks for nothing. Without Chromium this part is left
    out, unless DDLBENCH_REQUIRE_CHROMIUM=1 (CI)."""
    binary = find_chromium()
    if binary is None:
        assert os.environ.get("DDLBENCH_REQUIRE_CHROMIUM") != "1", "DDLBENCH_REQUIRE_CHROMIUM=1 but no Chromium"
        return
    with Browser(binary, width=1280, height=900) as browser:
        browser.open(report.as_uri())
        sizes = browser.evaluate(
            "[...document.querySelectorAll('svg.chart')].map(svg => svg.getBoundingClientRect().width)"
        )
        assert sizes and all(width > 200 for width in sizes), sizes
        assert browser.evaluate("document.querySelectorAll('table').length") >= 3
        assert browser.problems(report.as_uri()) == []
