"""Aggregation keeps one row per planned point; the report answers first (best strategy, failures by
cause, machine health), escapes what it shows, and keeps every figure with its interval and n."""

from __future__ import annotations

import json
from dataclasses import replace
from statistics import geometric_mean

import pytest

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.analysis.stamps import sweep_stamp, table_digest
from ddlbench.cli import main
from ddlbench.config import sweep_config_from_mapping
from ddlbench.records import MEASUREMENT_VERSION, record_path, write_record
from ddlbench.report.markdown import md_text
from ddlbench.report.render import render_report, render_reports
from ddlbench.report.summary import best_strategies, cause, failures_by_cause
from ddlbench.report.tables import Spec, encode_table, script_json
from ddlbench.sweep import expand_sweep
from tests.report_data import between, embedded_json, tables
from tests.test_aggregate import plan_of, record_for, write
from tests.test_records import sample_record

EVIL_TAG = "<img src=x onerror=alert(1)>"
EVIL_SCRIPT = "</script><script>alert(2)</script>"


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


def certificate(**changes) -> dict:
    """A certificate as `ddlbench certify` writes it: one figure passes, one fails on a node, one has no
    reference; one node outside its band; one regression."""
    figure = {"unit": "GB/s", "ci_low": 9.5, "ci_high": 10.5, "n": 12, "deviation": None, "node": None}
    return {
        "passed": False,
        "system": "testbox",
        "partition": "cpu",
        "date": "2025-06-01T10:00:00Z",
        "figures": [
            figure | {"name": "machine/memory_bandwidth", "value": 10.0, "reference": 10.2, "lower": 9.0,
                      "upper": 11.0, "deviation": -0.02, "passed": True, "status": "pass"},
            figure | {"name": "machine/allreduce/busbw", "value": 4.0, "reference": 8.0, "lower": 7.0,
                      "upper": 9.0, "deviation": -0.5, "passed": False, "status": "fail", "node": "n3"},
            figure | {"name": "train/resnet8/samples_per_s", "value": 120.0, "reference": None, "lower": None,
                      "upper": None, "passed": None, "status": "no reference"},
        ],
        "nodes_outside": ["n3"],
        "regressions": [
            {"name": "machine/memory_bandwidth", "value": 10.0, "previous_value": 12.0, "change": -0.1667,
             "previous_run": "2025-05-01"}
        ],
    } | changes  # fmt: skip


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
    failed_section = between(html, "<h2>Failed points</h2>", "<h2>All points</h2>")
    assert all(point.point_id in failed_section for point in plan.points)  # one failed, two missing
    assert "<svg" in html and "no successful points" in html
    by_cause = between(html, "<h3>Failed points by cause</h3>", "</table>")
    assert ">missing<" in by_cause and ">no record yet<" in by_cause and ">2<" in by_cause


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
    comparison = summarize_configurations(table).set_index(["strategy", "nodes", "batch_size"])
    assert comparison.loc[("gpipe", 2, 32), "vs_baseline"] == pytest.approx(0.5)  # 90 / 180: ddp at b32
    assert comparison.loc[("gpipe", 2, 8), "vs_baseline"] == pytest.approx(0.3)  # 33 / 110: ddp at b8, not the best
    assert (comparison.loc["ddp", "vs_baseline"] == 1.0).all()
    assert comparison.loc[("gpipe", 2, 32), "global_batch_size"] == 32  # one pipeline replica
    assert comparison.loc[("ddp", 2, 32), "global_batch_size"] == 64

    html = render_report(plan.config, table)
    section = between(html, '<section id="pair-1">', "</section>")
    assert "<h2>resnet8 on cifar10</h2>" in section and section.count('<svg class="chart"') == 4
    best = between(html, '<table class="sortable words" id="best">', "</table>")
    # no ddp ran 32 samples a step on 2 nodes, so gpipe at batch 32 meets ddp at per-replica batch 32
    row = between(best, "2 nodes × 1/node, per-replica batch 32 (global batches differ)", "</tr>")
    assert "<td>ddp</td>" in row and "2×" in row and "gpipe mb4: 90 n=1 launch" in row
    assert "180 n=1 launch (no 95 % CI: n &lt; 3)" in row  # the figure says why it has no interval
    assert "one launch: no run-to-run interval" in row
    assert "only ddp ran at this scale" in between(best, "1 node × 1/node, global batch 8", "</tr>")
    configs = tables(html)["configs"]
    at = {
        (s, n, b): i
        for i, (s, n, b) in enumerate(zip(configs["strategy"], configs["nodes"], configs["batch_size"], strict=True))
    }
    assert (
        configs["vs_baseline"][at[("gpipe", 2, 32)]] == 0.5
        and configs["samples_per_s"]["m"][at[("gpipe", 2, 32)]] == 90
    )
    assert (
        configs["samples_per_s"]["n"][at[("gpipe", 2, 32)]] == 1 and configs["samples_per_s"]["unit"] == "repetitions"
    )
    skipped = between(html, "<h2>Skipped combinations</h2>", "<h2>All points</h2>")
    assert plan.skipped[0][0].point_id in skipped and "needs at least 2" in skipped


