"""A calibration suite and its points: the microbenchmarks that measure a machine for later models.

A suite (YAML, validated against suite.schema.yaml) expands into points that launch like training
points (the same launchers, local, srun in an allocation or mpirun; the same worker, which dispatches on
the spec's `kind`):
- one `compute` point: one rank timing matrix products and convolutions per precision, and a copy for
  memory bandwidth;
- one `collectives` point per backend and node count: every collective over every message size, within
  a node (1 node × ranks_per_node ranks) or across nodes (n nodes × 1 rank).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from ddlbench.config.schema import validate_with

SCHEMA_PATH = Path(__file__).with_name("suite.schema.yaml")
DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "workflow" / "calibration" / "default.yaml"
KIND = "calibration"  # the spec's `kind`: what tells the worker this is not a training point

Benchmark = Literal["compute", "collectives"]


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    """One launch of microbenchmarks; it has what a launcher reads of a training point (world_size,
    threads, cores_per_rank, timeout_s, point_id, to_json…)."""

    suite: str
    benchmark: Benchmark
    backend: str  # torch | mpi for collectives; "" for compute
    nodes: int
    ranks_per_node: int
    threads: int
    warmup: int
    iterations: int
    timeout_s: float
    precisions: tuple[str, ...] = ()
    matmul_sizes: tuple[int, ...] = ()
    conv_shapes: tuple[tuple[int, int, int, int], ...] = ()
    memory_bytes: int = 0
    collectives: tuple[str, ...] = ()
    message_bytes: tuple[int, ...] = ()
    oversubscribe: bool = False
    repetition: int = 0
    loader_workers: int = 0  # launchers count loader workers; microbenchmarks have none

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def cores_per_rank(self) -> int:
        return self.threads

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, **asdict(self)}

    def to_json(self) -> str:
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def spec_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @functools.cached_property
    def point_id(self) -> str:
        backend = f"-{self.backend}" if self.backend else ""
        return f"{self.benchmark}{backend}-n{self.nodes}x{self.ranks_per_node}-t{self.threads}-{self.spec_hash[:8]}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationPoint:
        fields = {key: value for key, value in data.items() if key != "kind"}
        for name in ("precisions", "matmul_sizes", "collectives", "message_bytes"):
            fields[name] = tuple(fields.get(name, ()))
        fields["conv_shapes"] = tuple(tuple(shape) for shape in fields.get("conv_shapes", ()))
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class Suite:
    """A validated suite: its settings and its points."""

    name: str
    results_dir: Path
    machine: str | None
    points: tuple[CalibrationPoint, ...]
    settings: dict[str, Any]

    @property
    def folder(self) -> Path:
        """Where the suite's records, report and figures live."""
        return self.results_dir / self.name / "calibration"

    def record_path(self, point: CalibrationPoint) -> Path:
        return self.folder / "points" / point.point_id / "record.json"


@functools.cache
def suite_schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def load_suite(path: Path | None = None, raw: dict[str, Any] | None = None) -> Suite:
    """The suite of a YAML file (the default suite without one), or of an already parsed mapping."""
    if raw is None:
        path = path or DEFAULT_SUITE
        raw = yaml.safe_load(path.read_text()) or {}
    data = validate_with(raw, suite_schema(), what="a calibration suite")
    return Suite(
        name=data["name"],
        results_dir=Path(data["results_dir"]),
        machine=data.get("machine"),
        points=expand_suite(data),
        settings=data,
    )


def expand_suite(data: dict[str, Any]) -> tuple[CalibrationPoint, ...]:
    common = dict(
        suite=data["name"],
        threads=data["threads"],
        warmup=data["warmup"],
        iterations=data["iterations"],
        timeout_s=float(data["timeout_s"]),
        oversubscribe=data["oversubscribe"],
    )
    points = [
        CalibrationPoint(
            benchmark="compute",
            backend="",
            nodes=1,
            ranks_per_node=1,
            precisions=tuple(data["precisions"]),
            matmul_sizes=tuple(data["matmul_sizes"]),
            conv_shapes=tuple(tuple(shape) for shape in data["conv_shapes"]),
            memory_bytes=data["memory_bytes"],
            **common,
        )
    ]
    for backend in data["backends"]:
        for nodes in data["nodes"]:
            points.append(
                CalibrationPoint(
                    benchmark="collectives",
                    backend=backend,
                    nodes=nodes,
                    ranks_per_node=data["ranks_per_node"] if nodes == 1 else 1,
                    collectives=tuple(data["collectives"]),
                    message_bytes=tuple(sorted(data["message_bytes"])),
                    **common,
                )
            )
    return tuple(points)
