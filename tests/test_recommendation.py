"""The recommendation's score: per cell (one scale's choice), the configuration the model predicts fastest
in samples/s against the one measured fastest, a hit when they agree or when the launches cannot tell the
recommended slower; and the report's section that shows the share."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from ddlbench.analysis.aggregate import build_table
from ddlbench.analysis.analytic.accuracy import NEVER_SEEN, PROFILED, join
from ddlbench.analysis.analytic.recommendation import RULE, TARGET, score
from ddlbench.analysis.keys import keys, point_columns
from ddlbench.analysis.stamps import file_digest, sweep_stamp
from ddlbench.point import Point
from ddlbench.report.render import render_report
from tests.report_data import between
from tests.test_aggregate import plan_of, record_for, write


def _point(strategy: str, *, nodes: int = 1, batch: int = 16, repetition: int = 0) -> Point:
    """resnet20 on 2 ranks a node: data parallel (a replica per rank) or gpipe (one replica over all ranks)."""
    return Point(
        model="resnet20", dataset="cifar10", strategy=strategy, nodes=nodes, ranks_per_node=2, batch_size=batch,
        threads=1, repetition=repetition, warmup_steps=2, steps=10, seed=0, learning_rate=0.05, timeout_s=600.0,
        split=2 * nodes if strategy == "gpipe" else 1, micro_batches=4 if strategy == "gpipe" else 1,
    )  # fmt: skip


def measured(configurations, *, source: str = "operators") -> pd.DataFrame:
    """accuracy.join of a table and its predictions: per (strategy, point options), the predicted samples/s
    and the measured window throughput of each launch (samples/s). `fits`: the model's memory verdict."""
    table, predictions = [], []
    for options, predicted, launches, *fits in configurations:
        for repetition, throughput in enumerate(launches):
            point = _point(**options, repetition=repetition)
            gbs = point.global_batch_size
            table.append(
                point_columns(point) | keys(point) | {
                    "point_id": point.point_id, "status": "ok", "global_batch_size": gbs,
                    "world_size": point.world_size, "samples_per_s_overall": throughput,
                    "step_time_s_median": gbs / throughput, "tensor_peak_bytes": 1e6,
                }
            )  # fmt: skip
            predictions.append(
                {"point_id": point.point_id, "step_time_s": gbs / predicted, "samples_per_s": predicted,
                 "peak_memory_bytes": 1e6, "compute_s": gbs / predicted, "comm_exposed_s": 0.0, "bubble_s": 0.0,
                 "bottleneck": "compute", "compute_source": source, "fits": fits[0] if fits else True}
            )  # fmt: skip
    return join(pd.DataFrame(table), pd.DataFrame(predictions))


SLOW = [100.0, 101.0, 99.0]


def test_a_recommendation_that_is_the_measured_best_is_a_hit():
    joined = measured([({"strategy": "ddp"}, 200.0, SLOW), ({"strategy": "gpipe"}, 100.0, [50, 51, 49])])
    (cell,) = score(joined).cells
    assert (cell.recommended, cell.measured_best, cell.hit, cell.ratio) == (
        "ddp (global batch 32)",
        "ddp (global batch 32)",
        True,
        1.0,
    )
    assert cell.verdict.startswith("agreement")
    assert cell.compared == ("ddp (global batch 32)", "gpipe mb4 (global batch 16)")
    assert cell.best_samples_per_s == pytest.approx(100.0) and cell.launches == (3, 3)


def test_a_recommendation_measurably_slower_over_three_and_three_launches_is_a_miss():
    result = score(measured([({"strategy": "ddp"}, 200.0, SLOW), ({"strategy": "zero2"}, 300.0, [70, 71, 69])]))
    (cell,) = result.cells
    assert (cell.recommended, cell.measured_best, cell.hit) == ("zero2", "ddp", False)
    assert cell.verdict.startswith("lower") and "3+3 launches" in cell.verdict
    assert cell.ratio == pytest.approx(70.0 / 100.0, rel=0.01) and cell.ci_high < 1.0
    assert (result.hits, result.n, result.share, result.met) == (0, 1, 0.0, False)


def test_a_recommendation_within_the_launches_noise_of_the_best_is_a_hit():
    """zero2's median (95) is below ddp's (100), but launches 10 % apart cannot tell them apart."""
    (cell,) = score(
        measured([({"strategy": "ddp"}, 200.0, [100, 110, 92]), ({"strategy": "zero2"}, 300.0, [95, 105, 90])])
    ).cells
    assert (cell.recommended, cell.measured_best, cell.hit) == ("zero2", "ddp", True)
    assert cell.verdict.startswith("not separable") and cell.ci_low < 1.0 < cell.ci_high


def test_one_launch_each_gives_no_interval_so_only_exact_agreement_counts():
    near = score(measured([({"strategy": "ddp"}, 200.0, [100.0]), ({"strategy": "zero2"}, 300.0, [99.0])]))
    (cell,) = near.cells
    assert not cell.hit and "one launch" in cell.verdict and "only exact agreement" in cell.verdict
    assert cell.ratio == pytest.approx(0.99) and cell.ci_low is None
    (same,) = score(measured([({"strategy": "ddp"}, 300.0, [100.0]), ({"strategy": "zero2"}, 200.0, [99.0])])).cells
    assert same.hit and same.launches == (1, 1)