def _best(plan, speed, spread, **options):
    """Records of every point of `plan` at speed[(strategy, nodes)] + spread[nodes] × repetition samples/s."""
    write(plan, [record_for(p, speed[(p.strategy, p.nodes)] + spread[p.nodes] * p.repetition) for p in plan.points])
    table = build_table(plan)
    return table, {row["nodes"]: row for row in best_strategies(summarize_configurations(table), **options)}


def test_the_winner_is_named_with_its_margin_and_a_verdict_from_launches(tmp_path):
    """Six launches each. At 1 node ddp is 25 % faster, launch after launch: 'faster'; at 2 nodes they are
    1 % apart with launches 3 % apart: 'not separable'. Each cell is its own family."""
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1, 2], repetitions=6)
    speed = {("ddp", 1): 100.0, ("zero2", 1): 80.0, ("ddp", 2): 151.0, ("zero2", 2): 149.0}
    table, rows = _best(plan, speed, {1: 0.5, 2: 5.0})
    one, two = rows[1], rows[2]
    assert (one["winner"].strategy, one["runner_up"].strategy, one["basis"]) == ("ddp", "zero2", "launches")
    ddp, zero2 = [100 + 0.5 * r for r in range(6)], [80 + 0.5 * r for r in range(6)]
    assert one["margin"] == pytest.approx(geometric_mean(ddp) / geometric_mean(zero2))  # the verdict's ratio
    assert one["separated"] and one["verdict"].startswith("faster (×1.2") and "6+6 launches" in one["verdict"]
    assert one["winner"].text.startswith("101.2 [") and one["winner"].text.endswith("(geometric mean of 6 launches)")
    assert min(ddp) < one["winner"].low < geometric_mean(ddp) < one["winner"].high < max(ddp)
    assert two["winner"].strategy == "ddp" and not two["separated"] and two["verdict"].startswith("not separable")
    assert one["cost_node_h"] == pytest.approx(1 / geometric_mean(ddp) * 1e6 / 3600)

    html, markdown = render_reports(plan.config, table)
    summary = between(html, '<section id="summary">', "</section>")
    # no "fastest overall" across scales: the cells' verdicts, counted
    assert (
        "<strong>resnet8 on cifar10</strong>: ddp fastest in 1 of 2 cells where several strategies ran; 1 undecided"
        in summary
    )
    assert "fastest overall" not in html
    # per scale, the answer in words: a winner with its verdict, or plainly that the launches cannot tell
    assert "<li>at 1 node × 1/node, global batch 32: ddp is fastest, ahead of zero2 (×1.2" in summary
    assert "<li>at 2 nodes × 1/node, global batch 64: the launches cannot separate ddp from zero2 (" in summary
    assert "Welch" in summary
    assert "| resnet8 | cifar10 | 1 node × 1/node, global batch 32 | ddp | 101.2 [" in markdown
    assert "  - at 1 node × 1/node, global batch 32: ddp is fastest, ahead of zero2 (×1.2" in markdown
    assert "| faster (×1.2" in markdown and "| not separable (" in markdown


