"""The machine file's `operator_timings`: what an `operators` point measured, per shape, for later fits.

Per precision, one entry per count of ranks that timed at once on one node (a point times each shape by
every count of its `operator_at_once` in turn; an entry without `at_once`, from a point before that, was
timed by all the point's ranks):
    {precision, threads, ranks_per_node, point_id,
     autograd_call_s: {value: t1 − (t5 − t1)/4, chain1_s: figure, chain5_s: figure},
     samples: [{kind, batch, in_channels, height, width, out_channels, kernel, stride,
                forward_s, backward_s, n}]}
forward_s and backward_s are medians, in seconds, over every rank's timed repetitions of that shape
in every round pooled (n of them); the fit (ddlbench.analysis.analytic.operators) is made when a prediction reads the
file, so a better fit needs no new calibration. Torch-free.
"""

from __future__ import annotations

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
    samples: dict[tuple, dict[str, Any]] = {}  # by shape: a shape timed in several rounds is one sample
    for rank in ranks:
        for entry in rank.measurements:
            if entry.get("precision") != precision or int(entry.get("at_once", len(ranks))) != at_once:
                continue
            if entry["kind"] == "autograd_call":
                for key, times in chains.items():
                    times += entry.get(key, [])
                continue
            if "error" not in entry:
                key = tuple(sorted(entry["shape"].items()))
                sample = samples.setdefault(key, {**entry["shape"], "forward": [], "backward": []})
                sample["forward"] += entry["forward_s"]
                sample["backward"] += entry["backward_s"]
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
    return {
        "precision": precision,
        "threads": ranks[0].threads,
        "ranks_per_node": at_once,
        "point_id": record.point_id,
        "autograd_call_s": _engine_figure(chains),
        "samples": rows,
    }


def _engine_figure(chains: dict[str, list[float]]) -> dict[str, Any] | None:
    """The autograd engine's cost per backward() call: t1 − (t5 − t1)/4 from the medians of backward()
    through 1 and 5 nodes (what one call costs beyond its nodes), at least 0; None when not timed."""
    one, five = sorted(chains["chain1_s"]), sorted(chains["chain5_s"])
    if not one or not five:
        return None
    t1, t5 = percentile(one, 50), percentile(five, 50)
    return {"value": max(0.0, t1 - (t5 - t1) / 4), "chain1_s": stats_figure(one), "chain5_s": stats_figure(five)}
