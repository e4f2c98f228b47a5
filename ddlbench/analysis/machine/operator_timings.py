"""The machine file's `operator_timings`: what an `operators` point measured, per shape, for later fits.

Per precision, one entry per count of ranks that timed at once on one node (a point times each shape by
every count of its `operator_at_once` in turn; an entry without `at_once`, from a point before that, was
timed by all the point's ranks):
    {precision, threads, ranks_per_node, point_id,
     autograd_call_s: {value: t1 − (t5 − t1)/4, chain1_s: figure, chain5_s: figure},
     update_s_per_param: figure (the optimizer's step by this count of ranks at once; the first precision's),
     samples: [{kind, batch, in_channels, height, width, out_channels, kernel, stride,
                forward_s, backward_s, n}]}
forward_s and backward_s are medians, in seconds, over every rank's timed repetitions of that shape
in every round pooled (n of them); the fit (ddlbench.analysis.analytic.operators) is made when a prediction reads the
file, so a better fit needs no new calibration. Torch-free.

Each repetition is first set to one host speed: the point's ranks probe the host between shapes
(ddlbench.train.calibration.operator_kernel) as well as at its start and end, and a repetition is multiplied by

    the median compute_s of every probe of its turn (all ranks; what the machine file's host_probes keeps)
    ÷ its rank's compute_s at the moment it was timed (linear between that rank's probes of the turn before and
      after it, each probe the median of itself and its two neighbours)

so every shape reads as if timed at the speed the machine file's probes say the point had
(ddlbench.analysis.machine.host_speed sets later points against that same figure). An entry without a time or a
rank without two probes of its turn (a record from before the probes between shapes) is kept as timed. Where
the host's speed flickers faster than the probes come, the line between them does not follow it and the
effect is a level: every repetition brought to the probes' median (on the fifteenth scoring set's calibration,
predictions about a seventh lower than from the repetitions as timed: docs/analytic.md).
"""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from ddlbench.statistics import percentile
from ddlbench.train.calibration.records import CalibrationRankResult, CalibrationRecord, stats_figure


def operator_timings(record: CalibrationRecord) -> list[dict[str, Any]]:
    """One `operator_timings` entry per precision the point timed and count of ranks that timed at once
    (shapes a rank refused are left out); the entries of one point share its point_id."""
    ranks = sorted(record.ranks, key=lambda rank: rank.rank)
    point = record.point
    out = []
    counts = sorted({int(entry.get("at_once", len(ranks))) for rank in ranks for entry in rank.measurements}) or [
        len(ranks)
    ]
    for precision in point.precisions:
        for at_once in counts:
            entry = _entry(record, ranks, precision, at_once)
            if entry is not None:
                out.append(entry)
    return out


