"""A point's timeline as a Chrome/Perfetto trace: every rank's phases, collectives and waits on one clock.

The ranks stamp their last `trace_steps` measured steps (ddlbench.train.recording) on the job's common
clock (rank 0's, ddlbench.train.clock), so their events merge without shifting. The trace uses the
Trace Event Format's complete events ("ph": "X", ts and dur in µs; https://docs.google.com/document/d/
1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): one process per rank, named after the rank and its host;
in it a row of steps and phases, a row of waits on communication, and rows of collectives in flight
(as many as overlap at once). Open it in https://ui.perfetto.dev or chrome://tracing. Times start at
the earliest event; the origin, on the common clock, is in `otherData`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlbench.atomic import write_text_atomic
from ddlbench.records import PointRecord, RankResult

PHASE_ROW, WAIT_ROW, FIRST_COMM_ROW = 0, 1, 2


def trace_path(record_path: Path) -> Path:
    """Where the trace of the point recorded at `record_path` lives: beside it."""
    return record_path.with_suffix(".trace.json")


def chrome_trace(record: PointRecord) -> dict[str, Any]:
    """The Trace Event Format object of a record's rank timelines."""
    events = [event for rank in record.ranks for event in rank.timeline]
    origin = min((event["start"] for event in events), default=0.0)
    trace: list[dict[str, Any]] = []
    for rank in sorted(record.ranks, key=lambda r: r.rank):
        trace += _metadata(rank)
        trace += _rank_events(rank, origin)
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "point_id": record.point_id,
            "origin_s": origin,
            "clock": "rank 0's perf_counter (seconds); ranks mapped onto it by Cristian's algorithm",
            "clock_uncertainty_s": max((rank.clock_uncertainty_s for rank in record.ranks), default=0.0),
            "steps": sorted({event["step"] for event in events}),
        },
    }


def write_trace(record: PointRecord, path: Path) -> Path | None:
    """Write the record's timeline as a trace at `path`; None (nothing written) when no rank stamped one."""
    if not any(rank.timeline for rank in record.ranks):
        return None
    write_text_atomic(path, json.dumps(chrome_trace(record), separators=(",", ":")) + "\n")
    return path


def last_step(events: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """The events of the last step among `events`."""
    if not events:
        return ()
    step = max(event["step"] for event in events)
    return tuple(event for event in events if event["step"] == step)


def _metadata(rank: RankResult) -> list[dict[str, Any]]:
    pid = rank.rank
    names = {PHASE_ROW: "steps and phases", WAIT_ROW: "waiting on communication"}
    lanes = _comm_lanes(rank.timeline)
    names |= {FIRST_COMM_ROW + lane: f"collectives in flight ({lane + 1})" for lane in set(lanes.values())}
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid} on {rank.hostname}"}}]
    meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
    for tid, name in sorted(names.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    return meta


def _rank_events(rank: RankResult, origin: float) -> list[dict[str, Any]]:
    lanes = _comm_lanes(rank.timeline)
    out = []
    for index, event in enumerate(rank.timeline):
        cat = event["cat"]
        tid = {"step": PHASE_ROW, "phase": PHASE_ROW, "wait": WAIT_ROW}.get(cat, FIRST_COMM_ROW + lanes.get(index, 0))
        out.append(
            {
                "ph": "X",
                "name": event["name"],
                "cat": cat,
                "pid": rank.rank,
                "tid": tid,
                "ts": (event["start"] - origin) * 1e6,
                "dur": max(0.0, event["end"] - event["start"]) * 1e6,
                "args": {"step": event["step"], **event.get("args", {})},
            }
        )
    return out


def _comm_lanes(events: tuple[dict[str, Any], ...]) -> dict[int, int]:
    """A row for each collective such that none overlaps another in its row (greedy, by start)."""
    ends: list[float] = []
    lanes = {}
    comms = sorted((event["start"], index) for index, event in enumerate(events) if event["cat"] == "comm")
    for start, index in comms:
        lane = next((k for k, end in enumerate(ends) if end <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = events[index]["end"]
        lanes[index] = lane
    return lanes
