"""How many jobs this user may have queued at once, and how large an array may be, as SLURM enforces it.

Read from the user's association (MaxSubmitJobs, MaxJobs, GrpSubmitJobs, GrpJobs, GrpTRES) and the QOS
the jobs will run in (MaxSubmitJobsPerUser and the others), through two sacctmgr calls, and from the
controller's MaxArraySize and MaxJobCount (`scontrol show config`, in ClusterFacts). Against these, the
user's jobs in the queue (one squeue call) say how many more may go in now.

Only the limits a sweep's jobs can be refused for at submission count as room: the submit limits and
MaxJobCount. MaxJobs, GrpJobs and GrpTRES limit what runs, not what is queued: jobs past them wait in
the queue, which is where a sweep's jobs should wait, so they are reported and not waited on. Group
limits (Grp*, MaxJobCount) count other users' jobs too, which one user cannot see; an sbatch refusal
for a limit is therefore retried later anyway (ddlbench.launch.waves). Torch-free.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddlbench.errors import DdlbenchError
from ddlbench.launch.slurm import ClusterFacts, QueuedJob, SlurmError, parse_time_min, run_slurm

log = logging.getLogger(__name__)

ASSOC_FIELDS = ("Cluster", "Account", "User", "Partition", "MaxSubmit", "MaxJobs", "GrpSubmit", "GrpJobs", "GrpTRES")
ASSOC_FIELDS += ("QOS", "DefaultQOS", "MaxWall", "MaxTRES", "MaxTRESPerNode")
# per user (PU) and per account (PA) limits of a QOS, and its group limits over every user in it
QOS_FIELDS = ("Name", "MaxSubmitPU", "MaxSubmitPA", "GrpSubmit", "MaxJobsPU", "MaxJobsPA", "GrpJobs", "GrpTRES")
QOS_FIELDS += ("MaxWall", "MaxTRES", "MaxTRESPerNode", "MaxTRESPU")
# limits on one job's trackable resources (TRES): a job over one of them alone never starts. (field, name, per)
ASSOC_TRES = (("MaxTRES", "MaxTRESPerJob", "job"), ("MaxTRESPerNode", "MaxTRESPerNode", "node"))
ASSOC_TRES += (("GrpTRES", "GrpTRES", "job"),)
QOS_TRES = (("MaxTRES", "MaxTRESPerJob", "job"), ("MaxTRESPerNode", "MaxTRESPerNode", "node"))
QOS_TRES += (("MaxTRESPU", "MaxTRESPerUser", "job"), ("GrpTRES", "GrpTRES", "job"))
QOS_SUBMIT = {
    "MaxSubmitPU": "MaxSubmitJobsPerUser",
    "MaxSubmitPA": "MaxSubmitJobsPerAccount",
    "GrpSubmit": "GrpSubmitJobs",
}
# (sacctmgr's field, the limit's name, what it limits)
ASSOC_LIMITS = (
    ("MaxSubmit", "MaxSubmitJobs", "submit"),
    ("GrpSubmit", "GrpSubmitJobs", "submit"),
    ("MaxJobs", "MaxJobs", "running"),
    ("GrpJobs", "GrpJobs", "running"),
)
QOS_RUN = {"MaxJobsPU": "MaxJobsPerUser", "MaxJobsPA": "MaxJobsPerAccount", "GrpJobs": "GrpJobs"}

# sbatch's words when a job is refused for a limit on jobs queued, which lifts as jobs end. "Job violates
# accounting/QOS policy" alone also covers a job too large or too long for its QOS, which never lifts;
# the reason code sbatch prints before it (QOSMaxSubmitJobPerUserLimit, ...) tells them apart.
_LIMIT_REFUSAL = re.compile(
    r"MaxSubmitJob|GrpSubmitJob|SubmitJobsLimit|MaxJobCount|temporarily unable to accept job"
    r"|Resource temporarily unavailable|Job submit limit|job count limit",
    re.IGNORECASE,
)


def is_limit_refusal(message: str) -> bool:
    """Whether sbatch refused a job for a limit on queued jobs (to retry once some have ended)."""
    return bool(_LIMIT_REFUSAL.search(message))


@dataclass(frozen=True, kw_only=True)
class Limit:
    """A most-jobs-at-once limit, and which of the user's queued jobs count against it."""

    name: str  # who sets it and its sacctmgr/scontrol name: "QOS 'normal' MaxSubmitJobsPerUser"
    value: int
    account: str | None = None  # only jobs charged to this account count (the association's limits)
    qos: str | None = None  # only jobs in this QOS count (the QOS' limits)

    def used(self, queue: Iterable[QueuedJob]) -> int:
        """The user's queued jobs this limit counts (every array task is a job)."""
        return sum(
            1
            for job in queue
            if job.active
            and (self.account is None or job.account == self.account)
            and (self.qos is None or job.qos == self.qos)
        )


