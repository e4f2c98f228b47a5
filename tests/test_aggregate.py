"""The table groups by configuration (every Point field but repetition), never by a hand-kept list."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pandas as pd
import pytest

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.analysis.keys import (
    COMPARED_APART,
    CONFIG_FIELDS,
    STRATEGY_FIELDS,
    baseline_key,
    baseline_replica_key,
    comparison_key,
    config_key,
    series_key,
)
from ddlbench.config import sweep_config_from_mapping
from ddlbench.point import Point
from ddlbench.records import MEASUREMENT_VERSION, PointRecord, Stats, record_path, write_record
from ddlbench.statistics import median_ci
from ddlbench.sweep import Plan, expand_sweep
from tests.conftest import make_point
from tests.test_records import sample_record


def plan_of(tmp_path, **axes) -> Plan:
    raw = {"name": "agg", "results_dir": str(tmp_path), "models": ["resnet8"], "datasets": ["cifar10"]} | axes
    return expand_sweep(sweep_config_from_mapping(raw))


def record_for(
    point: Point,
    overall: float = 100.0,
    *,
    steps: tuple[float, ...] = (),
    status: str = "ok",
    version: int = MEASUREMENT_VERSION,
    oversubscribed: bool = False,
    dropped: int = 0,
    facts: dict | None = None,
) -> PointRecord:
    """A record of `point` whose window throughput is `overall` and whose steps ran at `steps` samples/s."""
    base = replace(sample_record(status), point=point, point_id=point.point_id, measurement_version=version)
    if status != "ok":
        return base
    per_step = list(steps or (overall * 0.98, overall, overall * 1.02))
    metrics = replace(
        base.metrics,
        samples_per_s=Stats.of(per_step),
        step_time_s=Stats.of([point.global_batch_size / value for value in per_step]),
        samples_per_s_overall=overall,
        global_batch_size=point.global_batch_size,
        warmup_dropped_steps=dropped,
        oversubscribed=oversubscribed,
        cores_note="n0: 4 threads on 2 CPUs" if oversubscribed else "",
    )
    ranks = tuple(replace(rank, facts=dict(facts or {})) for rank in base.ranks)
    return replace(base, metrics=metrics, ranks=ranks)


def write(plan: Plan, records: list[PointRecord]) -> None:
    for record in records:
        write_record(record_path(plan.config.sweep_dir, record.point_id), record)


def _changed(point: Point, name: str):
    value = getattr(point, name)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, ("zz_option", "1"))
    raise AssertionError(f"a Point field of a type the test does not know: {name}")


def test_every_point_field_has_a_column_even_for_points_without_a_record(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2])
    write(plan, [record_for(plan.points[0])])
    table = build_table(plan)
    missing = [field.name for field in dataclasses.fields(Point) if field.name not in table.columns]
    assert not missing, f"Point fields without a table column: {missing}"
    assert list(table["status"]) == ["ok", "missing"]
    assert table["config_key"].notna().all() and table["config_key"].nunique() == 2


def test_every_configuration_field_separates_configurations_and_repetition_does_not():
    point = make_point(strategy="ddp", nodes=2)
    assert config_key(replace(point, repetition=3)) == config_key(point)
    for name in CONFIG_FIELDS:  # derived from the dataclass: a new field is covered the day it exists
        other = replace(point, **{name: _changed(point, name)})
        assert config_key(other) != config_key(point), name
        assert (series_key(other) == series_key(point)) == (name == "nodes"), name
        assert (baseline_replica_key(other) == baseline_replica_key(point)) == (name in STRATEGY_FIELDS), name
        # like for like holds the global batch equal: a strategy field that changes it (split) separates
        alike = name in COMPARED_APART and other.global_batch_size == point.global_batch_size
        assert (baseline_key(other) == baseline_key(point)) == alike, name
        assert (comparison_key(other) == comparison_key(point)) == alike, name
    # a pipeline over both ranks at twice the per-replica batch runs ddp's global batch: alike
    pipeline = replace(point, strategy="gpipe", split=2, micro_batches=2, batch_size=2 * point.batch_size)
    assert pipeline.global_batch_size == point.global_batch_size
    assert comparison_key(pipeline) == comparison_key(point) and baseline_key(pipeline) == baseline_key(point)
    assert baseline_replica_key(pipeline) != baseline_replica_key(point)


def test_a_pure_split_grows_with_the_world_inside_one_series_and_a_hybrid_split_is_its_own_series():
    pipeline = make_point(strategy="gpipe", nodes=1, ranks_per_node=2, split=2, micro_batches=4)
    assert series_key(replace(pipeline, nodes=2, split=4)) == series_key(pipeline)
    hybrid = make_point(strategy="dp_pp", nodes=2, ranks_per_node=2, split=2, micro_batches=4)
    assert series_key(replace(hybrid, nodes=4)) == series_key(hybrid)
    assert series_key(replace(hybrid, nodes=4, split=4)) != series_key(hybrid)


def test_a_sweep_varying_threads_batch_split_and_a_model_option_has_one_row_per_configuration(tmp_path):
    plan = plan_of(
        tmp_path, strategies=["ddp", "dp_pp"], nodes=[2, 4], ranks_per_node=[2], split=[2, 4], threads=[1, 2],
        batch_size=[8, 16], repetitions=2,
    )  # fmt: skip
    grouped = [replace(p, model_options=(("norm", "group"),)) for p in plan.points]
    plan = replace(plan, points=plan.points + tuple(grouped))
    configs = {config_key(point) for point in plan.points}
    assert len(configs) == len(plan.points) // 2  # two repetitions of each
    speeds = {key: 100.0 + 10 * index for index, key in enumerate(sorted(configs))}
    write(plan, [record_for(p, speeds[config_key(p)] + p.repetition) for p in plan.points])
    table = build_table(plan)
    summary = summarize_configurations(table)
    assert len(summary) == len(configs) and set(summary["config_key"]) == configs
    assert (summary["n_repetitions"] == 2).all()
    for row in summary.to_dict("records"):  # the median of its own two repetitions, nobody else's
        assert row["rep_samples_per_s_median"] == pytest.approx(speeds[row["config_key"]] + 0.5)
    assert set(summary.loc[summary["strategy"] == "dp_pp", "split"]) == {2, 4}
    per_point = table.set_index("point_id")["rep_samples_per_s_median"]
    for point in plan.points:
        assert per_point[point.point_id] == pytest.approx(speeds[config_key(point)] + 0.5)


def test_speedup_is_over_the_smallest_node_count_of_each_series_and_one_there(tmp_path):
    plan = plan_of(tmp_path, strategies=["dp_pp", "gpipe"], nodes=[1, 2, 4], ranks_per_node=[2], split=[2, 4])
    speeds = {("gpipe", 1, 2): 50.0, ("gpipe", 2, 4): 80.0}  # resnet8 has too few blocks for 8 stages
    speeds |= {("dp_pp", 2, 2): 100.0, ("dp_pp", 4, 2): 150.0, ("dp_pp", 4, 4): 90.0}
    assert {(p.strategy, p.nodes, p.split) for p in plan.points} == set(speeds)
    write(plan, [record_for(p, speeds[(p.strategy, p.nodes, p.split)]) for p in plan.points])
    summary = summarize_configurations(build_table(plan)).set_index(["strategy", "nodes", "split"])
    assert summary.loc[("gpipe", 1, 2), "speedup"] == 1.0
    assert summary.loc[("gpipe", 2, 4), "speedup"] == pytest.approx(1.6)  # split = world: one series
    assert summary.loc[("gpipe", 2, 4), "scaling_efficiency"] == pytest.approx(0.8)
    assert summary.loc[("gpipe", 2, 4), "base_samples_per_s"] == 50.0
    assert summary.loc[("dp_pp", 4, 2), "speedup"] == pytest.approx(1.5)  # over split 2 at 2 nodes
    assert summary.loc[("dp_pp", 4, 2), "base_nodes"] == 2
    # split 4 is its own series, alone at its batch: no speedup at all, rather than 1 over itself
    assert math.isnan(summary.loc[("dp_pp", 4, 4), "speedup"]) and summary.loc[("dp_pp", 4, 4), "scaling_held"] is None
    # gpipe's global batch stays equal over nodes (one replica): strong scaling; dp_pp's grows: weak
    assert summary.loc[("gpipe", 2, 4), "scaling_held"] == "global batch"
    assert summary.loc[("dp_pp", 4, 2), "scaling_held"] == "per-replica batch"


def test_speedup_holds_the_global_batch_equal_where_the_sweep_did(tmp_path):
    """The default sweep's way: the per-replica batch halves as the nodes double, the global batch stays 32.
    Each configuration is alone at its per-replica batch; the series a reader compares, equal global batch,
    has three node counts, and the speedup is over it (it read 1 everywhere when taken per-replica batch)."""
    plan = plan_of(tmp_path, nodes=[1, 2, 4], batch_size=[32, 16, 8], strategies=["ddp"])
    speeds = {1: 100.0, 2: 180.0, 4: 300.0}
    kept = [p for p in plan.points if p.global_batch_size == 32]
    write(plan, [record_for(p, speeds[p.nodes]) for p in kept])
    summary = summarize_configurations(build_table(plan)).set_index(["nodes", "batch_size"])
    assert summary.loc[(2, 16), "speedup"] == pytest.approx(1.8) and summary.loc[(4, 8), "speedup"] == 3.0
    assert summary.loc[(4, 8), "scaling_efficiency"] == pytest.approx(0.75)
    assert set(summary["scaling_held"]) == {"global batch"} and summary["base_nodes"].tolist() == [1, 1, 1]


def test_ddp_is_compared_at_the_same_global_batch_else_at_the_same_per_replica_batch_and_says_which(tmp_path):
    """On 2 nodes × 1 rank, gpipe (one replica over both ranks) at batch 16 runs 16 samples a step, as ddp
    at batch 8 does: they are compared. gpipe at batch 8 runs 8, which no ddp point does: it falls back to
    ddp at batch 8 (16 samples a step) and says so. Tuned ddp is compared with default ddp."""
    plan = plan_of(tmp_path, strategies=["ddp", "gpipe"], nodes=[2], batch_size=[8, 16], threads=[1, 2])
    tuned = [replace(p, strategy_options=(("bucket_cap_mb", "1"),)) for p in plan.points if p.strategy == "ddp"]
    plan = replace(plan, points=plan.points + tuple(tuned))
    speeds = {("ddp", 8, 1): 100.0, ("ddp", 16, 1): 180.0, ("ddp", 8, 2): 140.0, ("ddp", 16, 2): 240.0}
    speeds |= {("gpipe", 8, 1): 50.0, ("gpipe", 16, 1): 90.0, ("gpipe", 8, 2): 70.0, ("gpipe", 16, 2): 60.0}

    def speed(p):
        return speeds[(p.strategy, p.batch_size, p.threads)] * (1.1 if p.strategy_options else 1.0)

    write(plan, [record_for(p, speed(p)) for p in plan.points])
    summary = summarize_configurations(build_table(plan))
    default_ddp = summary[(summary["strategy"] == "ddp") & (summary["strategy_options"] == "{}")]
    assert list(default_ddp["vs_baseline"]) == [1.0] * 4  # exactly, at every batch size and thread count
    assert set(default_ddp["baseline_held_equal"]) == {"global batch"}
    tuned_ddp = summary[summary["strategy_options"] != "{}"]
    assert tuned_ddp["vs_baseline"].to_list() == pytest.approx([1.1] * 4)
    gpipe = summary[summary["strategy"] == "gpipe"].set_index(["batch_size", "threads"])
    ddp_at = {(p.global_batch_size, p.threads): p.batch_size for p in plan.points if p.strategy == "ddp"}
    for (batch, threads), row in gpipe.iterrows():
        same_global = ddp_at.get((row["global_batch_size"], threads))
        expected = same_global or batch  # the ddp batch it is compared with
        assert row["baseline_held_equal"] == ("global batch" if same_global else "per-replica batch")
        assert row["vs_baseline"] == pytest.approx(
            speeds[("gpipe", batch, threads)] / speeds[("ddp", expected, threads)]
        )
        assert row["baseline_samples_per_s"] == speeds[("ddp", expected, threads)]
    assert gpipe.loc[(16, 1), "vs_baseline"] == pytest.approx(90.0 / 100.0)  # both 16 samples a step
    assert gpipe.loc[(8, 2), "baseline_held_equal"] == "per-replica batch"  # 8 samples; ddp's least is 16
    alone = summarize_configurations(
        build_table(replace(plan, points=tuple(p for p in plan.points if p.strategy != "ddp")))
    )
    assert set(alone["baseline_held_equal"]) == {"no ddp alike"} and alone["vs_baseline"].isna().all()


def test_repetitions_give_a_median_and_a_ci_from_six_on(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2], repetitions=6)
    overall = [103.0, 97.0, 100.0, 110.0, 95.0, 101.0]
    write(plan, [record_for(p, overall[p.repetition] * p.nodes, dropped=p.repetition) for p in plan.points])
    table = build_table(plan)
    summary = summarize_configurations(table).set_index("nodes")
    one = summary.loc[1]
    assert one["n_repetitions"] == 6
    assert one["rep_samples_per_s_median"] == pytest.approx(100.5)
    assert (one["rep_samples_per_s_ci_low"], one["rep_samples_per_s_ci_high"]) == median_ci(sorted(overall))
    assert bool(one["rep_samples_per_s_noisy"])  # [95, 110] is wider than ±5 % of 100.5
    assert one["median_repetition"] == 2  # 100.0: the lower of the two middle window throughputs
    assert one["samples_per_s_median"] == pytest.approx(100.0) and one["samples_per_s_n"] == 3
    assert one["warmup_dropped_steps"] == 5  # the most over repetitions
    assert summary.loc[2, "speedup"] == pytest.approx(2.0)
    few = summarize_configurations(table[table["repetition"] < 3]).set_index("nodes").loc[1]
    assert few["n_repetitions"] == 3 and pd.isna(few["rep_samples_per_s_ci_low"])


def test_records_of_another_measurement_version_are_flagged_and_left_out_unless_asked(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2], repetitions=2)
    old = {p.point_id for p in plan.points if p.repetition == 1}
    now, before = MEASUREMENT_VERSION, MEASUREMENT_VERSION - 1
    write(plan, [record_for(p, 100.0 if p.point_id not in old else 900.0, version=before if p.point_id in old else now)
                 for p in plan.points])  # fmt: skip
    table = build_table(plan)
    flagged = table.set_index("point_id")["other_measurement_version"]
    assert {pid for pid, other in flagged.items() if other} == old
    assert table.loc[table["point_id"].isin(old), "rep_samples_per_s_median"].isna().all()
    assert (table.loc[~table["point_id"].isin(old), "rep_samples_per_s_median"] == 100.0).all()
    summary = summarize_configurations(table)
    assert (summary["n_repetitions"] == 1).all() and (summary["repetitions_other_version"] == 1).all()
    both = summarize_configurations(table, include_other_versions=True)
    assert (both["n_repetitions"] == 2).all() and (both["rep_samples_per_s_median"] == 500.0).all()
    assert build_table(plan, include_other_versions=True)["rep_samples_per_s_median"].eq(500.0).all()


def test_step_statistics_warmup_oversubscription_and_split_share_are_columns(tmp_path):
    plan = plan_of(tmp_path, strategies=["filter"], nodes=[2])
    (point,) = plan.points
    steps = tuple(100.0 + i for i in range(20))
    write(
        plan, [record_for(point, 99.0, steps=steps, dropped=2, oversubscribed=True, facts={"split_flops_share": 0.81})]
    )
    row = build_table(plan).iloc[0]
    expected = Stats.of(list(steps))
    assert (row["samples_per_s_n"], row["samples_per_s_median"]) == (20, expected.median)
    assert (row["samples_per_s_ci_low"], row["samples_per_s_ci_high"]) == (expected.ci_low, expected.ci_high)
    assert row["samples_per_s_cv"] == pytest.approx(expected.cv) and not row["samples_per_s_noisy"]
    assert row["warmup_dropped_steps"] == 2 and row["split_flops_share"] == 0.81
    assert row["oversubscribed"] and row["any_oversubscribed"] and "4 threads" in row["cores_note"]


def test_the_table_survives_parquet_and_csv(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2, 4])
    write(plan, [record_for(plan.points[0]), record_for(plan.points[1], status="failed")])
    table = build_table(plan)
    save_table(table, parquet=tmp_path / "t.parquet", csv=tmp_path / "t.csv")
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert list(back.columns) == list(table.columns) and len(back) == 3
    assert back["samples_per_s_noisy"].dtype == "boolean" and back["n_repetitions"].dtype == "Int64"
    assert len(summarize_configurations(back)) == 1
