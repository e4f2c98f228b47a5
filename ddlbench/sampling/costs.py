"""What the adaptive sweep's measurements cost, and what more of them would: node-seconds.

Spent (measured): Σ over the sweep's launches of nodes × launch wall time (ddlbench.launch.group's
LaunchRecord.node_s: everything the launch did, reruns included), round 0's included.

Priced (predicted): a point run in a launch costs nodes × (o_P + (warmup + steps) × t̂), and each launch
adds nodes × o_L once, where
- o_L, the launch overhead, s: the median over launches of wall − Σ the spans of its points (interpreter,
  torch import, process group, tear-down);
- o_P, the per-point overhead, s: the median over the points measured in a group of span − (warmup +
  steps) × their mean measured step time (model build, data, clock offsets, the barrier after);
- t̂ the step-time model's prediction. A point of the full sweep is a launch of its own: o_L + o_P + steps.

Round 0 is chosen before anything is measured, so it cannot be priced: instead `round0_share_bound`
bounds what share of the full sweep it can cost, from the two sweeps' shapes alone. With L, P, S the
unknown costs of one node-launch, one node-point and a configuration's node-steps, round 0 costs
Σ_launches n·L + Σ_runs n·P + Σ_runs n·k·S and the full sweep Σ_points n·(L + P + K·S) (k sampled steps,
K a full point's); a ratio of sums of non-negative terms is at most the largest ratio of matching terms
(the mediant inequality), so the share is at most max(launch ratio, point ratio, max over configurations
of sampled steps ÷ the full sweep's steps there). It holds if a step costs the same in a short run and a
full one; warm short runs in one process, if anything, step faster.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

from ddlbench.launches import LAYOUT, LaunchRecord
from ddlbench.point import Point
from ddlbench.records import PointRecord


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overheads:
    launch_s: float  # o_L, seconds per launch (median over `launches`)
    point_s: float  # o_P, seconds per point in a launch (median over `points`)
    launches: int
    points: int


def spent_node_s(launches: Iterable[LaunchRecord]) -> float:
    """Measured: Σ nodes × wall over the launches, node-seconds."""
    return float(sum(launch.node_s for launch in launches))


def _seconds(start: str, end: str) -> float:
    return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())


def measure_overheads(launches: Sequence[LaunchRecord], records: Sequence[PointRecord]) -> Overheads:
    """o_L and o_P (see the module docstring) from what was measured; 0 where nothing tells."""
    by_id = {record.point_id: record for record in records}
    per_launch, per_point = [], []
    for launch in launches:
        grouped = [span for span in launch.points if not span.alone]
        if len(grouped) == len(launch.points):  # a rerun alone would count its own launch as a point's span
            per_launch.append(max(0.0, launch.wall_s - sum(_seconds(s.start_time, s.end_time) for s in grouped)))
        for span in grouped:
            record = by_id.get(span.point_id)
            if record is None or record.status != "ok" or record.metrics is None:
                continue
            steps = record.point.warmup_steps + record.point.steps
            took = _seconds(span.start_time, span.end_time)
            per_point.append(max(0.0, took - steps * record.metrics.step_time_s.mean))
    return Overheads(
        launch_s=statistics.median(per_launch) if per_launch else 0.0,
        point_s=statistics.median(per_point) if per_point else 0.0,
        launches=len(per_launch),
        points=len(per_point),
    )


def layout_key(point: Point) -> tuple:
    return tuple(getattr(point, name) for name in LAYOUT)


def group_launches(runs: Sequence[Point], per_launch: int, round_number: int) -> list[dict]:
    """The round's runs in launches: those of one layout together, `per_launch` at most each, in order, and
    never two repetitions of one configuration in the same launch: repetitions that shared a launch (its
    placement, clocks, neighbours) are not independent samples of the machine (ddlbench.analysis.verdicts),
    and the step-time model counts each repetition as one. Each launch is {"id": "r<round>-l<k>", "points":
    [point ids]}."""
    by_layout: dict[tuple, list[Point]] = {}
    for run in runs:
        by_layout.setdefault(layout_key(run), []).append(run)
    launches: list[dict] = []
    for members in by_layout.values():
        opened: list[tuple[list[Point], set]] = []  # this layout's launches: their runs and configurations
        for run in sorted(members, key=lambda point: point.repetition):  # stable: the round's order otherwise
            config = _configuration(run)
            slot = next((o for o in opened if len(o[0]) < per_launch and config not in o[1]), None)
            if slot is None:
                slot = ([], set())
                opened.append(slot)
            slot[0].append(run)
            slot[1].add(config)
        for chunk, _ in opened:
            launches.append({"id": f"r{round_number}-l{len(launches)}", "points": [p.point_id for p in chunk]})
    return launches


def launches_needed(runs: int, repetitions: int, per_launch: int) -> int:
    """Launches a layout's `runs` take (group_launches): per_launch at most each, and at least `repetitions`,
    since no launch holds two repetitions of one configuration; 0 without runs."""
    return max(repetitions, math.ceil(runs / per_launch)) if runs else 0


def round0_share_bound(full: Sequence[Point], runs: Sequence[Point], launches: Sequence[dict]) -> float:
    """The most round 0 can cost as a share of the full sweep `full` (see the module docstring)."""
    nodes_of = {run.point_id: run.nodes for run in runs}
    full_nodes = sum(point.nodes for point in full)
    launch_ratio = sum(nodes_of[launch["points"][0]] for launch in launches) / full_nodes
    point_ratio = sum(run.nodes for run in runs) / full_nodes
    step_ratio = 0.0
    for run in runs:
        config = _configuration(run)
        full_steps = sum(p.warmup_steps + p.steps for p in full if _configuration(p) == config)
        sampled_steps = sum(r.warmup_steps + r.steps for r in runs if _configuration(r) == config)
        step_ratio = max(step_ratio, sampled_steps / full_steps if full_steps else float("inf"))
    return max(launch_ratio, point_ratio, step_ratio)


def _configuration(point: Point) -> Point:
    return dataclasses.replace(point, steps=0, warmup_steps=0, repetition=0)
