"""What a calibration point's ranks measured, and the point's record (versioned JSON, like a training record)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ddlbench.records import RecordError, Stats, Status, write_json_atomic
from ddlbench.train.calibration.point import CalibrationPoint


@dataclass(frozen=True, kw_only=True)
class CalibrationRankResult:
    """One rank's raw times (ddlbench.train.calibration.kernels says what each entry times)."""

    rank: int
    hostname: str
    device: str
    device_name: str
    backend: str  # torch.distributed's backend (gloo, nccl)
    library: str  # what the collectives went through: gloo, nccl, or the MPI library's name
    torch_version: str
    threads: int
    cpus: tuple[int, ...]
    # compute: {kind: matmul|conv|copy, precision, size|shape, flop|bytes, times_s | error}
    # collectives: {op, bytes, times_s}
    measurements: tuple[dict[str, Any], ...]
    cpu_binding: str = ""
    slurm_node: str = ""
    memory_bytes: int | None = None  # the device's memory (GPU) or the host's RAM, for the machine file
    # the host's speed at the point's start and end, rank 0 alone and all ranks in turn (ddlbench.train.host_probe)
    host_probe: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationRankResult:
        return cls(
            **{
                **data,
                "cpus": tuple(data["cpus"]),
                "measurements": tuple(data["measurements"]),
                "host_probe": tuple(data.get("host_probe", ())),
            }
        )


@dataclass(frozen=True, kw_only=True)
class CalibrationRecord:
    """The outcome of one calibration point, written for every status (failures are data)."""

    SCHEMA_VERSION: ClassVar[int] = 1
    point_id: str
    point: CalibrationPoint
    status: Status
    reason: str | None
    launcher: str
    start_time: str
    end_time: str
    ranks: tuple[CalibrationRankResult, ...] = field(default_factory=tuple)
    cpu_model: str = ""
    git_commit: str | None = None
    ddlbench_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["point"] = self.point.to_dict()
        return {"schema_version": self.SCHEMA_VERSION, **data}

    @property
    def hostnames(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(rank.hostname for rank in self.ranks))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationRecord:
        if data.get("schema_version") != cls.SCHEMA_VERSION:
            raise RecordError(f"calibration record schema version {data.get('schema_version')!r} is not supported")
        fields = {key: value for key, value in data.items() if key != "schema_version"}
        fields["point"] = CalibrationPoint.from_dict(data["point"])
        fields["ranks"] = tuple(CalibrationRankResult.from_dict(rank) for rank in data.get("ranks", ()))
        return cls(**fields)


def write_calibration_record(path: Path, record: CalibrationRecord) -> None:
    write_json_atomic(path, record.to_dict())


def read_calibration_record(path: Path) -> CalibrationRecord:
    try:
        return CalibrationRecord.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RecordError(f"cannot read calibration record {path}: {exc}") from None


def missing_record(point: CalibrationPoint, reason: str) -> CalibrationRecord:
    """What stands for a point whose record is not there (it did not run, or its file is unreadable)."""
    return CalibrationRecord(
        point_id=point.point_id, point=point, status="failed", reason=reason, launcher="", start_time="", end_time=""
    )


def stats_figure(values: list[float], **extra: Any) -> dict[str, Any]:
    """A measured figure of the machine file: the median of `values`, its 95 % CI and n (records.Stats)."""
    stats = Stats.of(values)
    figure = {"value": stats.median, "ci_low": stats.ci_low, "ci_high": stats.ci_high, "n": stats.n}
    return figure | extra