def test_one_launch_draws_no_verdict_however_far_apart(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1])
    _, rows = _best(plan, {("ddp", 1): 100.0, ("zero2", 1): 50.0}, {1: 0.0})
    assert rows[1]["verdict"] == "one launch: no run-to-run interval" and not rows[1]["separated"]
    assert rows[1]["margin"] == pytest.approx(2.0)


def test_strategies_are_compared_at_equal_global_batch(tmp_path):
    """gpipe on 2 ranks at batch 32 runs 32 samples a step, as ddp at batch 16 does; ddp at batch 32 runs 64
    and has a row of its own."""
    plan = plan_of(tmp_path, strategies=["ddp", "gpipe"], nodes=[2], batch_size=[16, 32], repetitions=3)
    by_batch = {(p.strategy, p.batch_size): p for p in plan.points}
    assert by_batch[("gpipe", 32)].global_batch_size == by_batch[("ddp", 16)].global_batch_size == 32
    speed = {("ddp", 16): 90.0, ("ddp", 32): 200.0, ("gpipe", 16): 40.0, ("gpipe", 32): 60.0}
    write(plan, [record_for(p, speed[(p.strategy, p.batch_size)] + p.repetition) for p in plan.points])
    rows = best_strategies(summarize_configurations(build_table(plan)))
    groups = {row["global_batch_size"]: row for row in rows}
    assert set(groups) == {16, 32, 64}
    assert (groups[32]["winner"].label, groups[32]["runner_up"].label) == ("ddp", "gpipe mb4")
    assert groups[32]["margin"] == pytest.approx(geometric_mean([90, 91, 92]) / geometric_mean([60, 61, 62]))
    assert groups[64]["runner_up"] is None and groups[64]["verdict"] == "only ddp ran at this scale"
    assert "global batch 32" in groups[32]["scale"]


def test_host_copied_horovod_is_left_out_unless_asked_and_one_host_is_said(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1, 2], repetitions=3)
    facts = {"zero2": {"gradient_path": "host-copied (gloo)"}, "ddp": {}}
    write(
        plan,
        [record_for(p, 100.0 + (50 if p.strategy == "zero2" else 0), facts=facts[p.strategy]) for p in plan.points],
    )
    table = build_table(plan)
    configs = summarize_configurations(table)
    rows = best_strategies(configs)
    assert all(row["winner"].strategy == "ddp" and row["runner_up"] is None for row in rows)
    assert all(row["left_out"] == ["zero2 (host-copied (gloo): not a contender)"] for row in rows)
    assert all(row["winner"].strategy == "zero2" for row in best_strategies(configs, include_host_copied=True))
    # the records' ranks ran on the hosts n0 and n1: not one host
    html, markdown = render_reports(plan.config, table)
    assert "One host:" not in html and "node-h per 10⁶ samples" in markdown


def test_processes_on_one_host_are_not_called_nodes_and_get_no_cost(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2])
    write(plan, [record_for(p, 100.0 * p.nodes) for p in plan.points])
    table = build_table(plan).assign(hostnames="login1")
    rows = best_strategies(summarize_configurations(table), one_host=True)
    assert rows[1]["scale"].startswith("2 processes as nodes on one host") and rows[1]["cost_node_h"] is None
    html, markdown = render_reports(plan.config, table)
    assert "One host:" in html and "processes sharing that host" in markdown
    assert "nodes (processes on one host)" in between(html, '<section id="pair-1">', "</section>")
    assert "cost_node_h" not in tables(html)["configs"]  # no cost column at all
    assert "node-h" not in between(html, "<h3>Best strategy</h3>", "<h3>Failed points by cause</h3>").split("</ul>")[0]


