"""A calibration point: one launch of microbenchmarks, as the worker receives it (its spec's `kind` is
KIND) and as the kernels beside it read it.

A calibration suite (ddlbench.calibrate.suite) expands into these; a point has what a launcher reads of a
training point (world_size, threads, cores_per_rank, timeout_s, point_id, to_json…), so it launches the
same way. Torch-free: suites expand on the login node.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

KIND = "calibration"  # the spec's `kind`: what tells the worker this is not a training point

Benchmark = Literal["compute", "collectives", "layer_timings", "operators", "fsdp_units", "spatial_layers"]
LAYER_TIMING_FIELDS = ("model", "dataset", "model_options", "batch_sizes")
OPERATOR_FIELDS = (
    "operator_samples",
    "operator_seed",
    "operator_max_flop",
    "operator_max_elements",
    "operator_at_once",
)


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    """One launch of microbenchmarks; it has what a launcher reads of a training point (world_size,
    threads, cores_per_rank, timeout_s, point_id, to_json…)."""

    suite: str
    benchmark: Benchmark
    backend: str  # torch | mpi for collectives; "" for the others
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
    # compute, on a CPU: zero2's collectives on a group of one at these sizes; left out of the spec when (), so
    # the compute points of suites before the key keep their ids
    alone_collective_bytes: tuple[int, ...] = ()
    collectives: tuple[str, ...] = ()
    message_bytes: tuple[int, ...] = ()
    # layer_timings: the model trained, on synthetic samples of the dataset, at each per-rank batch size
    model: str = ""
    dataset: str = ""
    model_options: tuple[tuple[str, str], ...] = ()  # resolved: the model's defaults filled in
    batch_sizes: tuple[int, ...] = ()
    # operators: the generic shapes drawn (ddlbench.train.calibration.operator_shapes.sample_shapes)
    operator_samples: int = 0
    operator_seed: int = 0
    operator_max_flop: float = 0.0
    operator_max_elements: int = 0
    # the rank counts that time each shape in turn (ranks 0..k−1 time, the others wait at a barrier), so the
    # one-rank and the all-ranks times of a shape come from the same minute; () times with all ranks only
    operator_at_once: tuple[int, ...] = ()
    oversubscribe: bool = False
    repetition: int = 0
    loader_workers: int = 0  # launchers count loader workers; microbenchmarks have none
    # the ranks' host allocator (ddlbench.launch.command.allocator_env), as a sweep's: the suite's `host_allocator`;
    # left out of the spec at "system", so the points of suites before the key keep their ids
    host_allocator: str = "system"

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def cores_per_rank(self) -> int:
        return self.threads

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.benchmark != "layer_timings":  # left out: other points keep the ids they had before these
            data = {key: value for key, value in data.items() if key not in LAYER_TIMING_FIELDS}
        if self.benchmark != "operators":  # likewise, for the ids they had before operator points
            data = {key: value for key, value in data.items() if key not in OPERATOR_FIELDS}
        if self.host_allocator == "system":  # likewise, for the ids they had before the allocator's key
            del data["host_allocator"]
        if not self.alone_collective_bytes:  # likewise
            del data["alone_collective_bytes"]
        return {"kind": KIND, **data}

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
        if self.benchmark == "layer_timings":
            backend = f"-{self.model}-{self.dataset}-{self.precisions[0]}"
        return f"{self.benchmark}{backend}-n{self.nodes}x{self.ranks_per_node}-t{self.threads}-{self.spec_hash[:8]}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationPoint:
        fields = {key: value for key, value in data.items() if key != "kind"}
        for name in (
            "precisions",
            "matmul_sizes",
            "collectives",
            "message_bytes",
            "batch_sizes",
            "alone_collective_bytes",
        ):
            fields[name] = tuple(fields.get(name, ()))
        fields["conv_shapes"] = tuple(tuple(shape) for shape in fields.get("conv_shapes", ()))
        fields["model_options"] = tuple(tuple(pair) for pair in fields.get("model_options", ()))
        return cls(**fields)
