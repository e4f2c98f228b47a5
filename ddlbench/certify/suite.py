"""A certification suite: a sweep file, resolved against the partition it certifies.

The suite is a sweep (ddlbench/config/sweep.schema.yaml) with two words it may use where the partition's
size is not known when the file is written:

- `nodes` may hold `partition`: the partition's node count; counts above it are dropped, so
  [1, 2, 4, 8, 16, partition] scales any partition up to its full size;
- `each_node: all`: every node of the partition that is not down or drained (the single-node points
  run once on each: per-node certification).

On SLURM the partition's nodes come from the controller (scontrol); locally the partition is this host,
run as `local_nodes` nodes (2 by default), and `all` is this host. The resolved sweep is named after the
suite, system and partition, so certificates of different partitions never share a folder, and a
relative `calibrate` or `machine` path that is not found from the working folder is taken from the
repository's root (where the shipped suites name their calibration).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlbench.config import SweepConfig, sweep_config_from_mapping
from ddlbench.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = REPO / "workflow" / "certify" / "default.yaml"
_DOWN = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT")


@dataclass(frozen=True, kw_only=True)
class PartitionNodes:
    """The nodes a suite runs on: their names and count, and where that came from."""

    names: tuple[str, ...]
    count: int
    source: str  # "slurm" or "local"


def local_partition(nodes: int = 2) -> PartitionNodes:
    return PartitionNodes(names=(socket.gethostname().split(".")[0],), count=nodes, source="local")


def slurm_partition(partition: str) -> PartitionNodes:
    """The partition's nodes that are up, as the controller lists them; an unknown partition is refused."""
    from ddlbench.launch.slurm import query_cluster

    facts = query_cluster()
    if partition not in facts.partitions:
        raise ConfigError(
            "--partition",
            f"{partition!r} is not a partition of this cluster; it has: {', '.join(sorted(facts.partitions))}",
        )
    up = sorted(
        node.name for node in facts.nodes_of(partition) if not any(word in node.state.upper() for word in _DOWN)
    )
    if not up:
        raise ConfigError("--partition", f"partition {partition!r} has no node that is up")
    return PartitionNodes(names=tuple(up), count=len(up), source="slurm")


def load_suite(path: str | Path | None) -> dict[str, Any]:
    path = Path(path) if path else DEFAULT_SUITE
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError("--suite", f"cannot read {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError("--suite", f"{path} is not valid YAML") from None
    if not isinstance(raw, Mapping):
        raise ConfigError("--suite", f"{path} must be a sweep mapping")
    return dict(raw)


def resolve_suite(raw: Mapping[str, Any], *, system: str, partition: str, nodes: PartitionNodes) -> SweepConfig:
    """The suite as the sweep it runs on this partition (validated: bad keys are refused by name)."""
    data = dict(raw)
    counts = []
    for value in data.get("nodes", [1]):
        if value == "partition":
            counts.append(nodes.count)
        elif isinstance(value, int) and not isinstance(value, bool):
            if value <= nodes.count:
                counts.append(value)
        else:
            raise ConfigError("nodes", f"{value!r} is not a node count or the word `partition`")
    data["nodes"] = sorted(set(counts))
    if data.get("each_node") == "all":
        data["each_node"] = list(nodes.names)
    for key in ("calibrate", "machine"):
        if isinstance(data.get(key), str) and data[key]:
            data[key] = _found(data[key])
    if nodes.source == "slurm":  # the points run in the partition certified, whatever the site names
        data["slurm"] = dict(data.get("slurm") or {}) | {"partition": partition}
    name = re.sub(r"[^a-z0-9_-]", "_", f"{data.get('name', 'certify')}_{system}_{partition}".lower())
    data["name"] = name
    config = sweep_config_from_mapping(data)
    if config.calibrate:
        _check_calibration(config.calibrate)
    return config


def _check_calibration(path: str) -> None:
    """The suite's calibration is checked before anything runs: a bad one is bad input, not a failed run."""
    from ddlbench.calibrate.suite import load_suite as load_calibration

    try:
        load_calibration(Path(path))
    except OSError as exc:
        raise ConfigError("calibrate", f"cannot read the calibration suite {path!r}: {exc.strerror}") from None
    except ConfigError as exc:
        raise ConfigError(f"calibrate ({path})", str(exc)) from None


def _found(path: str) -> str:
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return str(candidate)
    return str(REPO / candidate) if (REPO / candidate).exists() else path