def test_failed_points_are_counted_by_status_and_cause():
    import pandas as pd

    reasons = [
        ("failed", "rank 1 on n1: RuntimeError: Connection reset by peer"),
        ("failed", "rank 0 on n0: RuntimeError: another message"),
        ("failed", "diverged: loss is nan at step 3 (warm-up included)"),
        ("oom", "rank 0 on n0: OutOfMemoryError: CUDA out of memory"),
        ("timeout", "ran past its limit of 600 s; the ranks still running were stopped"),
        ("timeout", "ran past its limit of 120 s; the ranks still running were stopped"),
        ("missing", "no record yet"),
        ("ok", None),
    ]
    table = pd.DataFrame([{"point_id": f"p{i}", "status": s, "reason": r} for i, (s, r) in enumerate(reasons)])
    got = {(r["status"], r["cause"]): (r["count"], r["examples"]) for r in failures_by_cause(table)}
    assert got == {
        ("failed", "RuntimeError"): (2, ["p0", "p1"]),
        ("diverged", "diverged"): (1, ["p2"]),
        ("oom", "OutOfMemoryError"): (1, ["p3"]),
        ("timeout", "ran past its limit of N s"): (2, ["p4", "p5"]),
        ("missing", "no record yet"): (1, ["p6"]),
    }
    assert cause("rank 3 ended with signal 9 (SIGKILL) without reporting an error") == "rank N ended with signal N"


def test_the_health_block_shows_the_certificate_or_says_there_is_none(tmp_path):
    plan = sweep(tmp_path)
    write(plan, [record_for(p) for p in plan.points])
    table = build_table(plan)
    html, markdown = render_reports(plan.config, table)
    assert "No machine certificate in this sweep's folder" in html and "No machine certificate" in markdown

    (plan.config.sweep_dir / "certificate.json").write_text(json.dumps(certificate()))
    html, markdown = render_reports(plan.config, table)
    health = between(html, "<h3>Machine health</h3>", "<h3>Best strategy</h3>")
    assert "Machine certificate FAILED" in health and "testbox" in health
    assert "1 pass, 1 fail, 1 no reference of 3 figure(s)" in health
    assert "Nodes outside their band: <strong>n3</strong>" in health
    assert "machine/allreduce/busbw" in health and "4 [3.5, 4.5]" not in health  # its own CI: 9.5, 10.5
    assert "8 [7, 9] GB/s" in health and "-50.0 %" in health
    assert "machine/memory_bandwidth" in health and "-16.7 %" in health and "2025-05-01" in health  # a regression
    assert "Machine certificate FAILED for testbox cpu" in markdown and "machine/allreduce/busbw" in markdown

    # a version-2 certificate: slow, failed and missing figures all listed as not passing, with the cause
    cert = certificate()
    cert["figures"][1] |= {"status": "slow"}
    cert["figures"].append(
        {"name": "machine/matmul", "unit": "FLOP/s", "value": None, "why_missing": "rank 1: RuntimeError: boom",
         "reference": 1e12, "lower": 9e11, "upper": None, "passed": False, "status": "failed", "node": None}
    )  # fmt: skip
    (plan.config.sweep_dir / "certificate.json").write_text(json.dumps(cert))
    health = between(render_report(plan.config, table), "<h3>Machine health</h3>", "<h3>Best strategy</h3>")
    assert "1 pass, 1 slow, 1 failed, 1 no reference of 4 figure(s)" in health
    assert "failed: rank 1: RuntimeError: boom" in health

    (plan.config.sweep_dir / "certificate.json").write_text(json.dumps(certificate(passed=True, figures=[])))
    assert "Machine certificate passed" in render_report(plan.config, table)
    (plan.config.sweep_dir / "certificate.json").write_text("{not json")
    assert "cannot read certificate.json" in render_report(plan.config, table)


