"""Submitting a sweep's points to SLURM without Snakemake (submitit), and what both ways share.

Points that need the same allocation go out as one job array (one sbatch), or as several where the
user's limits (MaxArraySize, the submit limits) allow fewer at once, the later ones as earlier jobs end
(ddlbench.launch.waves); each array task runs one point with the same runner as `ddlbench run-point`,
so the records are the same. A point whose job is
preempted or reaches its time limit is requeued through submitit's checkpointing and runs again from
its start (a benchmark's timings cannot be stitched across allocations), up to a bound; past it, the
point's record says `timeout`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.limits import UserLimits, is_limit_refusal, read_limits
from ddlbench.launch.patience import set_patience
from ddlbench.launch.placement import pass_on
from ddlbench.launch.resources import MemoryDefaults, Resources, Site, resources_for, submitit_parameters
from ddlbench.launch.result_watch import ResultNap  # QueueWatch's sleep: noticed job ends
from ddlbench.launch.slurm import ClusterFacts, QueuedJob, SlurmError, query_cluster
from ddlbench.launch.waves import LimitRefusal, QueueWatch, submit_in_waves, wait_for_jobs
from ddlbench.point import Point
from ddlbench.records import record_path

log = logging.getLogger(__name__)

JOBS_INDEX = "slurm-jobs.json"  # in the sweep folder: which SLURM job ran which point
MAX_REQUEUES = 2


def plan_resources(
    points: Iterable[Point],
    site: Site,
    *,
    sweep: Any = None,
    mem_factor: float = 1.0,
    time_factor: float = 1.0,
    facts: ClusterFacts | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Resources]:
    """point id → allocation, with the sweep's own partition and memory (its `slurm` section) over the site's.
    Where neither names the memory per rank, the partition's defaults come from `facts`, else from what the
    login node passed on to the job (MEMORY_DEFAULTS_VAR: a job does not ask the controller again), else
    from the live cluster, asked once and passed on to every process started from here. This process
    waits for the controller as long as the site says (ddlbench.launch.patience)."""
    environ = os.environ if environ is None else environ
    set_patience(site.controller_patience_s)
    pass_on(site)  # the jobs' launchers bind GPUs and set the network variables as the site says
    points = list(points)
    partition = getattr(sweep, "slurm_partition", None) or site.partition
    sweep_mem = getattr(sweep, "slurm_mem_per_rank_mb", None)
    defaults = None
    if sweep_mem is None and site.mem_per_rank_mb is None:
        defaults = None if facts else _passed_on(environ, partition)
        if defaults is None:
            facts = facts or query_cluster()
            defaults = facts.memory_defaults(partition)
            if defaults is None and points:
                others = f" (and the {len(points) - 1} other points)" if len(points) > 1 else ""
                raise DdlbenchError(
                    f"point {points[0].point_id}{others}: partition {partition!r} does not exist; "
                    f"partitions of this cluster: {', '.join(sorted(facts.partitions)) or 'none'}"
                )
            if defaults is not None and environ is os.environ:  # passed on to the jobs this process submits
                os.environ[MEMORY_DEFAULTS_VAR] = json.dumps(asdict(defaults), sort_keys=True)
    return {
        point.point_id: resources_for(
            point,
            site,
            partition=partition,
            mem_per_rank_mb=sweep_mem,
            mem_factor=mem_factor,
            time_factor=time_factor,
            memory_defaults=defaults,
            pinned_one_at_a_time=bool(getattr(sweep, "slurm_pinned_one_at_a_time", False)),
        )
        for point in points
    }


# a partition's memory defaults as the login node read them, passed on to the jobs it submits (sbatch
# exports the environment), so that the workflow planned again inside each job asks the controller nothing
MEMORY_DEFAULTS_VAR = "DDLBENCH_MEMORY_DEFAULTS"


def _passed_on(environ: Mapping[str, str], partition: str) -> MemoryDefaults | None:
    """The memory defaults passed on by the login node, inside a job and for the same partition only."""
    text = environ.get(MEMORY_DEFAULTS_VAR)
    if not text or not environ.get("SLURM_JOB_ID"):
        return None
    try:
        defaults = MemoryDefaults(**json.loads(text))
    except (TypeError, ValueError) as exc:
        log.warning("%s is not readable (%s); asking the controller", MEMORY_DEFAULTS_VAR, exc)
        return None
    return defaults if defaults.partition == partition else None


class PointJob:
    """What one array task runs: a point, through the srun launcher, writing its record.

    submitit calls `checkpoint` when SLURM signals preemption or the time limit; the job is then
    requeued with the next attempt, until MAX_REQUEUES, after which a `timeout` record is written."""

    def __init__(self, spec: str, out: str, *, timeout_s: float, attempt: int = 0, max_requeues: int = MAX_REQUEUES):
        self.spec = spec
        self.out = out
        self.timeout_s = timeout_s
        self.attempt = attempt
        self.max_requeues = max_requeues

    @property
    def point(self) -> Any:
        """The job's point: a training Point, or a calibration point (`ddlbench calibrate --submit`)."""
        spec = json.loads(self.spec)
        if spec.get("kind") == "calibration":
            from ddlbench.train.calibration.point import CalibrationPoint

            return CalibrationPoint.from_dict(spec)
        return Point.from_dict(spec)

    def __call__(self) -> str:
        from ddlbench.launch.runner import run_point

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        point = self.point
        log.info("point %s, attempt %d", point.point_id, self.attempt)
        if not isinstance(point, Point):
            from ddlbench.launch.calibration import run_calibration_point

            return run_calibration_point(point, out=Path(self.out), launcher="srun").status
        from ddlbench.train.faults import lose_job_once

        lose_job_once(point.point_id, Path(self.out).parent)  # DDLBENCH_INJECT_FAULT=lost: tests only
        return run_point(point, out=Path(self.out), launcher="srun", timeout_s=self.timeout_s).status

    def checkpoint(self) -> Any:
        import submitit

        if self.attempt >= self.max_requeues:
            from ddlbench.launch.runner import write_unfinished_record

            reason = (
                f"SLURM stopped the job (time limit or preemption) {self.attempt + 1} times; "
                f"not requeued again after {self.max_requeues} requeues"
            )
            if isinstance(self.point, Point):
                write_unfinished_record(self.point, out=Path(self.out), status="timeout", reason=reason)
            else:
                from ddlbench.train.calibration.records import missing_record, write_calibration_record

                stopped = replace(missing_record(self.point, reason), status="timeout", launcher="srun")
                write_calibration_record(Path(self.out), stopped)
            return None
        log.warning("point %s: stopped by SLURM; requeuing as attempt %d", self.point.point_id, self.attempt + 1)
        again = PointJob(
            self.spec, self.out, timeout_s=self.timeout_s, attempt=self.attempt + 1, max_requeues=self.max_requeues
        )
        return submitit.helpers.DelayedSubmission(again)


