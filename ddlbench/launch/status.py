"""Where a sweep stands: per point, its record's status or its job's state in the queue, and its job ids.

Points are matched to queued jobs by the comment Snakemake's SLURM plugin gives each job
(`rule_run_point_wildcards_<point id>`) and by the jobs index `ddlbench submit` keeps. The queue is
read with one squeue call.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ddlbench.launch.slurm import PENDING_STATES, RUNNING_STATES, QueuedJob
from ddlbench.records import MEASUREMENT_VERSION, Provenance, RecordError, read_record, record_path
from ddlbench.sweep import Plan

SNAKEMAKE_COMMENT_PREFIX = "rule_run_point_wildcards_"
# in the order the summary lists them
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


def points_of_job(job: QueuedJob, job_points: Mapping[str, list[str]]) -> list[str]:
    """The points a queued job runs: one (Snakemake's comment, a submitit task), or a packed allocation's."""
    if job.comment.startswith(SNAKEMAKE_COMMENT_PREFIX):
        return [job.comment[len(SNAKEMAKE_COMMENT_PREFIX) :]]
    return job_points.get(job.job_id, [])


def sweep_status(
    plan: Plan, *, queue: list[QueuedJob], jobs_index: Mapping[str, list[str]], sweep_dir: Path
) -> list[PointStatus]:
    """One PointStatus per planned point. A job in the queue wins over an older record (a rerun)."""
    job_points: dict[str, list[str]] = {}
    for point_id, job_ids in jobs_index.items():
        for job_id in job_ids:
            job_points.setdefault(job_id, []).append(point_id)
    queued: dict[str, QueuedJob] = {}
    for job in queue:
        for point_id in points_of_job(job, job_points):
            queued[point_id] = job
    statuses = []
    for point in plan.points:
        job_ids = list(jobs_index.get(point.point_id, []))
        reason = None
        version = None
        job = queued.get(point.point_id)
        if job is not None and job.job_id not in job_ids:
            job_ids.append(job.job_id)
        path = record_path(sweep_dir, point.point_id)
        if job is not None and len(job_points.get(job.job_id, ())) > 1 and job.state in RUNNING_STATES:
            # a packed allocation runs its points one step each: a point has ended when its record names
            # the allocation, runs once the dispatcher has started it, else waits for nodes there
            job = None if _recorded_in(path, job.job_id) else job
            if job is not None and point.point_id not in _started_in(sweep_dir, job.job_id):
                job = replace(job, state="PENDING")
                reason = f"waiting for nodes in allocation {job.job_id}"
        if job is not None and job.state in RUNNING_STATES:
            state = "running"
        elif job is not None and job.state in PENDING_STATES:
            state = "pending"
        elif path.exists():
            try:
                record = read_record(path)
                state, reason, version = record.status, record.reason, record.measurement_version
                ran_in = _job_id_of(record.provenance)
                if ran_in and ran_in not in job_ids:
                    job_ids.append(ran_in)
            except RecordError as exc:
                state, reason = "unreadable", str(exc)
        else:
            state = "not started"
        statuses.append(
            PointStatus(
                point_id=point.point_id,
                state=state,
                reason=reason,
                job_ids=tuple(job_ids),
                measurement_version=version,
            )
        )
    return statuses


def _recorded_in(path: Path, job_id: str) -> bool:
    try:
        return path.exists() and _job_id_of(read_record(path).provenance) == job_id
    except RecordError:
        return False


def _started_in(sweep_dir: Path, job_id: str) -> set[str]:
    """The points a packed allocation's dispatcher has started (its summary, ddlbench.launch.allocation)."""
    path = sweep_dir / "packed" / f"allocation-{job_id}.json"
    try:
        return {point["point_id"] for point in json.loads(path.read_text())["points"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _job_id_of(provenance: Provenance) -> str | None:
    slurm = provenance.slurm
    if slurm is not None and slurm.array_task_id is not None:
        return f"{slurm.array_job_id}_{slurm.array_task_id}"
    return provenance.slurm_job_id


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