def test_markup_in_names_from_tables_records_and_certificates_is_escaped_everywhere(tmp_path):
    """Model names are checked by the registry, so the markup comes in through the table (as a hand-edited
    or foreign table would), a record's reason and the certificate; none of it may stay markup in the page,
    its embedded data or the Markdown."""
    plan = sweep(tmp_path)
    records = [record_for(plan.points[0]), record_for(plan.points[1])]
    records.append(replace(sample_record("failed"), point=plan.points[2], point_id=plan.points[2].point_id,
                           reason=f"rank 1 on n1: {EVIL_SCRIPT} {EVIL_TAG}"))  # fmt: skip
    write(plan, records)
    table = build_table(plan)
    table["model"] = f"resnet8{EVIL_TAG}"
    table["strategy"] = f"ddp{EVIL_SCRIPT}"
    table["hostnames"] = f"n0,{EVIL_TAG}"
    evil_certificate = certificate(system=EVIL_SCRIPT, nodes_outside=[EVIL_TAG])
    evil_certificate["figures"][1] |= {"name": f"busbw{EVIL_SCRIPT}", "node": EVIL_TAG, "unit": EVIL_TAG}
    (plan.config.sweep_dir / "certificate.json").write_text(json.dumps(evil_certificate))
    curve = [{"x": [float(n)], "value": 100.0 * n, "low": 90.0 * n, "high": 110.0 * n} for n in (1, 2, 4)]
    fitted = {"figure": "samples_per_s", "unit": EVIL_SCRIPT, "label": f"ddp {EVIL_TAG}", "model": f"resnet8{EVIL_TAG}",
              "dataset": "cifar10", "parameters": ["nodes"], "method": "ddlbench", "formula": f"1 {EVIL_TAG}",
              "points": 2, "observations": 2, "cv_smape_percent": None, "curve": curve, "predictions": [],
              "measured": [{"x": [1.0], "median": 100.0, "min": 99.0, "max": 101.0, "n": 1}]}  # fmt: skip
    stamp = sweep_stamp(plan.config) | {"table_sha256": table_digest(table)}  # as ddlbench.finish writes it
    (plan.config.sweep_dir / "models.json").write_text(json.dumps(stamp | {"models": [fitted]}))
    html, markdown = render_reports(plan.config, table)
    assert "<h3>Scaling models</h3>" in html
    for evil in (EVIL_TAG, EVIL_SCRIPT, "<img", "<script>alert"):
        assert evil not in html, evil
        assert evil not in markdown, evil
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the data and the page's own script
    data = embedded_json(html)
    assert "<" not in data and ">" not in data and "&" not in data
    decoded = tables(html)
    assert decoded["points"]["model"][0] == f"resnet8{EVIL_TAG}"  # the page's script gets the text back intact
    assert f"rank 1 on n1: {EVIL_SCRIPT} {EVIL_TAG}" in decoded["points"]["reason"]
    assert "resnet8&lt;img src=x onerror=alert(1)&gt; on cifar10" in html  # section heading, as text
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html  # legends, charts' tooltips, tables
    assert md_text(EVIL_TAG) in markdown and "busbw&lt;/script&gt;" in markdown


def test_every_figure_carries_its_interval_and_n_and_noisy_ones_are_flagged(tmp_path):
    plan = sweep(tmp_path)
    steady = tuple(100.0 + i % 3 for i in range(20))  # median 101 [100, 102]: ±1 %
    jumpy = tuple(50.0 + 10 * i for i in range(20))  # median 145 [100, 190]: ±31 %
    write(plan, [record_for(plan.points[0], 100.0, steps=steady), record_for(plan.points[1], 140.0, steps=jumpy)])
    html = render_report(plan.config, build_table(plan))
    points = tables(html)["points"]["samples_per_s_point"]
    assert (points["m"][0], points["lo"][0], points["hi"][0], points["n"][0], points["unit"]) == (
        101,
        100,
        102,
        20,
        "steps",
    )
    assert (points["m"][1], points["lo"][1], points["hi"][1]) == (145, 100, 190)
    assert points["noisy"][:2] == [0, 1]
    best = between(html, 'id="best"', "</table>")
    # the summary compares launches: one each, so no interval, and it says why
    assert "100 n=1 launch (no 95 % CI: n &lt; 3)" in best and "140 n=1 launch (no 95 % CI: n &lt; 3)" in best
    assert "95 % CI over steps" in html  # the charts say what their error bars are