def _entry(
    record: CalibrationRecord, ranks: list[CalibrationRankResult], precision: str, at_once: int
) -> dict[str, Any] | None:
    """The entry of one precision and one count of ranks timing at once (None: no shape timed)."""
    chains: dict[str, list[float]] = {"chain1_s": [], "chain5_s": []}
    updates: list[float] = []  # seconds a parameter of the optimizer's step, every rank's repetitions
    first_precision = record.point.precisions[0]  # the step is fp32 whatever the precision: one entry keeps it
    samples: dict[tuple, dict[str, Any]] = {}  # by shape: a shape timed in several rounds is one sample
    held = 1  # the most forward outputs a shape's timing kept alive (operator_kernel.outputs_held; 1 before it)
    probes = {rank.rank: _probe_series(rank, len(ranks), at_once) for rank in ranks}
    pooled = [p["compute_s"] for rank in ranks for p in _probes_of(rank, len(ranks), at_once)]
    reference = statistics.median(pooled) if pooled else None
    for rank in ranks:
        for entry in rank.measurements:
            if entry["kind"] == "update" and int(entry["at_once"]) == at_once and precision == first_precision:
                r = _speed_factor(probes[rank.rank], entry.get("time"), reference)
                updates += [t * r / int(entry["elements"]) for t in entry["times_s"]]
                continue
            if entry.get("precision") != precision or int(entry.get("at_once", len(ranks))) != at_once:
                continue
            r = _speed_factor(probes[rank.rank], entry.get("time"), reference)
            if entry["kind"] == "autograd_call":
                for key, times in chains.items():
                    times += [t * r for t in entry.get(key, [])]
                continue
            if "error" not in entry:
                held = max(held, int(entry.get("outputs_held", 1)))
                key = tuple(sorted(entry["shape"].items()))
                sample = samples.setdefault(key, {**entry["shape"], "forward": [], "backward": []})
                sample["forward"] += [t * r for t in entry["forward_s"]]
                sample["backward"] += [t * r for t in entry["backward_s"]]
    rows = [
        {key: value for key, value in sample.items() if key not in ("forward", "backward")}
        | {
            "forward_s": percentile(sorted(sample["forward"]), 50),
            "backward_s": percentile(sorted(sample["backward"]), 50),
            "n": len(sample["forward"]),
        }
        for sample in samples.values()  # in the order the shapes were first timed
    ]
    if not rows:
        return None
    return (
        {
            "precision": precision,
            "threads": ranks[0].threads,
            "ranks_per_node": at_once,
            "point_id": record.point_id,
            "autograd_call_s": _engine_figure(chains),
            "samples": rows,
        }
        | ({"forward_outputs_held": held} if held > 1 else {})  # a forward's timing kept its outputs, as a step does
        | ({"update_s_per_param": stats_figure(updates)} if updates else {})  # the first precision's entry only
    )


def _probe_at_once(probe: dict[str, Any], ranks: int) -> int:
    """How many ranks were timing when `probe` was taken: its own `at_once` (probes between shapes), else 1 for
    rank 0 alone and all the point's ranks for the start's and end's `all` (ddlbench.train.host_probe)."""
    if probe.get("at_once") is not None:
        return int(probe["at_once"])
    return 1 if probe.get("turn") == "alone" else ranks


def _probes_of(rank: CalibrationRankResult, ranks: int, at_once: int) -> list[dict[str, Any]]:
    return [
        p
        for p in rank.host_probe
        if p.get("time") is not None and p.get("compute_s") and _probe_at_once(p, ranks) == at_once
    ]


def _probe_series(rank: CalibrationRankResult, ranks: int, at_once: int) -> list[tuple[float, float]]:
    """The rank's probes of the turn, (time, compute_s) in time order, each compute_s the median of itself and
    its neighbours (a single probe's blocks can fall on a moment of load that no operator around it saw)."""
    timed = sorted((float(p["time"]), float(p["compute_s"])) for p in _probes_of(rank, ranks, at_once))
    values = [v for _, v in timed]
    smoothed = [statistics.median(values[max(0, i - 1) : i + 2]) for i in range(len(values))]
    return [(t, v) for (t, _), v in zip(timed, smoothed, strict=True)]


def _speed_factor(series: list[tuple[float, float]], when: float | None, reference: float | None) -> float:
    """reference ÷ the rank's compute_s at `when`, linear between the probes before and after it (the first or
    last one outside them); 1 without a time, a reference or two probes (the module docstring)."""
    if when is None or reference is None or len(series) < 2:
        return 1.0
    times = [t for t, _ in series]
    i = bisect.bisect_left(times, when)
    if i == 0:
        local = series[0][1]
    elif i == len(series):
        local = series[-1][1]
    else:
        (t0, v0), (t1, v1) = series[i - 1], series[i]
        local = v0 + (v1 - v0) * (when - t0) / (t1 - t0) if t1 > t0 else v1
    return reference / local


def _engine_figure(chains: dict[str, list[float]]) -> dict[str, Any] | None:
    """The autograd engine's cost per backward() call: t1 − (t5 − t1)/4 from the medians of backward()
    through 1 and 5 nodes (what one call costs beyond its nodes), at least 0; None when not timed."""
    one, five = sorted(chains["chain1_s"]), sorted(chains["chain5_s"])
    if not one or not five:
        return None
    t1, t5 = percentile(one, 50), percentile(five, 50)
    return {"value": max(0.0, t1 - (t5 - t1) / 4), "chain1_s": stats_figure(one), "chain5_s": stats_figure(five)}
