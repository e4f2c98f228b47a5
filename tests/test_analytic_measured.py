"""Predictions against measurements, through the real workflow: a sweep with `calibrate:` measures this
machine first (collectives and layer timings), predicts every point in the DAG, runs the points, and its
report sets predicted beside measured.

Step times are judged only by what a machine-wide slowdown cannot fake: ratios between configurations
(a predicted time(B)/time(A) against the measured one) and the oracle's pick against the measured fastest.
Both are judged over launches (each configuration runs MIN_LAUNCHES times; a launch's figure is its
median step), by the test of ddlbench.analysis.verdicts: run to run, a point's step time on these hosts
moves by ±35 %, far more than between its steps, so only the spread of launches says how sure a measured
ratio is. Everything twice as slow leaves every ratio, interval and verdict as it was."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest
import yaml

from ddlbench.analysis.analytic.accuracy import by_strategy, join
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.oracle import consult
from ddlbench.analysis.keys import comparison_key
from ddlbench.analysis.verdicts import ALPHA, MIN_LAUNCHES, Contrast, contrast, judge
from ddlbench.statistics import student_t_quantile
from tests.conftest import run_snakemake

# predicted ratios judged against timed launches: alone on the machine (make test runs these after the parallel part)
pytestmark = pytest.mark.serial

STRATEGIES = ["ddp", "zero2", "fsdp", "gpipe", "1f1b"]
# (strategy, per-replica batch, micro-batches) on 2 ranks: the data-parallel ones at batch 16 and the
# pipelines (one replica over both ranks) at batch 32 all run a global batch of 32, so the oracle's pick
# is checked among five; ddp at batch 8 gives a ratio within one strategy
CONFIGURATIONS = {
    ("ddp", 8, 1),
    ("ddp", 16, 1),
    ("zero2", 16, 1),
    ("fsdp", 16, 1),
    ("gpipe", 32, 2),
    ("1f1b", 32, 4),
}
# Ratios compared where the two sides use the machine alike: both ranks computing at once (data parallel),
# or both alternating (pipelines). Between a pipeline and data parallelism the measured ratio depends on
# how many cores are free: a pipeline's idle stage leaves its core to another process, so on a loaded
# 2-core host (load average 8–9) the 1.8× predicted for gpipe against ddp at equal global batch measured
# 1.09× in one run and 2.2× in the next. There only the pick's order is checked.
RATIOS = [
    (("ddp", 8), ("ddp", 16)),  # the compute per step against the batch (profiled at 4, 8, 16)
    (("ddp", 16), ("zero2", 16)),  # sharding the optimizer state: the same work, other collectives
    (("ddp", 16), ("fsdp", 16)),  # sharding the parameters: all-gathers before each block
    (("gpipe", 32), ("1f1b", 32)),  # two schedules, 2 and 4 micro-batches: the bubble against the batch
]
# How far a predicted ratio may be off: each step time within ±10 % (issue 12's target for the model's time
# accuracy, ≥ 92 % on average) puts a ratio within 1.1/0.9 = 1.22, rounded up to 1.25. The error of a
# ratio, measured ÷ predicted over launches, is judged against the measurement's own spread: it fails when
# |log error| exceeds log TOLERANCE + t·se (se its standard error over launches, t Student's at the
# Bonferroni level over the RATIOS: a prediction within TOLERANCE fails at most ALPHA of the time), and it
# fails at GROSS or beyond whatever the spread (a 1.5× error is never excused by noise). A pick fails when
# a strategy the model put more than TOLERANCE behind it is measured faster (Holm over the group).
TOLERANCE = 1.25
GROSS = 1.5


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("analytic")
    suite = root / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "cal",
                "results_dir": str(root / "results"),
                "ranks_per_node": 2,
                "matmul_sizes": [256],
                "conv_shapes": [[8, 32, 16, 3]],
                "memory_bytes": 16777216,
                "precisions": ["fp32"],
                "collectives": ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"],
                "message_bytes": [4096, 65536, 1048576],
                "warmup": 2,
                "iterations": 12,  # layer timings median of 12 steps a batch: a few slow steps move them less
                "layer_timings": [{"model": "resnet8", "dataset": "cifar10", "batch_sizes": [4, 8, 16]}],
                "fsdp_units": True,  # FSDP2's own cost per unit, on a toy: most of fsdp's step beyond ddp's here
            }
        )
    )
    batches, micro = [8, 16, 32], [1, 2, 4]
    sweep = root / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "measured",
                "results_dir": str(root / "results"),
                "models": ["resnet8"],
                "datasets": ["cifar10"],
                "strategies": STRATEGIES,
                "nodes": [1],
                "ranks_per_node": [2],
                "batch_size": batches,
                "micro_batches": micro,
                "threads": [1],
                "warmup_steps": 2,
                "steps": 5,
                "repetitions": MIN_LAUNCHES,
                "calibrate": str(suite),
                "exclude": [
                    {"strategy": s, "batch_size": b, "micro_batches": m}
                    for s, b, m in itertools.product(STRATEGIES, batches, micro)
                    if (s, b, m) not in CONFIGURATIONS
                ],
            }
        )
    )
    result = run_snakemake("--cores", "2", "--configfile", str(sweep))
    assert result.returncode == 0, result.stderr[-3000:]
    folder = root / "results" / "measured"
    return folder, pd.read_parquet(folder / "table.parquet"), pd.read_csv(folder / "predictions.csv")


def _launches(joined: pd.DataFrame) -> dict[tuple[str, int], tuple[list[float], float]]:
    """(strategy, batch_size) → (each launch's median step time in s, the predicted step time in s)."""
    out = {}
    for (strategy, batch), rows in joined.groupby(["strategy", "batch_size"]):
        (predicted,) = set(rows["predicted_step_time_s"])  # one configuration, one prediction
        out[(str(strategy), int(batch))] = (rows.sort_values("repetition")["step_time_s_median"].tolist(), predicted)
    return out


def _in_words(joined: pd.DataFrame, predictions: pd.DataFrame) -> str:
    """Per configuration: each launch's median step and the prediction's terms, in ms (a failure's evidence:
    pytest cuts a data frame to its first and last rows)."""
    lines = []
    for (strategy, batch), rows in joined.groupby(["strategy", "batch_size"]):
        mine = predictions[(predictions["strategy"] == strategy) & (predictions["batch_size"] == batch)]
        (point,) = mine[["compute_s", "comm_exposed_s", "bubble_s", "step_time_s"]].drop_duplicates().to_dict("records")
        times = " ".join(f"{1e3 * t:.2f}" for t in rows.sort_values("repetition")["step_time_s_median"])
        lines.append(
            f"{strategy} b{batch}: launches {times} ms; predicted {1e3 * point['step_time_s']:.2f} ms = compute "
            f"{1e3 * point['compute_s']:.2f} + exposed comm {1e3 * point['comm_exposed_s']:.2f} + bubble "
            f"{1e3 * point['bubble_s']:.2f}"
        )
    return "\n".join(lines)


def _interval(item: Contrast, level: float) -> tuple[float, float]:
    """The `level` interval of the contrast's ratio: Welch's, exp(d ± t_ν·se), with se taken back from
    its 95 % interval."""
    if item.ci_high == item.ratio:  # no spread on either side
        return item.ratio, item.ratio
    se = math.log(item.ci_high / item.ratio) / student_t_quantile(0.975, item.dof)
    half = student_t_quantile(0.5 + level / 2, item.dof) * se
    return item.ratio * math.exp(-half), item.ratio * math.exp(half)


def refuted_ratios(launches, pairs=RATIOS) -> list[str]:
    """The pairs whose measured ratio B/A refutes the predicted one (see TOLERANCE and GROSS), in words.

    B's launches are divided by the predicted ratio, so the contrast's ratio is measured ÷ predicted."""
    level = 1 - ALPHA / len(pairs)
    refuted = []
    for a, b in pairs:
        (times_a, predicted_a), (times_b, predicted_b) = launches[a], launches[b]
        predicted = predicted_b / predicted_a
        item = contrast(times_a, [t / predicted for t in times_b])
        assert item.tested, (a, b, item.why_no_test)
        low, high = _interval(item, level)
        spread = math.log(high / item.ratio)  # t·se at the Bonferroni level
        allowed = min(math.log(TOLERANCE) + spread, math.log(GROSS))
        if abs(math.log(item.ratio)) > allowed:
            refuted.append(
                f"{b} / {a}: predicted ×{predicted:.3g}, measured ÷ predicted ×{item.ratio:.3g} "
                f"[{low:.3g}, {high:.3g}] ({level:.2%} interval over {item.n_a}+{item.n_b} launches), beyond "
                f"×{math.exp(allowed):.3g} (TOLERANCE {TOLERANCE} widened by the launches' spread, at most {GROSS})"
            )
    return refuted


def oracle_pick(rows: pd.DataFrame) -> tuple[str, str, int]:
    """In one like-for-like group: the strategy with the lowest predicted step time (the oracle's pick),
    the one with the lowest measured median step, and how many strategies the group has."""
    per = rows.groupby("strategy").agg(
        measured=("step_time_s_median", "median"), predicted=("predicted_step_time_s", "median")
    )
    return str(per["predicted"].idxmin()), str(per["measured"].idxmin()), len(per)


def contradicted_picks(joined: pd.DataFrame) -> list[str]:
    """Groups (like for like) where a strategy the model put more than TOLERANCE behind the oracle's pick
    is measured faster than it, separably over launches (Holm over the group), in words."""
    groups: dict[tuple, list[int]] = {}
    for index, row in zip(joined.index, joined.to_dict("records"), strict=True):
        groups.setdefault(comparison_key(row), []).append(index)
    contradicted = []
    for indices in groups.values():
        rows = joined.loc[indices]
        if rows["strategy"].nunique() < 2:
            continue
        best, measured_best, _ = oracle_pick(rows)
        group = " ".join(
            f"{name}={value}" for name, value in comparison_key(rows.iloc[0].to_dict()) if value is not None
        )
        times = {s: r.sort_values("repetition")["step_time_s_median"].tolist() for s, r in rows.groupby("strategy")}
        predicted = rows.groupby("strategy")["predicted_step_time_s"].median()
        others = [s for s in times if s != best]
        for other, verdict in zip(others, judge([contrast(times[best], times[o]) for o in others]), strict=True):
            behind = predicted[other] / predicted[best]
            if verdict.direction == "lower" and behind > TOLERANCE:
                contradicted.append(
                    f"{group}: the oracle picks {best}, predicted ×{behind:.3g} ahead of {other}, but {other} "
                    f"takes {verdict.text} of {best}'s step time (measured fastest: {measured_best})"
                )
    return contradicted


def _slowed(joined: pd.DataFrame, factor: float) -> pd.DataFrame:
    return joined.assign(step_time_s_median=joined["step_time_s_median"] * factor)


@pytest.mark.slow
def test_every_point_is_predicted_from_the_machine_calibrated_first(measured):
    folder, table, predictions = measured
    assert (folder / "machine.yaml").exists()
    assert set(predictions["point_id"]) == set(table["point_id"])
    assert len(table) == len(CONFIGURATIONS) * MIN_LAUNCHES
    # the calibration timed resnet8's layers, so compute comes from those timings, not from FLOP rates
    assert set(predictions["compute_source"]) == {"layer_timings"}
    html = (folder / "report.html").read_text()
    assert "Predicted beside measured" in html
    for strategy in STRATEGIES:
        assert f'<td class="text">{strategy}</td>' in html


@pytest.mark.slow
def test_memory_is_predicted_within_a_fifth_of_the_measured_peak(measured):
    """The model counts what the allocator holds (ddlbench.train.memory); transient workspaces of single
    kernels are what it leaves out. On resnet20 at batch 32 it was within 11 % for these strategies."""
    _, table, predictions = measured
    rows = {r.strategy: r for r in by_strategy(join(table, predictions))}
    assert set(rows) == set(STRATEGIES)
    for strategy, row in rows.items():
        assert row.memory_worst is not None and row.memory_worst >= 0.8, (strategy, row)


@pytest.mark.slow
def test_predicted_ratios_between_configurations_hold_over_launches(measured):
    _, table, predictions = measured
    joined = join(table, predictions)
    launches = _launches(joined)
    # the compute grows with the batch; by how much is the host's (the per-step fixed part weighs more on a
    # faster core: ×1.27 predicted on one CI host), and the launches judge whether it holds
    assert launches[("ddp", 16)][1] > launches[("ddp", 8)][1]
    assert refuted_ratios(launches) == [], _in_words(joined, predictions)
    assert refuted_ratios(_launches(_slowed(joined, 2.0))) == []  # a machine twice as slow changes nothing


@pytest.mark.slow
def test_the_oracles_pick_is_not_beaten_by_a_strategy_it_put_behind(measured):
    folder, table, predictions = measured
    joined = join(table, predictions)
    predicted_best, _, strategies = oracle_pick(joined[joined["global_batch_size"] == 32])
    assert strategies == len(STRATEGIES)  # all five at one global batch: one like-for-like group
    # the pick is the oracle's: consulted on the calibrated machine, it recommends the same strategy
    machine = MachineModel.from_file(folder / "machine.yaml")
    (verdict,) = consult("resnet8", "cifar10", machine, nodes=[1], ranks_per_node=2, global_batch=32,
                         strategies=STRATEGIES)  # fmt: skip
    assert verdict.recommended.setting.strategy == predicted_best, verdict.reason
    assert contradicted_picks(joined) == [], _in_words(joined, predictions)
    assert contradicted_picks(_slowed(joined, 2.0)) == []


def test_the_ratio_check_refutes_a_wrong_ratio_and_not_a_slowdown():
    """The decision rule on launches whose answer is known: B takes twice A's time, ±3 % run to run."""
    a, b = [1.00, 1.03, 0.97], [2.04, 1.95, 2.01]

    def launches(predicted_b: float, factor: float = 1.0):
        return {("a", 1): ([factor * t for t in a], 1.0), ("b", 1): ([factor * t for t in b], predicted_b)}

    pairs = [(("a", 1), ("b", 1))]
    assert refuted_ratios(launches(2.0), pairs) == []
    assert refuted_ratios(launches(2.0, factor=2.0), pairs) == []  # everything twice as slow
    assert refuted_ratios(launches(2.2), pairs) == []  # off by 10 %: within TOLERANCE
    assert len(refuted_ratios(launches(1.0), pairs)) == 1  # predicted equal, measured twice
    assert len(refuted_ratios(launches(3.0), pairs)) == 1  # a term counted twice
    # the same launches with a spread of ±35 %: a 1.5× error still fails, noise excuses no gross error,
    # while a right prediction passes there too
    noisy = {("a", 1): ([0.7, 1.0, 1.35], 1.0), ("b", 1): ([2.7, 1.4, 2.0], 3.0)}
    assert len(refuted_ratios(noisy, pairs)) == 1
    assert refuted_ratios({("a", 1): ([0.7, 1.0, 1.35], 1.0), ("b", 1): ([2.7, 1.4, 2.0], 2.0)}, pairs) == []
    # a 1.4× error is excused by ±35 % launches (within 1.25 widened by their spread), not by ±3 % ones
    assert refuted_ratios({("a", 1): ([0.7, 1.0, 1.35], 1.0), ("b", 1): ([2.7, 1.4, 2.0], 2.8)}, pairs) == []
    assert len(refuted_ratios(launches(2.8), pairs)) == 1
