"""One global batch (Point.global_batch_size) and one "like for like" (keys.comparison_key), used by the
table, vs ddp, the oracle and its pick check, `fit --cheapest` and the analytic Setting, on a dp_pp, a
tensor and a dp_tp (hybrid) series; and `fit --cheapest` claims "surely" only from launches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddlbench.analysis.aggregate import build_table
from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.oracle import consult
from ddlbench.analysis.analytic.predict import predict
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.analysis.empirical.cheapest import ONE_LAUNCH, cheapest, global_batch, parse_target
from ddlbench.analysis.empirical.series import Series, series_from_table
from ddlbench.analysis.keys import comparison_key, config_key
from ddlbench.point import Point
from tests.test_aggregate import plan_of, record_for, write
from tests.test_analytic_model import cpu_machine

STRATEGIES = ["ddp", "dp_pp", "tensor", "dp_tp"]


def speed(point: Point) -> float:
    """A distinct window throughput per configuration (samples/s), ±1 % between its two launches."""
    rank = STRATEGIES.index(point.strategy)
    return (
        100.0 * point.world_size**0.8 * (1 + 0.1 * rank) * (point.batch_size / 8) ** 0.5 * (1 + 0.01 * point.repetition)
    )


@pytest.fixture
def swept(tmp_path):
    """resnet8 (ddp, dp_pp) and gpt_tiny (ddp, dp_pp, tensor, dp_tp) on 1, 2 and 4 nodes of 2 ranks at
    batch 8 and 16, two launches each (the pairs that cannot run are skipped by the plan)."""
    plan = plan_of(
        tmp_path, models=["resnet8", "gpt_tiny"], datasets=["cifar10", "tokens_small"], strategies=STRATEGIES,
        nodes=[1, 2, 4], ranks_per_node=[2], batch_size=[8, 16], micro_batches=[2], split=[0], repetitions=2,
    )  # fmt: skip
    assert {p.strategy for p in plan.points} == set(STRATEGIES)
    write(plan, [record_for(p, speed(p)) for p in plan.points])
    return plan, build_table(plan)


def test_the_table_and_vs_ddp_hold_the_global_batch_of_point_equal(swept):
    plan, table = swept
    by_id = {p.point_id: p for p in plan.points}
    for row in table.to_dict("records"):  # the table's sizes are the Point's
        point = by_id[row["point_id"]]
        assert (row["world_size"], row["replicas"], row["global_batch_size"]) == (
            point.world_size,
            point.replicas,
            point.global_batch_size,
        )
    summary = summarize_configurations(table)
    first = {config_key(p): p for p in plan.points if p.repetition == 0}
    ddp = {config_key(p): p for p in first.values() if p.strategy == "ddp"}
    checked = {"global batch": 0, "per-replica batch": 0}
    for row in summary.to_dict("records"):
        point = first[row["config_key"]]
        # the ddp it should be compared with, built independently of the keys: the same point run by
        # ddp (one rank per replica) at the per-replica batch that gives the same global batch
        per_rank, rest = divmod(point.global_batch_size, point.world_size)
        alike = replace(point, strategy="ddp", split=1, micro_batches=1, strategy_options=(), batch_size=per_rank)
        same_batch = replace(point, strategy="ddp", split=1, micro_batches=1, strategy_options=())
        if not rest and config_key(alike) in ddp:
            expected, held = alike, "global batch"
        else:
            expected, held = same_batch, "per-replica batch"
        assert row["baseline_held_equal"] == held, point.point_id
        assert row["baseline_config_key"] == config_key(expected)
        assert row["vs_baseline"] == pytest.approx(
            (speed(point) + speed(replace(point, repetition=1)))
            / (speed(expected) + speed(replace(expected, repetition=1)))
        )
        checked[held] += 1
    assert checked["global batch"] >= 8 and checked["per-replica batch"] >= 3  # both paths are exercised
    rows = summary.set_index(["model", "strategy", "nodes", "batch_size"])
    # the three kinds, spelled out: 2 dp_pp replicas of batch 16 and 4 ddp ranks of batch 8 run 32 samples;
    # tensor over all 4 ranks at batch 16 runs 16, which no ddp on 4 ranks runs (4 × 8 = 32 is its least);
    # gpt_tiny's 4 heads do not split 8 ways: no tensor point on 4 nodes
    assert rows.loc[("resnet8", "dp_pp", 2, 16), "global_batch_size"] == 32
    assert rows.loc[("resnet8", "dp_pp", 2, 16), "baseline_held_equal"] == "global batch"
    assert rows.loc[("gpt_tiny", "dp_tp", 4, 16), "global_batch_size"] == 64  # 4 replicas of 2 ranks
    assert rows.loc[("gpt_tiny", "dp_tp", 4, 16), "baseline_held_equal"] == "global batch"  # ddp at batch 8
    assert rows.loc[("gpt_tiny", "tensor", 2, 16), "global_batch_size"] == 16
    assert rows.loc[("gpt_tiny", "tensor", 2, 16), "baseline_held_equal"] == "per-replica batch"
    assert rows.loc[("gpt_tiny", "tensor", 1, 16), "baseline_held_equal"] == "global batch"  # ddp 2 × 8


def test_comparison_key_groups_a_table_row_as_its_point(swept):
    plan, table = swept
    by_id = {p.point_id: p for p in plan.points}
    rows = table.to_dict("records")
    for row in rows:
        assert comparison_key(row) == comparison_key(by_id[row["point_id"]])
    summary = summarize_configurations(table)
    groups: dict[tuple, set[tuple[str, int]]] = {}
    for row in summary.to_dict("records"):
        groups.setdefault(comparison_key(row), set()).add((row["strategy"], row["batch_size"]))
    # gpt_tiny on 4 nodes × 2 ranks, by samples a step: ddp b·8, dp_pp and dp_tp b·4 (4 replicas of 2)
    at_four = {
        dict(key)["global_batch_size"]: members
        for key, members in groups.items()
        if dict(key)["model"] == "gpt_tiny" and dict(key)["nodes"] == 4
    }
    assert at_four == {
        128: {("ddp", 16)},
        64: {("ddp", 8), ("dp_pp", 16), ("dp_tp", 16)},
        32: {("dp_pp", 8), ("dp_tp", 8)},
    }


def test_cheapest_step_time_divides_the_points_global_batch_and_refuses_what_is_no_layout(swept):
    plan, table = swept
    series = [s for s in series_from_table(table, figures=("samples_per_s",)) if s.fixed["model"] == "gpt_tiny"]
    assert {s.fixed["strategy"] for s in series} == {"ddp", "dp_pp", "tensor", "dp_tp"}
    answer = cheapest(series, parse_target("step_time_s<=1000"), at=[(8.0,)])
    assert answer["choices"] and answer["band"] == ""  # two launches everywhere: a run-to-run band
    template = {(p.strategy, p.batch_size): p for p in plan.points if p.model == "gpt_tiny"}
    seen = set()
    for choice in answer["choices"]:
        s = next(s for s in series if s.label == choice["label"])
        point = template[(s.fixed["strategy"], s.fixed["batch_size"])]
        nodes = int(choice["x"])
        world = nodes * point.ranks_per_node
        at = replace(point, nodes=nodes, split=world if point.strategy == "tensor" else point.split)
        assert choice["global_batch_size"] == at.global_batch_size, choice["label"]
        assert choice["value"] == pytest.approx(at.global_batch_size / choice["samples_per_s"])
        seen.add((point.strategy, nodes))
    assert {("dp_pp", 8), ("dp_tp", 8), ("ddp", 8), ("tensor", 2)} <= seen  # extrapolated too
    # tensor over 16 ranks cannot split gpt_tiny's 4 heads: the catalog refuses it, as a plan would
    assert len(answer["refused"]) == 2  # batch 8 and batch 16
    for refused in answer["refused"]:
        assert refused["x"] == 8.0 and refused["label"].startswith("tensor")
        assert "tensor parallelism over 16 ranks" in refused["why"] and "heads" in refused["why"]
    # a dp_pp of 4-stage replicas on 3 nodes of 2 ranks has no whole replica: no candidate, and why
    odd = Series(
        figure="samples_per_s", parameters=("nodes",), label="dp_pp split=4", x=((2.0,), (4.0,)),
        values=((100.0, 101.0), (190.0, 192.0)),
        fixed={"strategy": "dp_pp", "split": 4, "ranks_per_node": 2, "batch_size": 8, "dataset": "cifar10"},
    )  # fmt: skip
    assert global_batch(odd, 3.0) == "6 ranks at 3 nodes do not divide into replicas of split=4"
    answer = cheapest([odd], parse_target("step_time_s<=10"), at=[(3.0,), (8.0,)])
    assert [r["x"] for r in answer["refused"]] == [3.0]
    assert {c["x"]: c["global_batch_size"] for c in answer["choices"]} == {2.0: 8, 4.0: 16, 8.0: 32}


def test_surely_rests_on_launches_and_one_launch_per_configuration_claims_nothing():
    nodes = [1.0, 2.0, 4.0, 8.0]
    rate = [n / (0.01 + 0.0005 * n) for n in nodes]
    fixed = {"strategy": "ddp", "dataset": "cifar10", "batch_size": 32, "ranks_per_node": 1}

    def series(values):
        return Series(
            figure="samples_per_s", parameters=("nodes",), label="ddp", x=tuple((n,) for n in nodes),
            values=tuple(values), fixed=fixed,
        )  # fmt: skip

    target = parse_target(f"samples_per_s>={0.5 * rate[-1]:g}")  # far inside any band at 8 nodes
    launches = cheapest([series((r * 0.99, r * 1.01) for r in rate)], target)
    assert launches["band"] == "" and launches["cheapest_sure"] is not None
    assert all(c["band"] == "95 % prediction interval over launches" for c in launches["choices"])
    # the same centres, one launch each (a slight misfit, so a band exists): nothing is sure
    one = cheapest([series((r * (1.01 if k % 2 else 0.99),) for k, r in enumerate(rate))], target)
    assert one["band"] == ONE_LAUNCH and one["choices"] and one["cheapest_sure"] is None
    assert all(not c["sure"] and c["band"] == ONE_LAUNCH for c in one["choices"])
    assert [c["x"] for c in one["choices"]] == [c["x"] for c in launches["choices"]]  # the centres still meet it
    # a single configuration with one launch is enough to withhold "surely" from its series
    mixed = cheapest([series([(r * 0.99, r * 1.01) for r in rate[:-1]] + [(rate[-1],)])], target)
    assert mixed["cheapest_sure"] is None and "1 of 4 configurations have one launch" in mixed["band"]


def test_a_setting_is_its_point_and_predicts_samples_of_the_points_global_batch(swept):
    plan, _ = swept
    machine = cpu_machine()
    for point in (p for p in plan.points if p.repetition == 0 and p.nodes <= 2):
        setting = Setting.of_point(point)
        assert setting.point_id == point.point_id
        assert (setting.world_size, setting.replicas, setting.global_batch_size) == (
            point.world_size,
            point.replicas,
            point.global_batch_size,
        )
        p = predict(setting, machine, search_batch=False)
        assert p.global_batch_size == point.global_batch_size
        assert p.samples_per_s == pytest.approx(point.global_batch_size / p.step_time_s)
    # a layout a strategy cannot have is refused, not simulated as one layout and counted as another
    with pytest.raises(ValueError, match="split must be 4, not 1"):
        Setting(model="gpt_tiny", dataset="tokens_small", strategy="tensor", nodes=2, ranks_per_node=2, batch_size=8)
    with pytest.raises(ValueError, match="split must be 1, not 2"):
        Setting(model="resnet8", dataset="cifar10", strategy="ddp", nodes=1, ranks_per_node=2, batch_size=8, split=2)


def test_the_oracle_asks_every_strategy_at_the_one_global_batch_or_says_why_not():
    for batch in (48, 50):  # 50 samples do not divide over 4 or 8 data-parallel ranks
        (verdict,) = consult("gpt_tiny", "tokens_small", cpu_machine(), nodes=[2], ranks_per_node=4, global_batch=batch)
        for candidate in verdict.ranked:
            s = candidate.setting
            if s.global_batch_size != batch:
                assert candidate.prediction is None and f"global batch {batch} does not divide" in candidate.refused
            elif candidate.prediction is not None:
                assert candidate.prediction.global_batch_size == batch
        runs_other = [c for c in verdict.ranked if c.setting.global_batch_size != batch]
        assert bool(runs_other) == (batch == 50)
