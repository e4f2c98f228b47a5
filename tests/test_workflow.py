"""The real Snakemake, end to end: a tiny sweep with one failing point runs through to the report."""

from __future__ import annotations

import pandas as pd
import pytest

from ddlbench.config import load_sweep_config
from ddlbench.sweep import expand_sweep
from tests.conftest import job_counts, run_snakemake

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
    failed_section = html[html.index("<h2>Failed points</h2>") : html.index("<h2>All points</h2>")]
    assert failing.point_id in failed_section
    assert "InjectedFault: fault injected by DDLBENCH_INJECT_FAULT" in failed_section
    assert html.count("<svg") == 1  # one throughput plot per model
    assert "<script" not in html and "src=" not in html  # self-contained: nothing fetched

    again = run_snakemake("--cores", "2", "--configfile", str(path))
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr  # a failed point's record is data, not a rerun

    # deleting a record reruns that point and no other (then the table and the report)
    (sweep_dir / "points" / failing.point_id / "record.json").unlink()
    rerun = run_snakemake("--cores", "2", "--configfile", str(path))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert job_counts(rerun) == {"run_point": 1, "aggregate": 1, "report": 1, "all": 1, "total": 4}
    table = pd.read_parquet(sweep_dir / "table.parquet")
    assert len(table) == len(plan.points)
    assert set(table["status"]) == {"ok"}


def test_dry_run_and_lint_are_clean():
    dry = run_snakemake("-n", "--cores", "1")
    assert dry.returncode == 0, dry.stderr
    lint = run_snakemake("--lint", "--cores", "1")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
