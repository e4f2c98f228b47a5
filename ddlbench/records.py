"""The record of one point: versioned JSON, written atomically, read back into value objects."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.point import Point

Status = Literal["ok", "failed", "oom", "timeout"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "oom", "timeout")


class RecordError(DdlbenchError):
    """A record file that cannot be read as a record of a known schema version."""


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Summary of a sample of one quantity; percentiles by linear interpolation between order statistics."""

    n: int
    mean: float
    median: float
    p5: float
    p95: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float] | tuple[float, ...]) -> Stats:
        if not values:
            raise ValueError("Stats of an empty sample")
        ordered = sorted(values)
        return cls(
            n=len(ordered),
            mean=math.fsum(ordered) / len(ordered),
            median=percentile(ordered, 50),
            p5=percentile(ordered, 5),
            p95=percentile(ordered, 95),
            min=ordered[0],
            max=ordered[-1],
        )


def percentile(ordered: list[float], q: float) -> float:
    """q-th percentile of a sorted sample: value at rank (n-1)·q/100, interpolated (numpy's 'linear')."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """What one rank measured; written by the rank, merged by the launcher."""

    rank: int
    hostname: str
    step_times_s: tuple[float, ...]  # measured steps only, device-synchronised wall time per step
    losses: tuple[float, ...]  # every step, warm-up included; empty on ranks that compute no loss
    peak_rss_bytes: int  # getrusage ru_maxrss of the rank's process (whole process, not just tensors)
    # CPU only: tensor storages alive at the start of the probed (last warm-up) step, plus the highest
    # point reached by storages allocated during it (ddlbench.train.memory); None on CUDA or unprobed
    tensor_peak_bytes: int | None = None
    tensor_resident_bytes: int | None = None  # the first term: parameters, gradients, optimizer state…
    cuda_peak_allocated_bytes: int | None = None  # torch.cuda.max_memory_allocated
    cuda_peak_reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved
    device: str = "cpu"
    device_name: str = ""
    backend: str = ""
    torch_version: str = ""
    threads: int = 1
    # the strategy's facts about this rank's share (mesh, stages, micro-batches, shard sizes…)
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        data = dict(data)
        data["step_times_s"] = tuple(data["step_times_s"])
        data["losses"] = tuple(data["losses"])
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class RankFailure:
    """An exception that ended a rank, as the rank wrote it down before leaving."""

    rank: int
    hostname: str
    error_type: str
    message: str  # first line of the exception's text
    traceback: str
    out_of_memory: bool
    time: float  # seconds since the epoch; the earliest failure is the likeliest cause


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """Figures of a point that ran to the end; every throughput is global (the whole job)."""

    step_time_s: Stats  # per measured step: the slowest rank's time for that step
    samples_per_s: Stats  # per measured step: global_batch_size / step_time_s
    samples_per_s_overall: float  # global_batch_size · steps / Σ step_time_s (all samples over all time)
    global_batch_size: int
    peak_rss_bytes: int  # max over ranks of the process's peak resident set (CPU memory, coarse)
    cuda_peak_allocated_bytes: int | None  # max over ranks; None without CUDA
    cuda_peak_reserved_bytes: int | None
    loss_first: float  # mean over loss-computing ranks, first step (warm-up included)
    loss_last: float  # same, last measured step
    tensor_peak_bytes: int | None = None  # max over ranks of the CPU tensor-level peak; None on CUDA


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """The SLURM job a point ran in, as the controller described it."""

    job_id: str
    array_job_id: str | None
    array_task_id: str | None
    partition: str | None
    node_list: str | None
    num_nodes: int | None
    num_cpus: int | None  # CPUs of the whole allocation
    num_gpus: int  # GPUs of the whole allocation
    restarts: int  # times SLURM requeued the job before this run


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where, when and with what a point ran."""

    ddlbench_version: str
    git_commit: str | None
    git_dirty: bool | None
    python_version: str
    torch_version: str | None
    backend: str | None
    launcher: str
    hostnames: tuple[str, ...]  # distinct hosts of the ranks, in rank order
    cpu_model: str
    gpu_model: str | None
    slurm_job_id: str | None
    slurm: SlurmJob | None = None  # absent from version-1 records
    config_hash: str | None  # sha256 of the point's canonical spec (every setting that shaped the run)
    start_time: str  # ISO 8601, UTC
    end_time: str


@dataclass(frozen=True, kw_only=True)
class PointRecord:
    """The outcome of one point; written for every status, so failures are data too."""

    SCHEMA_VERSION: ClassVar[int] = 3  # 2: provenance.slurm; 3: rank facts and tensor memory peaks
    READABLE_VERSIONS: ClassVar[tuple[int, ...]] = (1, 2, 3)
    point_id: str
    point: Point
    status: Status
    reason: str | None
    metrics: Metrics | None
    provenance: Provenance
    ranks: tuple[RankResult, ...] = field(default_factory=tuple)
    failures: tuple[RankFailure, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["point"] = self.point.to_dict()
        return {"schema_version": self.SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointRecord:
        version = data.get("schema_version")
        if version not in cls.READABLE_VERSIONS:
            readable = ", ".join(str(v) for v in cls.READABLE_VERSIONS)
            raise RecordError(f"record schema version {version!r} is not supported (this ddlbench reads {readable})")
        metrics = data["metrics"]
        if metrics is not None:
            metrics = Metrics(
                **{
                    **metrics,
                    "step_time_s": Stats(**metrics["step_time_s"]),
                    "samples_per_s": Stats(**metrics["samples_per_s"]),
                }
            )
        provenance = dict(data["provenance"])
        provenance["hostnames"] = tuple(provenance["hostnames"])
        if provenance.get("slurm") is not None:
            provenance["slurm"] = SlurmJob(**provenance["slurm"])
        return cls(
            point_id=data["point_id"],
            point=Point.from_dict(data["point"]),
            status=data["status"],
            reason=data["reason"],
            metrics=metrics,
            provenance=Provenance(**provenance),
            ranks=tuple(RankResult.from_dict(rank) for rank in data.get("ranks", ())),
            failures=tuple(RankFailure(**failure) for failure in data.get("failures", ())),
        )


def record_path(sweep_dir: Path, point_id: str) -> Path:
    """Where the record of a point lives: the one place that spells the layout of a sweep's folder."""
    return sweep_dir / "points" / point_id / "record.json"


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_record(path: Path, record: PointRecord) -> None:
    write_json_atomic(path, record.to_dict())


def read_record(path: Path) -> PointRecord:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"cannot read record {path}: {exc}") from None
    try:
        return PointRecord.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise RecordError(f"record {path} is malformed: {exc}") from None