def test_records_of_another_version_are_listed_and_left_out_of_plots_and_comparisons(tmp_path):
    raw = {"name": "v", "results_dir": str(tmp_path), "models": ["resnet8"], "datasets": ["cifar10"]}
    plan = expand_sweep(sweep_config_from_mapping(raw | {"strategies": ["ddp", "gpipe"], "nodes": [2]}))
    ddp, gpipe = plan.points
    write(plan, [record_for(ddp, 100.0, version=MEASUREMENT_VERSION - 1), record_for(gpipe, 50.0)])
    table = build_table(plan)
    html = render_report(plan.config, table)
    section = between(html, "<h2>Records of another measurement version</h2>", "<h2>All points</h2>")
    assert ddp.point_id in section and gpipe.point_id not in section and "left out" in section
    assert tables(html)["configs"]["strategy"] == ["gpipe"]
    assert tables(html)["points"]["_notes"][0] == f"measurement v{MEASUREMENT_VERSION - 1}"

    included = tables(render_report(plan.config, table, include_other_versions=True))["configs"]
    assert included["strategy"] == ["ddp", "gpipe"] and included["vs_baseline"] == [1, 0.5]  # gpipe ÷ ddp
    assert included["_notes"][0] == f"measurement v{MEASUREMENT_VERSION - 1}"


def test_oversubscribed_figures_are_marked_with_a_note(tmp_path):
    plan = sweep(tmp_path)
    write(plan, [record_for(plan.points[0], oversubscribed=True), record_for(plan.points[1])])
    html = render_report(plan.config, build_table(plan))
    note = between(html, "<h2>Oversubscribed points</h2>", "<h2>All points</h2>")
    assert plan.points[0].point_id in note and "4 threads on 2 CPUs" in note and plan.points[1].point_id not in note
    assert tables(html)["points"]["_notes"][:2] == ["oversubscribed", ""]
    assert "(oversubscribed)" in between(html, '<section id="pair-1">', "</section>")  # the charts' legend


def test_throughput_is_drawn_against_each_study_axis_the_sweep_varies(tmp_path):
    """Li et al.'s axes (threads per rank, ranks per node, batch per rank): a chart for each that varies, a
    line per setting of the other fields, each configuration's median with its interval."""
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1], threads=[1, 2, 4])
    write(plan, [record_for(p, 100.0 * p.threads) for p in plan.points])
    section = between(render_report(plan.config, build_table(plan)), '<section id="pair-1">', "</section>")
    study = between(section, "<h3>Throughput against the study's axes</h3>", "<h3>")
    assert study.count('<svg class="chart"') == 1  # ranks per node and batch hold one value
    assert "Throughput against threads per rank" in study and "threads per rank (log2 scale)" in study
    assert "</span>ddp</li>" in study and "</span>zero2</li>" in study  # one line per setting of the others


def test_the_embedded_tables_decode_to_what_was_encoded():
    import pandas as pd

    ids = [f"resnet8-cifar10-ddp-n{n}x1-b32-t1-r{r}-{n * 7 + r:08x}" for n in (1, 2, 4) for r in range(4)]
    frame = pd.DataFrame(
        {
            "point_id": ids,
            "model": ["resnet8"] * 6 + ["vgg11"] * 6,
            "reason": [None] * 11 + ["boom"],
            "nodes": [1] * 4 + [2] * 4 + [4] * 4,
            "speed_median": [1234.5678, 2.0, None, 0.000123456] * 3,
            "speed_ci_low": [1200.0, 1.9, None, None] * 3,
            "speed_ci_high": [1300.0, 2.1, None, None] * 3,
            "speed_noisy": [True, False, None, False] * 3,
            "n": [20] * 12,
        }
    )
    specs = [Spec(key="point_id", kind="text"), Spec(key="model", kind="text"), Spec(key="reason", kind="text"),
             Spec(key="nodes"), Spec(key="speed", kind="figure", n_column="n")]  # fmt: skip
    encoded = encode_table(frame, specs)
    html = f'<script type="application/json" id="report-data">{script_json({"t": encoded})}</script>'
    got = tables(html)["t"]
    assert got["point_id"] == ids and got["model"] == list(frame["model"]) and got["reason"][-1] == "boom"
    assert got["reason"][:11] == [None] * 11 and got["nodes"] == list(frame["nodes"])
    assert got["speed"]["m"][:4] == [1235, 2, None, 0.0001235] and got["speed"]["n"] == [20] * 12
    assert got["speed"]["noisy"][:4] == [1, 0, 0, 0] and got["speed"]["lo"][:2] == [1200, 1.9]
    assert len(json.dumps(encoded)) < len(json.dumps(frame.to_dict("records")))


