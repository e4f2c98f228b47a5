"""The record of a group launch (ddlbench.launch.group): what one launch of several points cost.

A group's points share LAYOUT, what the launcher and the ranks' process group are made of. The launch's
record says when it ran and what it cost, node_s = nodes × wall_s (node-seconds, measured: everything
the launch did, points run again alone included), and for each point its span inside the launch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

# what the launcher and the ranks' process group are made of: the same in every point of a group
# (and the host allocator: its variables are read once, as each rank's process starts)
LAYOUT = (
    "nodes",
    "ranks_per_node",
    "threads",
    "loader_workers",
    "oversubscribe",
    "node",
    "share_gpus",
    "host_allocator",
)


@dataclass(frozen=True, kw_only=True)
class PointSpan:
    point_id: str
    status: str
    start_time: str
    end_time: str
    alone: bool  # run again in a launch of its own (the group's launch ended before it finished)


@dataclass(frozen=True, kw_only=True)
class LaunchRecord:
    """What one group launch cost: node_s = nodes × wall_s, node-seconds, measured (reruns included)."""

    launch_id: str
    nodes: int
    launcher: str
    start_time: str
    end_time: str
    wall_s: float
    node_s: float
    points: tuple[PointSpan, ...]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LaunchRecord:
        return cls(**{**data, "points": tuple(PointSpan(**p) for p in data["points"])})


def read_launch(path: Path) -> LaunchRecord:
    return LaunchRecord.from_dict(json.loads(path.read_text()))