@dataclass(frozen=True, kw_only=True)
class JobLimit:
    """A limit one job must keep under to ever start: a wall time, or TRES per job or per node."""

    name: str  # who sets it and its name: "QOS 'normal' MaxWall", "association proj/ana GrpTRES"
    minutes: int | None = None  # a wall-time limit
    tres: tuple[tuple[str, int], ...] = ()  # ("cpu", 64), ("node", 4), ("mem", MB), ("gres/gpu", 8)
    per: str = "job"  # "job": the job's total; "node": each of its nodes


def parse_tres(text: str) -> tuple[tuple[str, int], ...]:
    """`cpu=64,node=4,mem=100G,gres/gpu:a100=8` → (("cpu", 64), ...) with memory in MB and typed GPUs
    counted as gres/gpu; unlimited entries (-1, empty) are left out."""
    out: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not value:
            continue
        key = "gres/gpu" if key.startswith("gres/gpu") else key
        match = re.fullmatch(r"(\d+)([KMGTP]?)", value.strip())
        if not match:
            continue
        number = int(match.group(1))
        if key == "mem":  # sacctmgr's memory is in MB unless suffixed
            unit = match.group(2)
            number = (
                number // 1024 if unit == "K" else number * {"": 1, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}[unit]
            )
        out[key] = out.get(key, 0) + number if key == "gres/gpu" else number
    return tuple(sorted(out.items()))


@dataclass(frozen=True, kw_only=True)
class UserLimits:
    """The limits a user's jobs in one account and QOS meet."""

    user: str
    account: str | None  # the account the jobs are charged to: the one named, else the user's default
    qos: str | None  # the QOS they run in: the one named, else the association's default
    submit: tuple[Limit, ...] = ()  # on jobs queued (pending or running): sbatch refuses past them
    running: tuple[Limit, ...] = ()  # on jobs running: past them, jobs wait
    grp_tres: tuple[tuple[str, str], ...] = ()  # (whose, "cpu=64,node=4"): what all running jobs may hold
    max_array_size: int | None = None
    per_job: tuple[JobLimit, ...] = ()  # wall time and TRES one job must keep under (ddlbench.launch.admission)

    def room(self, queue: Iterable[QueuedJob]) -> int | None:
        """How many more jobs may be queued now (0 at or over a limit); None where no limit is known."""
        queue = list(queue)
        rooms = [limit.value - limit.used(queue) for limit in self.submit]
        return max(0, min(rooms)) if rooms else None

    def tightest(self, queue: Iterable[QueuedJob]) -> Limit | None:
        queue = list(queue)
        return min(self.submit, key=lambda limit: limit.value - limit.used(queue), default=None)

    def describe(self) -> str:
        """One line for the log: every limit read, or that there are none."""
        parts = [f"{limit.name}={limit.value}" for limit in (*self.submit, *self.running)]
        parts += [f"{whose} GrpTRES={tres}" for whose, tres in self.grp_tres]
        parts += [
            f"{limit.name}={limit.minutes} min" if limit.minutes is not None else
            f"{limit.name}={','.join(f'{key}={value}' for key, value in limit.tres)}"
            for limit in self.per_job
            if "GrpTRES" not in limit.name
        ]  # fmt: skip
        if self.max_array_size is not None:
            parts.append(f"MaxArraySize={self.max_array_size}")
        return ", ".join(parts) or "no limits"


def _number(text: str) -> int | None:
    """A sacctmgr limit: an integer, or None where it is unset (empty) or unlimited (-1, 'UNLIMITED')."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def _rows(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        values = line.split("|")
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values, strict=True)))
    return rows


def parse_associations(text: str) -> list[dict[str, str]]:
    """`sacctmgr -nP show assoc where user=U format=<ASSOC_FIELDS>`: one mapping per association."""
    return _rows(text, ASSOC_FIELDS)


def parse_qos(text: str) -> dict[str, dict[str, str]]:
    """`sacctmgr -nP show qos format=<QOS_FIELDS>`: QOS name → its limits."""
    return {row["Name"]: row for row in _rows(text, QOS_FIELDS)}


def build_limits(
    *,
    user: str,
    account: str | None,
    qos: str | None,
    partition: str | None,
    associations: list[dict[str, str]],
    qos_table: dict[str, dict[str, str]],
    facts: ClusterFacts,
) -> UserLimits:
    """The limits that hold for `user`'s jobs charged to `account` (else the default) in `qos` (else the
    association's default), from sacctmgr's rows and the controller's facts."""
    account = account or facts.default_account
    submit: list[Limit] = []
    running: list[Limit] = []
    grp_tres: list[tuple[str, str]] = []
    if facts.max_job_count:
        submit.append(Limit(name="MaxJobCount", value=facts.max_job_count))
    mine = [
        row
        for row in associations
        if row["User"] == user
        and (account is None or row["Account"] == account)
        and (not facts.cluster_name or not row["Cluster"] or row["Cluster"] == facts.cluster_name)
        and (not row["Partition"] or row["Partition"] == partition)
    ]
    per_job: list[JobLimit] = []
    if facts.limits_enforced:
        for row in mine:
            whose = f"association {row['Account']}/{user}" + (f"/{row['Partition']}" if row["Partition"] else "")
            for key, name, into in ASSOC_LIMITS:
                value = _number(row[key])
                if value is not None:
                    into_list = submit if into == "submit" else running
                    into_list.append(Limit(name=f"{whose} {name}", value=value, account=row["Account"]))
            if row["GrpTRES"]:
                grp_tres.append((whose, row["GrpTRES"]))
            per_job += _job_limits(row, whose, ASSOC_TRES)
    if qos is None:
        qos = _default_qos(mine)
    found = qos_table.get(qos) if qos else None
    if facts.limits_enforced and found:
        for key, name in QOS_SUBMIT.items():
            value = _number(found[key])
            if value is not None:
                per_account = account if key == "MaxSubmitPA" else None
                submit.append(Limit(name=f"QOS {qos!r} {name}", value=value, qos=qos, account=per_account))
        for key, name in QOS_RUN.items():
            value = _number(found[key])
            if value is not None:
                running.append(Limit(name=f"QOS {qos!r} {name}", value=value, qos=qos))
        if found["GrpTRES"]:
            grp_tres.append((f"QOS {qos!r}", found["GrpTRES"]))
        per_job += _job_limits(found, f"QOS {qos!r}", QOS_TRES)
    return UserLimits(
        user=user,
        account=account,
        qos=qos,
        submit=tuple(submit),
        running=tuple(running),
        grp_tres=tuple(grp_tres),
        max_array_size=facts.max_array_size,
        per_job=tuple(per_job),
    )