def test_throughput_decides_where_the_strategies_run_different_global_batches():
    """ddp on 2 ranks at batch 16 runs 32 samples a step, gpipe 16: gpipe has the shorter step, measured and
    predicted, but ddp does more work per second; both sides are ranked in samples/s."""
    joined = measured([({"strategy": "ddp"}, 90.0, [80, 81, 79]), ({"strategy": "gpipe"}, 60.0, [64, 65, 63])])
    step = joined.groupby("strategy")[["step_time_s_median", "predicted_step_time_s"]].median()
    assert (step.loc["gpipe"] < step.loc["ddp"]).all()  # step time alone would pick gpipe on both sides
    (cell,) = score(joined).cells
    assert (cell.recommended, cell.measured_best, cell.hit) == (
        "ddp (global batch 32)",
        "ddp (global batch 32)",
        True,
    )
    assert cell.recommended_predicted_samples_per_s == 90.0 and cell.strategies == 2


def test_cells_with_one_strategy_are_skipped_and_each_scale_is_a_cell_of_its_own():
    joined = measured(
        [
            ({"strategy": "ddp", "nodes": 1}, 200.0, SLOW),
            ({"strategy": "zero2", "nodes": 1}, 100.0, [90, 91, 89]),
            ({"strategy": "ddp", "nodes": 2}, 300.0, SLOW),  # nodes 2: ddp alone, at two batches
            ({"strategy": "ddp", "nodes": 2, "batch": 8}, 250.0, SLOW),
        ]
    )
    result = score(joined)
    assert [c.label for c in result.cells] == ["model=resnet20 dataset=cifar10 nodes=1 ranks_per_node=2 precision=fp32"]
    assert (result.n, result.hits, result.share) == (1, 1, 1.0)


def test_a_configuration_predicted_not_to_fit_is_not_recommended():
    (cell,) = score(
        measured([({"strategy": "ddp"}, 200.0, SLOW), ({"strategy": "zero2"}, 900.0, [70, 71, 69], False)])
    ).cells
    assert cell.recommended == "ddp" and cell.hit


def test_the_disagreements_are_one_holm_family_and_seen_splits_the_score():
    """In each of two cells the recommended is 7 % slower, at p = 0.032: alone that is a miss, but a cell
    is one verdict of the score's family, and Holm over two asks p < 0.025 of the smaller: neither holds."""
    slower = [({"strategy": "ddp"}, 200.0, [100, 103, 97]), ({"strategy": "zero2"}, 300.0, [93, 95, 91])]
    alone = score(measured(slower))
    elsewhere = measured([({**options, "nodes": 2}, p, m) for options, p, m in slower], source="layer_timings")
    twice = score(pd.concat([measured(slower), elsewhere], ignore_index=True))
    assert alone.cells[0].verdict.startswith("lower")  # p = 0.032 alone; 2 × 0.032 > 0.05 in a family of two
    assert all(c.verdict.startswith("not separable") for c in twice.cells) and twice.hits == 2
    assert twice.of(PROFILED).n == 1 and twice.of(NEVER_SEEN).n == 1
    with pytest.raises(ValueError, match="seen is"):
        twice.of("sometimes")


def test_a_table_without_the_throughputs_is_refused_with_their_names():
    joined = measured([({"strategy": "ddp"}, 200.0, SLOW), ({"strategy": "zero2"}, 100.0, SLOW)])
    with pytest.raises(ValueError, match="samples_per_s_overall"):
        score(joined.drop(columns=["samples_per_s_overall"]))
    assert score(joined.iloc[0:0]).share is None


def test_the_report_states_the_share_its_n_and_the_rule(tmp_path):
    machine = tmp_path / "machine.yaml"
    shutil.copy("workflow/machines/abci_v100.yaml", machine)
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1, 2], repetitions=3, machine=str(machine))
    stamp = sweep_stamp(plan.config) | {"machine_sha256": file_digest(machine)}  # what ddlbench.finish writes
    speed = {("ddp", 1): 100.0, ("zero2", 1): 70.0, ("ddp", 2): 150.0, ("zero2", 2): 180.0}
    write(plan, [record_for(p, speed[(p.strategy, p.nodes)] + p.repetition) for p in plan.points])
    predicted = {"ddp": 200.0, "zero2": 100.0}  # right at 1 node, wrong (and measurably so) at 2
    pd.DataFrame(
        {"point_id": p.point_id, "step_time_s": p.global_batch_size / predicted[p.strategy],
         "samples_per_s": predicted[p.strategy], "peak_memory_bytes": 1e6, "compute_s": 0.1, "comm_exposed_s": 0.0,
         "bubble_s": 0.0, "bottleneck": "compute", "compute_source": "operators"} | stamp
        for p in plan.points
    ).to_csv(plan.config.sweep_dir / "predictions.csv", index=False)  # fmt: skip
    html = render_report(plan.config, build_table(plan))
    section = between(html, '<section id="predictions">', "</section>")
    assert "Recommendation: 1 of 2 cells (50.0 %) recommend the measured best or one within its interval" in section
    assert f"target ≥ {100 * TARGET:.0f} % (not met)" in section
    assert RULE.replace("'", "&#39;") in section
    assert "<th>Recommended ÷ best [95 % CI]</th>" in section
    assert section.count('<td class="text">yes</td>') == 1 and section.count('<td class="text">no</td>') == 1
