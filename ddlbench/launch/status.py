"""Where a sweep stands: per point, its record's status or its job's state in the queue, and its job ids.

Points are matched to queued jobs by the comment Snakemake's SLURM plugin gives each job
(`rule_run_point_wildcards_<point id>`) and by the jobs index `ddlbench submit` keeps. The queue is
read with one squeue call (by the caller). A record costs one stat, and a read only when it changed
(RecordCache); a watcher's StatusReader looks again only at the records that may have changed, so a
look of a 10,000-point sweep stays well under a second and its stats under one per point per minute
(benchmarks/scheduler_load.py).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.launch.slurm import PENDING_STATES, RUNNING_STATES, QueuedJob
from ddlbench.records import MEASUREMENT_VERSION, POINTS_DIR, RECORD_FILE
from ddlbench.sweep import Plan

log = logging.getLogger(__name__)

SNAKEMAKE_COMMENT_PREFIX = "rule_run_point_wildcards_"
# in the order the summary lists them
CACHE_FILE = ".status-cache.json"  # in the sweep folder: RecordCache between runs of `ddlbench status`
STATES = ("ok", "failed", "oom", "timeout", "running", "pending", "not started", "unreadable")


@dataclass(frozen=True, kw_only=True)
class PointStatus:
    point_id: str
    state: str  # one of STATES
    reason: str | None
    job_ids: tuple[str, ...]  # every job known to have run this point, oldest first
    measurement_version: int | None = None  # of the point's record, when it has one

    @property
    def other_version(self) -> bool:
        """Its record was measured by a ddlbench whose figures mean something else (MEASUREMENT_VERSION)."""
        return self.measurement_version is not None and self.measurement_version != MEASUREMENT_VERSION


@dataclass(frozen=True, kw_only=True)
class RecordSummary:
    """What status needs of a point's record."""

    state: str  # the record's status, or unreadable
    reason: str | None
    version: int | None  # its measurement_version
    job_id: str | None  # the SLURM job it ran in: "<array job>_<task>" for an array's task


class RecordCache:
    """Each record's RecordSummary, read once per version of the file (records are replaced whole:
    ddlbench.atomic), so that a look costs one stat per record and a read only of those that changed.
    `save`/`load` keep it between runs of `ddlbench status` (CACHE_FILE in the sweep folder)."""

    FORMAT = 1

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, int, RecordSummary]] = {}  # point id → mtime ns, size, summary
        self.changed = False

    def look(self, point_id: str, path: str | Path) -> RecordSummary | None:
        """The record at `path` (None: there is none), read again only if it changed."""
        try:
            stat = os.stat(path)
        except OSError:
            self.changed |= self._entries.pop(point_id, None) is not None
            return None
        entry = self._entries.get(point_id)
        if entry is not None and entry[0] == stat.st_mtime_ns and entry[1] == stat.st_size:
            return entry[2]
        summary = summarize_record(path)
        self._entries[point_id] = (stat.st_mtime_ns, stat.st_size, summary)
        self.changed = True
        return summary

    @classmethod
    def load(cls, path: Path) -> RecordCache:
        """The cache saved at `path`; an empty one where there is none or it cannot be read."""
        cache = cls()
        try:
            data = json.loads(path.read_text())
            if data.get("format") == cls.FORMAT:
                cache._entries = {
                    point_id: (mtime_ns, size, RecordSummary(**summary))
                    for point_id, (mtime_ns, size, summary) in data["records"].items()
                }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            cache._entries = {}
        return cache

    def save(self, path: Path) -> None:
        """Keep the cache at `path` when it changed; a folder that cannot be written leaves it unsaved."""
        if not self.changed:
            return
        records = {
            point_id: [mtime_ns, size, asdict(summary)] for point_id, (mtime_ns, size, summary) in self._entries.items()
        }
        try:
            write_text_atomic(path, json.dumps({"format": self.FORMAT, "records": records}, separators=(",", ":")))
        except OSError as exc:
            log.debug("status cache not saved at %s: %s", path, exc)
        self.changed = False


