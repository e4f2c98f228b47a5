"""Predicted beside measured: per point, per strategy and overall.

    accuracy = 1 − |predicted − measured| / measured        (dimensionless; ParaDL's definition, Kahira et al.)

for the step time (measured: the point's median step time over its kept steps, `step_time_s_median`)
and for memory (measured: `tensor_peak_bytes`, the busiest rank's peak tensor memory; predicted:
`peak_memory_bytes`). An accuracy below 0 (a prediction off by more than the measurement) is kept as
it is, so averages are not flattered. Averages are plain means over the points of a strategy, then
over strategies (each strategy weighs the same, as the issue's target "average over strategies" reads),
with the number of points each rests on. Only points that ran to the end (status ok) count.

Seen or not (`per_configuration`): a configuration is *profiled* when the machine file holds layer
timings of its model (the prediction's compute came from them: the calibration ran that model,
perhaps at that very batch), and *never seen* otherwise (compute from the operator fits or the rates:
nothing of the model was measured). A predictor is judged on the never-seen ones; the profiled ones are
partly circular. Per configuration (a point's repetitions together) the measured time is the median
over repetitions of each one's median step (`rep_step_time_s_median`), the memory the median of their
peaks: run-to-run noise on a shared machine (±35 % here) then weighs less on a single figure. Its
`repeatability` is the accuracy one repetition has as a prediction of another (mean over ordered
pairs): what a model that knew this machine perfectly could expect against one run.

The oracle's recommendation against the measured best is scored in
ddlbench.analysis.analytic.recommendation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd


def accuracy(predicted: float, measured: float) -> float:
    return 1.0 - abs(predicted - measured) / measured


def join(table: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """The measured rows (status ok) with their predictions and per-point accuracies."""
    ok = table[table["status"] == "ok"]
    keep = [
        "point_id",
        "step_time_s",
        "samples_per_s",
        "peak_memory_bytes",
        "compute_s",
        "comm_exposed_s",
        "bubble_s",
        "bottleneck",
        "compute_source",
        "fits",
    ]
    pred = predictions[[c for c in keep if c in predictions.columns]].rename(
        columns={c: f"predicted_{c}" for c in keep if c != "point_id"}
    )
    joined = ok.merge(pred, on="point_id", how="inner")
    joined["time_accuracy"] = [
        accuracy(p, m) if pd.notna(m) and m > 0 else None
        for p, m in zip(joined["predicted_step_time_s"], joined["step_time_s_median"], strict=True)
    ]
    measured_memory = (
        joined["tensor_peak_bytes"] if "tensor_peak_bytes" in joined.columns else pd.Series([None] * len(joined))
    )
    joined["memory_accuracy"] = [
        accuracy(p, m) if pd.notna(m) and m > 0 else None
        for p, m in zip(joined["predicted_peak_memory_bytes"], measured_memory, strict=True)
    ]
    return joined


PROFILED, NEVER_SEEN = "profiled", "never seen"


def seen(compute_source: object) -> str:
    """PROFILED when a prediction's compute came from layer timings of the model, else NEVER_SEEN."""
    return PROFILED if str(compute_source) in ("layer_timings", "profile") else NEVER_SEEN  # "profile": earlier name