def test_the_report_command_writes_the_page_and_its_markdown_summary(tmp_path, monkeypatch):
    plan = sweep(tmp_path)
    write(plan, [record_for(p, 100.0 * p.nodes) for p in plan.points])
    save_table(build_table(plan), parquet=tmp_path / "t.parquet", csv=tmp_path / "t.csv")
    config = tmp_path / "sweep.yaml"
    config.write_text(json.dumps({"name": "r", "results_dir": str(tmp_path), "models": ["resnet8"],
                                  "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2, 4]}))  # fmt: skip
    out = tmp_path / "out" / "report.html"
    assert main(["-q", "report", "--configfile", str(config), "--table", str(tmp_path / "t.parquet"),
                 "--out", str(out)]) == 0  # fmt: skip
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.startswith("# ddlbench report: r\n") and "## Best strategy" in markdown
    assert (
        "| resnet8 | cifar10 | 4 nodes × 1/node, global batch 128 | only ddp | 400 n=1 launch (no 95 % CI: n < 3) |"
        in markdown
    )
    assert "only ddp ran at this scale" in markdown and "## Provenance" in markdown
    html = out.read_text()
    assert "Throughput (samples/s)" in html and "speedup ÷ nodes" in html  # headings with units, charts
    assert "src=" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_a_cells_verdict_is_the_same_in_a_sweep_of_ten_models_as_alone(tmp_path):
    """One question, one family: ddp 11 % ahead of zero2 at 3 launches 3 % apart (p ≈ 0.013) is 'fastest'
    when its cell is the sweep, and stays so beside nine other models' cells where the two are equal; a
    correction over the whole report (ten comparisons: p ≈ 0.13) would have taken the verdict away."""
    spread = (1.0, 0.97, 1.03)  # each launch's factor: launches about 3 % apart

    def verdicts(models: list[str], folder) -> dict[str, tuple[str, bool]]:
        datasets = ["cifar10", "tokens_small"] if "gpt_tiny" in models else ["cifar10"]
        plan = plan_of(folder, models=models, datasets=datasets, strategies=["ddp", "zero2"], nodes=[1], repetitions=3)
        speed = {("resnet8", "ddp"): 111.0}
        throughput = {p: speed.get((p.model, p.strategy), 100.0) * spread[p.repetition] for p in plan.points}
        write(plan, [record_for(point, value) for point, value in throughput.items()])
        rows = best_strategies(summarize_configurations(build_table(plan)))
        return {row["model"]: (row["verdict"], row["separated"]) for row in rows}

    alone = verdicts(["resnet8"], tmp_path / "alone")
    others = ["resnet20", "resnet18", "resnet50", "vgg11", "vgg16", "alexnet", "mobilenet_v2", "resnet152", "gpt_tiny"]
    among = verdicts(["resnet8", *others], tmp_path / "among")
    assert len(among) == 10 and alone["resnet8"] == among["resnet8"]
    assert alone["resnet8"][1] and alone["resnet8"][0].startswith("faster (×1.11")
    assert not any(separated for model, (_, separated) in among.items() if model != "resnet8")