def summarize_record(path: str | Path) -> RecordSummary:
    """The status, reason, measurement version and job of the record at `path`, or `unreadable` with why
    (a record missing what ddlbench.records.read_record needs is unreadable here too), without building
    the whole PointRecord: most of a 10,000-record look's time otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return RecordSummary(state="unreadable", reason=f"cannot read record {path}: {exc}", version=None, job_id=None)
    try:
        missing = {"point_id", "point", "status", "reason", "metrics", "provenance"} - data.keys()
        if missing:
            raise KeyError(", ".join(sorted(missing)))
        provenance = data["provenance"]
        slurm = provenance.get("slurm")
        if slurm is not None and slurm.get("array_task_id") is not None:
            job_id = f"{slurm['array_job_id']}_{slurm['array_task_id']}"
        else:
            job_id = provenance["slurm_job_id"]
        status = data["status"]
        if not isinstance(status, str):
            raise TypeError(f"status {status!r}")
        return RecordSummary(
            state=status, reason=data["reason"], version=data.get("measurement_version", 1), job_id=job_id
        )
    except (KeyError, TypeError, AttributeError) as exc:
        return RecordSummary(state="unreadable", reason=f"record {path} is malformed: {exc}", version=None, job_id=None)


def points_of_job(job: QueuedJob, job_points: Mapping[str, list[str]]) -> list[str]:
    """The points a queued job runs: one (Snakemake's comment, a submitit task), or a packed allocation's."""
    if job.comment.startswith(SNAKEMAKE_COMMENT_PREFIX):
        # the point id, up to the sbatch guard's key that follows it (ddlbench.launch.submit_once)
        return job.comment[len(SNAKEMAKE_COMMENT_PREFIX) :].split()[:1]
    return job_points.get(job.job_id, [])


def sweep_status(
    plan: Plan | Sequence[str],
    *,
    queue: list[QueuedJob],
    jobs_index: Mapping[str, list[str]],
    sweep_dir: Path,
    records: RecordCache | None = None,
) -> list[PointStatus]:
    """One PointStatus per planned point, from one look at the queue and the records: each record not
    hidden by a queued job costs one stat, and is read only when it changed since `records` last read it.
    `plan` is the sweep's Plan, or its point ids in plan order (ddlbench.launch.planned)."""
    return StatusReader(plan, sweep_dir=sweep_dir, records=records).look(queue, jobs_index)


class StatusReader:
    """sweep_status for a watcher that looks again and again (`status --watch`, submit's progress line),
    at a filesystem cost that does not grow with the number of looks.

    A point whose job is queued or running costs nothing (the queue says it). Its record is looked at
    (one stat, and a read if it changed) at the first look, when its job leaves the queue, when a packed
    allocation's summary says it ended, and otherwise round robin: `every_s` seconds for a round of the
    plan's points (so at most one stat per point per `every_s`; `least_per_s` a second in all where that
    is more: a small sweep), or never with None (a wait that submitted every point itself sees each leave
    the queue). `clock` replaces time.monotonic."""

    def __init__(
        self,
        plan: Plan | Sequence[str],
        *,
        sweep_dir: Path,
        records: RecordCache | None = None,
        every_s: float | None = None,
        least_per_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sweep_dir, self.every_s, self.least_per_s = sweep_dir, every_s, least_per_s
        self._clock = clock
        self.records = records if records is not None else RecordCache()
        ids = [point.point_id for point in plan.points] if isinstance(plan, Plan) else list(plan)
        # record_path's layout as strings: Path objects for 10,000 points cost a tenth of a second a status
        points_dir = os.path.join(sweep_dir, POINTS_DIR)
        self._paths = {point_id: os.path.join(points_dir, point_id, RECORD_FILE) for point_id in ids}
        self._known: dict[str, RecordSummary | None] = {}  # point id → its record at the last look at it
        self._queued: set[str] = set()  # points the queue (or a running allocation) held at the last look
        self._turn: deque[str] = deque(self._paths)  # the round robin, the next to look at first
        self._credit = 0.0
        self._last: float | None = None
        self._summaries: dict[str, tuple[tuple[int, int], dict[str, dict]]] = {}

    def look(self, queue: list[QueuedJob], jobs_index: Mapping[str, list[str]]) -> list[PointStatus]:
        """One PointStatus per planned point. A job in the queue wins over an older record (a rerun)."""
        job_points: dict[str, list[str]] = {}
        for point_id, job_ids in jobs_index.items():
            for job_id in job_ids:
                job_points.setdefault(job_id, []).append(point_id)
        queued: dict[str, QueuedJob] = {}
        for job in queue:
            for point_id in points_of_job(job, job_points):
                queued[point_id] = job
        due = self._round_robin(queued)
        held: set[str] = set()
        allocations: dict[str, dict[str, dict]] = {}
        statuses = []
        for point_id in self._paths:
            job_ids = list(jobs_index.get(point_id, []))
            reason = None
            version = None
            job = queued.get(point_id)
            if job is not None and job.job_id not in job_ids:
                job_ids.append(job.job_id)
            if job is not None and len(job_points.get(job.job_id, ())) > 1 and job.state in RUNNING_STATES:
                # a packed allocation runs its points one step each: a point has ended when its record names
                # the allocation, runs once the dispatcher has started it, else waits for nodes there
                if job.job_id not in allocations:  # its summary looked at once a look, not once a point
                    allocations[job.job_id] = self._started_in(job.job_id)
                started = allocations[job.job_id]
                if point_id in started:
                    ended = "end_s" in started[point_id]
                    record = self._record(point_id, point_id in due or (ended and point_id in self._queued))
                    job = None if record is not None and record.job_id == job.job_id else job
                else:
                    job = replace(job, state="PENDING")
                    reason = f"waiting for nodes in allocation {job.job_id}"
            if job is not None and job.state in RUNNING_STATES:
                state = "running"
                held.add(point_id)
            elif job is not None and job.state in PENDING_STATES:
                state = "pending"
                held.add(point_id)
            else:
                record = self._record(point_id, point_id in due or point_id in self._queued)
                if record is None:
                    state = "not started"
                else:
                    state, reason, version = record.state, record.reason, record.version
                    if record.job_id and record.job_id not in job_ids:
                        job_ids.append(record.job_id)
            statuses.append(
                PointStatus(
                    point_id=point_id, state=state, reason=reason, job_ids=tuple(job_ids), measurement_version=version
                )
            )
        self._queued = held
        return statuses

    def _record(self, point_id: str, fresh: bool) -> RecordSummary | None:
        """The point's record: looked at now when `fresh` or never before, else as last seen."""
        if fresh or point_id not in self._known:
            self._known[point_id] = self.records.look(point_id, self._paths[point_id])
        return self._known[point_id]

    def _round_robin(self, queued: Mapping[str, QueuedJob]) -> set[str]:
        """The points whose records this look reads again though nothing announced a change: as many, in
        turn, as the seconds since the last look earned (none without `every_s`)."""
        now = self._clock()
        last, self._last = self._last, now
        if self.every_s is None or last is None:
            return set()
        points = len(self._turn)
        rate = max(points / self.every_s, self.least_per_s)
        self._credit = min(self._credit + (now - last) * rate, float(points))
        due: set[str] = set()
        for _ in range(points):
            if self._credit < 1:
                break
            point_id = self._turn.popleft()
            self._turn.append(point_id)
            if point_id not in queued:  # a queued point's record is not read: no look spent on it
                due.add(point_id)
                self._credit -= 1
        return due

    def _started_in(self, job_id: str) -> dict[str, dict]:
        """The points a packed allocation's dispatcher has started, each with its step (an `end_s` once
        it ended), from its summary (ddlbench.launch.allocation): read once per version of the file."""
        path = self.sweep_dir / "packed" / f"allocation-{job_id}.json"
        try:
            stat = os.stat(path)
        except OSError:
            return {}
        version = (stat.st_mtime_ns, stat.st_size)
        cached = self._summaries.get(job_id)
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            started = {point["point_id"]: point for point in json.loads(path.read_text())["points"]}
        except (OSError, ValueError, KeyError, TypeError):
            started = {}
        self._summaries[job_id] = (version, started)
        return started


def summarize(statuses: list[PointStatus]) -> str:
    """`12 points: 8 ok, 2 failed, 1 oom, 1 running`, in STATES order, zero counts left out."""
    counts = Counter(status.state for status in statuses)
    parts = [f"{counts[state]} {state}" for state in STATES if counts[state]]
    return f"{len(statuses)} points: " + ", ".join(parts) + other_versions_note(statuses)


def other_versions_note(statuses: list[PointStatus]) -> str:
    """`; 3 records of measurement version 1 (this ddlbench measures 2: ...)`, or "" when all agree."""
    others = Counter(status.measurement_version for status in statuses if status.other_version)
    if not others:
        return ""
    versions = ", ".join(f"{count} of version {version}" for version, count in sorted(others.items()))
    return (
        f"; records of another measurement version: {versions} (this ddlbench measures version "
        f"{MEASUREMENT_VERSION}; reports leave them out of comparisons; delete them to measure again)"
    )