@dataclass(frozen=True, kw_only=True)
class Submitted:
    point_id: str
    job_id: str


def submit_points(
    points: list[Point],
    planned: Mapping[str, Resources],
    *,
    sweep_dir: Path,
    name: str,
    timeout_factor: float = 1.0,
    max_requeues: int = MAX_REQUEUES,
    array_parallelism: int = 64,
    facts: ClusterFacts | None = None,
    watch: QueueWatch | None = None,
) -> list[Any]:
    """Submit `points`, one job array per distinct allocation as far as the user's limits allow (else
    in several, as earlier jobs end); returns submitit's jobs in point order once all are submitted."""
    import submitit
    from submitit.core.utils import FailedJobError

    from ddlbench.launch.submit_once import guard_sbatch

    guard_sbatch(sweep_dir / "logs" / "sbatch-guard.log")  # outlives a controller outage, never submits twice
    groups: dict[Resources, list[Point]] = {}
    for point in points:
        groups.setdefault(planned[point.point_id], []).append(point)
    # one folder per array, made before its sbatch: submitit's own per-job folder (%j) is made only once
    # sbatch has answered, and a task that starts before that cannot open its output and fails at once
    batches = itertools.count()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    jobs_by_point: dict[str, Any] = {}
    facts = facts or query_cluster()
    read: dict[tuple[str | None, str | None, str], UserLimits] = {}

    def limits_of(resources: Resources) -> UserLimits:
        key = (resources.account, resources.qos, resources.partition)
        if key not in read:
            read[key] = read_limits(facts, account=key[0], qos=key[1], partition=key[2])
        return read[key]

    def submit(resources: Resources, members: list[Point]) -> list[str]:
        folder = sweep_dir / "submitit" / f"{stamp}-{next(batches)}"
        folder.mkdir(parents=True, exist_ok=True)
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        executor.update_parameters(
            name=f"ddlbench-{name}",
            slurm_array_parallelism=array_parallelism,
            **submitit_parameters(resources),
        )
        callables = [
            PointJob(
                point.to_json(),
                str(record_path(sweep_dir, point.point_id).resolve()),
                timeout_s=point.timeout_s * timeout_factor,
                max_requeues=max_requeues,
            )
            for point in members
        ]
        try:
            with executor.batch():
                group_jobs = [executor.submit(job) for job in callables]
        except FailedJobError as exc:
            message = " ".join(str(exc).split())
            if is_limit_refusal(message):
                raise LimitRefusal(message) from None
            raise SlurmError(f"sbatch refused {len(members)} point(s) of sweep {name!r}: {message}") from None
        for point, job in zip(members, group_jobs, strict=True):
            jobs_by_point[point.point_id] = job
        remember_jobs(sweep_dir, {point.point_id: job.job_id for point, job in zip(members, group_jobs, strict=True)})
        log.info(
            "submitted %d point(s) as job array %s (%d node(s) × %d task(s), %s)",
            len(members),
            group_jobs[0].job_id.split("_")[0],
            resources.nodes,
            resources.tasks_per_node,
            resources.time_limit,
        )
        return [job.job_id for job in group_jobs]

    watch = watch or QueueWatch(sleep=ResultNap(lambda: jobs_by_point.values()))
    submit_in_waves(list(groups.items()), submit, limits=limits_of, watch=watch)
    return [jobs_by_point[point.point_id] for point in points]


