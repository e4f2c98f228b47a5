"""Aggregation keeps one row per planned point; the report escapes what it shows and lists failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.config import sweep_config_from_mapping
from ddlbench.records import record_path, write_record
from ddlbench.report.render import render_report
from ddlbench.sweep import expand_sweep
from tests.test_records import sample_record


def sweep(tmp_path):
    raw = {
        "name": "r",
        "results_dir": str(tmp_path),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp"],
        "nodes": [1, 2, 4],
    }
    return expand_sweep(sweep_config_from_mapping(raw))


def test_table_has_a_row_per_point_and_marks_missing_records(tmp_path):
    plan = sweep(tmp_path)
    ok, failed, _absent = plan.points
    write_record(
        record_path(plan.config.sweep_dir, ok.point_id), replace(sample_record("ok"), point=ok, point_id=ok.point_id)
    )
    broken = replace(sample_record("failed"), point=failed, point_id=failed.point_id)
    write_record(record_path(plan.config.sweep_dir, failed.point_id), broken)
    table = build_table(plan)
    assert list(table["point_id"]) == [p.point_id for p in plan.points]
    assert list(table["status"]) == ["ok", "failed", "missing"]
    assert table.loc[2, "reason"] == "no record yet"
    assert table.loc[0, "samples_per_s_median"] == sample_record().metrics.samples_per_s.median
    save_table(table, parquet=tmp_path / "t.parquet", csv=tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().count("\n") == 4


def test_report_escapes_reasons_and_lists_failed_points(tmp_path):
    plan = sweep(tmp_path)
    failed = plan.points[1]
    record = replace(
        sample_record("failed"), point=failed, point_id=failed.point_id, reason="rank 1: <script>alert(1)</script>"
    )
    write_record(record_path(plan.config.sweep_dir, failed.point_id), record)
    html = render_report(plan.config, build_table(plan))
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    failed_section = html[html.index("<h2>Failed points</h2>") : html.index("<h2>All points</h2>")]
    assert all(point.point_id in failed_section for point in plan.points)  # one failed, two missing
    assert "<svg" in html and "no successful points" in html


def test_speedup_and_efficiency_are_over_the_smallest_node_count_of_each_series():
    import pandas as pd

    from ddlbench.analysis.aggregate import add_scaling

    base = {"model": "m", "dataset": "d", "strategy": "ddp", "ranks_per_node": 1, "batch_size": 8, "threads": 1}
    base |= {"micro_batches": 1, "strategy_options": "{}", "data": "synthetic"}
    rows = [
        base | {"model_options": "{}", "nodes": 2, "status": "ok", "samples_per_s_median": 100.0},
        base | {"model_options": "{}", "nodes": 2, "status": "ok", "samples_per_s_median": 120.0},  # repetition
        base | {"model_options": "{}", "nodes": 4, "status": "ok", "samples_per_s_median": 165.0},
        base | {"model_options": "{}", "nodes": 8, "status": "failed", "samples_per_s_median": float("nan")},
        base | {"model_options": '{"norm": "group"}', "nodes": 4, "status": "ok", "samples_per_s_median": 50.0},
    ]
    table = add_scaling(pd.DataFrame(rows))
    assert list(table["speedup"][:3]) == pytest.approx([100 / 110, 120 / 110, 165 / 110])  # base: median of reps
    assert table.loc[2, "scaling_efficiency"] == pytest.approx(0.75)  # 1.5× on 2× the nodes
    assert pd.isna(table.loc[3, "speedup"])
    assert table.loc[4, "speedup"] == 1.0  # its own series, its own base


def test_strategies_are_compared_against_ddp_at_the_same_layout_and_skips_are_listed(tmp_path):
    raw = {
        "name": "cmp",
        "results_dir": str(tmp_path),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp", "gpipe"],
        "nodes": [1, 2],
    }
    plan = expand_sweep(sweep_config_from_mapping(raw))
    assert [(p.strategy, p.nodes) for p in plan.points] == [("ddp", 1), ("ddp", 2), ("gpipe", 2)]
    base = sample_record("ok")
    speeds = {("ddp", 1): 100.0, ("ddp", 2): 180.0, ("gpipe", 2): 90.0}
    for point in plan.points:
        stats = replace(base.metrics.samples_per_s, median=speeds[(point.strategy, point.nodes)])
        record = replace(base, point=point, point_id=point.point_id, metrics=replace(base.metrics, samples_per_s=stats))
        write_record(record_path(plan.config.sweep_dir, point.point_id), record)
    table = build_table(plan)

    from ddlbench.report.render import strategy_comparison

    comparison = strategy_comparison(table).set_index(["strategy", "nodes"])
    assert comparison.loc[("gpipe", 2), "vs_baseline"] == pytest.approx(0.5)  # 90 / 180 at 2 nodes
    assert comparison.loc[("ddp", 1), "vs_baseline"] == pytest.approx(1.0)
    assert comparison.loc[("gpipe", 2), "global_batch_size"] == 32  # one pipeline replica
    assert comparison.loc[("ddp", 2), "global_batch_size"] == 64

    html = render_report(plan.config, table)
    section = html[html.index("<h2>Strategies compared</h2>") : html.index("<h2>Failed points</h2>")]
    assert "<svg" in section and "gpipe mb4" in section  # the bar chart labels micro-batched strategies
    skipped = html[html.index("<h2>Skipped combinations</h2>") : html.index("<h2>All points</h2>")]
    assert plan.skipped[0][0].point_id in skipped and "needs at least 2" in skipped