def per_configuration(joined: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (its repetitions together: `config_key`), with its measured time (median
    over repetitions of their median steps), measured memory (median peak), prediction, accuracies and
    `seen` (PROFILED or NEVER_SEEN)."""
    if joined.empty:
        return joined.assign(seen=[])
    key = "config_key" if "config_key" in joined.columns else "point_id"
    rows = []
    for _, group in joined.groupby(key, sort=False):
        first = group.iloc[0].to_dict()
        measured = float(group["step_time_s_median"].median())
        memory = (
            group["tensor_peak_bytes"].dropna() if "tensor_peak_bytes" in group.columns else pd.Series([], dtype=float)
        )
        measured_memory = float(memory.median()) if len(memory) else None
        times = [float(t) for t in group["step_time_s_median"].dropna() if t > 0]
        pairs = [(a, b) for i, a in enumerate(times) for j, b in enumerate(times) if i != j]
        first.update(
            repetitions=len(group),
            repetition_times_s=tuple(times),  # each repetition's median step: what the bootstrap resamples
            # how well one repetition predicts another: the accuracy a perfect model of this machine could
            # expect against a single run (mean over ordered pairs; None with one repetition)
            repeatability=sum(accuracy(a, b) for a, b in pairs) / len(pairs) if pairs else None,
            step_time_s_median=measured,
            tensor_peak_bytes=measured_memory,
            time_accuracy=accuracy(first["predicted_step_time_s"], measured) if measured > 0 else None,
            memory_accuracy=(
                accuracy(first["predicted_peak_memory_bytes"], measured_memory) if measured_memory else None
            ),
            seen=seen(first.get("predicted_compute_source")),
        )
        rows.append(first)
    return pd.DataFrame(rows)


@dataclass(frozen=True, kw_only=True)
class StrategyAccuracy:
    strategy: str
    points: int
    time_accuracy: float | None  # mean over the strategy's points
    time_worst: float | None
    memory_points: int
    memory_accuracy: float | None
    memory_worst: float | None


def by_strategy(joined: pd.DataFrame) -> list[StrategyAccuracy]:
    out = []
    for strategy, rows in joined.groupby("strategy", sort=True):
        time = rows["time_accuracy"].dropna().astype(float)
        memory = rows["memory_accuracy"].dropna().astype(float)
        out.append(
            StrategyAccuracy(
                strategy=str(strategy),
                points=len(time),
                time_accuracy=float(time.mean()) if len(time) else None,
                time_worst=float(time.min()) if len(time) else None,
                memory_points=len(memory),
                memory_accuracy=float(memory.mean()) if len(memory) else None,
                memory_worst=float(memory.min()) if len(memory) else None,
            )
        )
    return out


def overall(rows: Iterable[StrategyAccuracy]) -> tuple[float | None, float | None]:
    """(time, memory) accuracy averaged over strategies."""
    rows = list(rows)
    time = [r.time_accuracy for r in rows if r.time_accuracy is not None]
    memory = [r.memory_accuracy for r in rows if r.memory_accuracy is not None]
    return (sum(time) / len(time) if time else None, sum(memory) / len(memory) if memory else None)


def headline_figure(configurations: pd.DataFrame, column: str = "time_accuracy") -> float | None:
    """The mean over strategies of each strategy's mean over its configurations (the headline's average)."""
    means = configurations.groupby("strategy")[column].mean().dropna()
    return float(means.mean()) if len(means) else None


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A time-accuracy figure with its bootstrap interval over launches and what it says of a target."""

    value: float
    low: float
    high: float
    draws: int
    level: float

    def against(self, target: float) -> str:
        """ "met" when the whole interval is at or above `target`, "missed" when it is all below, else
        "undecided" (the launches cannot tell)."""
        if self.low >= target:
            return "met"
        if self.high < target:
            return "missed"
        return "undecided"


def time_accuracy_interval(
    configurations: pd.DataFrame, *, draws: int = 2000, level: float = 0.95, seed: int = 0
) -> Interval | None:
    """The headline time accuracy (headline_figure) with a percentile bootstrap interval over launches: each
    draw resamples every configuration's repetitions with replacement (its launches, the independent
    samples: steps of one launch are not), takes their median as the measured time again and recomputes the
    averaged accuracy. It says how much the figure owes to which launches were measured; the noise of the
    calibration the predictions came from (one launch of it) is not in it. None where a configuration has
    fewer than two repetitions: one launch says nothing of how the next would fall, and resampling it would
    give an interval of no width."""
    import numpy as np

    if configurations.empty or "repetition_times_s" not in configurations.columns:
        return None
    rows = configurations.dropna(subset=["time_accuracy"])
    value = headline_figure(rows)
    if value is None or any(len(t or ()) < 2 for t in rows["repetition_times_s"]):
        return None
    rng = np.random.default_rng(seed)
    predicted = rows["predicted_step_time_s"].to_numpy(dtype=float)
    times = [np.asarray(t, dtype=float) for t in rows["repetition_times_s"]]
    strategies = rows["strategy"].to_numpy()
    figures = []
    for _ in range(draws):
        measured = np.array([np.median(t[rng.integers(0, len(t), len(t))]) for t in times])
        accuracies = 1.0 - np.abs(predicted - measured) / measured
        per_strategy = [accuracies[strategies == name].mean() for name in np.unique(strategies)]
        figures.append(float(np.mean(per_strategy)))
    tail = (1.0 - level) / 2
    low, high = np.quantile(figures, [tail, 1.0 - tail])
    return Interval(value=value, low=float(low), high=float(high), draws=draws, level=level)