def remember_jobs(sweep_dir: Path, jobs: Mapping[str, str]) -> None:
    """Add point → job ids to the sweep's jobs index (a point keeps every job that ever ran it)."""
    index = read_jobs_index(sweep_dir)
    for point_id, job_id in jobs.items():
        index.setdefault(point_id, [])
        if job_id not in index[point_id]:
            index[point_id].append(job_id)
    write_text_atomic(sweep_dir / JOBS_INDEX, json.dumps(index, indent=1, sort_keys=True) + "\n")


def read_jobs_index(sweep_dir: Path) -> dict[str, list[str]]:
    path = sweep_dir / JOBS_INDEX
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DdlbenchError(f"{path} is not valid JSON: {exc}") from None


def wait_for(
    jobs: list[Any], *, watch: QueueWatch | None = None, on_poll: Callable[[list[QueuedJob]], None] | None = None
) -> None:
    """Wait until every job has ended: one squeue call per poll for all of them, at an interval that
    grows while none ends (QueueWatch), and shortened when a job writes its result; then each job's
    result, read from its file. `on_poll` gets the queue of every poll (progress: ddlbench.launch.progress)."""
    watch = watch or QueueWatch(sleep=ResultNap(lambda: jobs))
    wait_for_jobs([job.job_id for job in jobs], watch=watch, on_poll=on_poll)
    for job in jobs:
        try:
            job.result()
        except Exception as exc:
            log.warning("job %s ended without a result: %s", job.job_id, str(exc).strip().splitlines()[-1][:500])


# SLURM's states of a job that ended before its point could run or write anything (its launcher step
# refused, say, by a controller that had just come back): the point is submitted once more
LOST_STATES = ("FAILED", "NODE_FAIL", "BOOT_FAIL")


def lost_before_running(points: list[Point], jobs: list[Any], sweep_dir: Path) -> list[tuple[Point, str]]:
    """(point, its job's state) for each point without a record whose job ended in a LOST_STATES state
    (submitit's job.state, from sacct): its job failed before the point ran. A cancelled job is the user's
    choice, and a timed-out or preempted one was requeued (PointJob): neither is taken here."""
    lost = []
    for point, job in zip(points, jobs, strict=True):
        if record_path(sweep_dir, point.point_id).exists():
            continue
        try:
            state = str(job.state).split()[0].upper()
        except Exception as exc:  # submitit's sacct reading: a state not known is not taken as lost
            log.warning("state of job %s not known: %s", job.job_id, exc)
            continue
        if state.startswith(LOST_STATES):
            lost.append((point, state))
    return lost