def _job_limits(row: dict[str, str], whose: str, tres_fields: tuple[tuple[str, str, str], ...]) -> list[JobLimit]:
    """The wall-time and TRES limits of one association's or QOS' row that a single job must keep under."""
    found = []
    wall = row.get("MaxWall", "").strip()
    if wall:
        minutes = parse_time_min(wall)
        if minutes is not None:
            found.append(JobLimit(name=f"{whose} MaxWall", minutes=minutes))
    for key, name, per in tres_fields:
        tres = parse_tres(row.get(key, ""))
        if tres:
            found.append(JobLimit(name=f"{whose} {name}", tres=tres, per=per))
    return found


def _default_qos(associations: list[dict[str, str]]) -> str | None:
    """The QOS a job naming none gets: its association's DefaultQOS, else its only QOS, else `normal`."""
    for row in associations:
        if row["DefaultQOS"]:
            return row["DefaultQOS"]
    allowed = {name for row in associations for name in row["QOS"].split(",") if name}
    if len(allowed) == 1:
        return allowed.pop()
    return "normal" if not allowed or "normal" in allowed else None


def read_limits(
    facts: ClusterFacts, *, account: str | None = None, qos: str | None = None, partition: str | None = None
) -> UserLimits:
    """The user's limits from the live accounting database: two sacctmgr calls where limits are
    enforced, none where they are not. Where sacctmgr does not answer, only the controller's limits
    are known; sbatch's refusals are retried all the same."""
    associations: list[dict[str, str]] = []
    qos_table: dict[str, dict[str, str]] = {}
    if facts.limits_enforced:
        try:
            where = ["where", f"user={facts.user}", f"format={','.join(ASSOC_FIELDS)}"]
            associations = parse_associations(run_slurm(["sacctmgr", "-nP", "show", "assoc", *where]))
            qos_table = parse_qos(run_slurm(["sacctmgr", "-nP", "show", "qos", f"format={','.join(QOS_FIELDS)}"]))
        except SlurmError as exc:
            log.warning("cannot read %s's limits from sacctmgr (%s); sbatch's refusals are retried", facts.user, exc)
    limits = build_limits(
        user=facts.user,
        account=account,
        qos=qos,
        partition=partition,
        associations=associations,
        qos_table=qos_table,
        facts=facts,
    )
    log.info("SLURM limits of %s (account %s, QOS %s): %s", limits.user, limits.account, limits.qos, limits.describe())
    return limits


def check_room(*, jobs: int, to_run: int, limits: UserLimits, queue: list[QueuedJob]) -> None:
    """Refuse a Snakemake run that would queue more jobs at once (its --jobs, or the points left to run
    if fewer) than the user's submit limits leave room for now: Snakemake's SLURM plugin counts a job
    that sbatch refuses as failed, so the fix is a lower --jobs, or waiting."""
    wanted = min(jobs, to_run)
    room = limits.room(queue)
    tightest = limits.tightest(queue)
    if room is None or tightest is None or wanted <= room:
        return
    used = tightest.used(queue)
    fix = f"run with `--jobs {room}`" if room else "wait until some of them have ended"
    raise DdlbenchError(
        f"Snakemake would queue up to {wanted} jobs at once, but {tightest.name} is {tightest.value} and "
        f"{used} of your jobs already count against it, leaving room for {room}; {fix} "
        "(sbatch would refuse the others, and Snakemake count them as failed)"
    )
