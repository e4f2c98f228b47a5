"""Aggregation keeps one row per planned point; the report escapes what it shows and lists failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.config import sweep_config_from_mapping
from ddlbench.records import MEASUREMENT_VERSION, record_path, write_record
from ddlbench.report.render import render_report, strategy_comparison
from ddlbench.sweep import expand_sweep
from tests.test_aggregate import record_for, write
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


def test_strategies_are_compared_against_ddp_like_for_like_and_skips_are_listed(tmp_path):
    raw = {
        "name": "cmp",
        "results_dir": str(tmp_path),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp", "gpipe"],
        "nodes": [1, 2],
        "batch_size": [8, 32],
    }
    plan = expand_sweep(sweep_config_from_mapping(raw))
    speeds = {("ddp", 1, 8): 60.0, ("ddp", 2, 8): 110.0, ("ddp", 1, 32): 100.0, ("ddp", 2, 32): 180.0}
    speeds |= {("gpipe", 2, 8): 33.0, ("gpipe", 2, 32): 90.0}
    assert {(p.strategy, p.nodes, p.batch_size) for p in plan.points} == set(speeds)
    write(plan, [record_for(p, speeds[(p.strategy, p.nodes, p.batch_size)]) for p in plan.points])
    table = build_table(plan)
    comparison = strategy_comparison(summarize_configurations(table)).set_index(["strategy", "nodes", "batch_size"])
    assert comparison.loc[("gpipe", 2, 32), "vs_baseline"] == pytest.approx(0.5)  # 90 / 180: ddp at b32
    assert comparison.loc[("gpipe", 2, 8), "vs_baseline"] == pytest.approx(0.3)  # 33 / 110: ddp at b8, not the best
    assert (comparison.loc["ddp", "vs_baseline"] == 1.0).all()
    assert comparison.loc[("gpipe", 2, 32), "global_batch_size"] == 32  # one pipeline replica
    assert comparison.loc[("ddp", 2, 32), "global_batch_size"] == 64

    html = render_report(plan.config, table)
    section = html[html.index("<h2>Strategies compared</h2>") : html.index("<h2>Failed points</h2>")]
    assert "<svg" in section and "gpipe b32 mb4" in section  # one bar per configuration, named by what varies
    assert '<td class="text">gpipe</td>' in section
    assert "90 n=1 repetition (no 95 % CI: n &lt; 6)" in section  # the figure says why it has no interval
    skipped = html[html.index("<h2>Skipped combinations</h2>") : html.index("<h2>All points</h2>")]
    assert plan.skipped[0][0].point_id in skipped and "needs at least 2" in skipped


def test_every_figure_carries_its_interval_and_n_and_noisy_ones_are_flagged(tmp_path):
    plan = sweep(tmp_path)
    steady = tuple(100.0 + i % 3 for i in range(20))  # median 101 [100, 102]: ±1 %
    jumpy = tuple(50.0 + 10 * i for i in range(20))  # median 145 [100, 190]: ±31 %
    write(plan, [record_for(plan.points[0], 100.0, steps=steady), record_for(plan.points[1], 140.0, steps=jumpy)])
    html = render_report(plan.config, build_table(plan))
    points = html[html.index("<h2>All points</h2>") :]
    assert "101 [100, 102] n=20 steps</td>" in points
    assert '145 [100, 190] n=20 steps<span class="flag flag-noisy">noisy</span>' in points
    assert "bars: 95 % CI over steps" in html  # the plot says what its error bars are


def test_records_of_another_version_are_listed_and_left_out_of_plots_and_comparisons(tmp_path):
    raw = {"name": "v", "results_dir": str(tmp_path), "models": ["resnet8"], "datasets": ["cifar10"]}
    plan = expand_sweep(sweep_config_from_mapping(raw | {"strategies": ["ddp", "gpipe"], "nodes": [2]}))
    ddp, gpipe = plan.points
    write(plan, [record_for(ddp, 100.0, version=MEASUREMENT_VERSION - 1), record_for(gpipe, 50.0)])
    table = build_table(plan)
    html = render_report(plan.config, table)
    section = html[html.index("<h2>Records of another measurement version</h2>") : html.index("<h2>All points</h2>")]
    assert ddp.point_id in section and gpipe.point_id not in section and "left out" in section
    compared = html[html.index("<h2>Strategies compared</h2>") : html.index("<h2>Failed points</h2>")]
    assert '<td class="text">ddp</td>' not in compared and '<td class="text">gpipe</td>' in compared
    assert f"measurement v{MEASUREMENT_VERSION - 1}" in html[html.index("<h2>All points</h2>") :]

    included = render_report(plan.config, table, include_other_versions=True)
    compared = included[included.index("<h2>Strategies compared</h2>") : included.index("<h2>Failed points</h2>")]
    assert '<td class="text">ddp</td>' in compared and f"measurement v{MEASUREMENT_VERSION - 1}" in compared
    assert "<td>0.5</td>" in compared  # gpipe ÷ ddp, once ddp's old record is let in


def test_oversubscribed_figures_are_marked_with_a_note(tmp_path):
    plan = sweep(tmp_path)
    write(plan, [record_for(plan.points[0], oversubscribed=True), record_for(plan.points[1])])
    html = render_report(plan.config, build_table(plan))
    note = html[html.index("<h2>Oversubscribed points</h2>") : html.index("<h2>All points</h2>")]
    assert plan.points[0].point_id in note and "4 threads on 2 CPUs" in note and plan.points[1].point_id not in note
    points = html[html.index("<h2>All points</h2>") :]
    row = points[points.index(plan.points[0].point_id) :]
    assert '<span class="flag flag-oversubscribed">oversubscribed</span>' in row[: row.index("</tr>")]
    assert "(oversubscribed)" in html  # the plot's legend says it too


def test_throughput_is_drawn_against_each_study_axis_the_sweep_varies():
    """Li et al.'s axes (threads per rank, ranks per node, batch per rank): a plot for each that varies,
    a line per setting of the other fields, each configuration's median with its interval."""
    import pandas as pd

    from ddlbench.report.inside import study_plots

    rows = [
        {"model": "resnet8", "strategy": strategy, "threads": threads, "ranks_per_node": 2, "batch_size": 32,
         "samples_per_s_median": 100.0 * threads, "samples_per_s_ci_low": 90.0 * threads,
         "samples_per_s_ci_high": 110.0 * threads}
        for strategy in ("ddp", "zero2")
        for threads in (1, 2, 4)
    ]  # fmt: skip
    plots = study_plots(pd.DataFrame(rows))
    assert list(plots) == ["threads"]  # ranks_per_node and batch_size hold one value
    svg = plots["threads"]
    assert "throughput vs threads" in svg
    assert ">ddp<" in svg and ">zero2<" in svg  # one line per setting of the other fields, named in the legend
