"""Talking to SLURM: what the cluster offers, what the current job is, what is in the queue.

Every call is one subprocess with a time limit, and it fails with a message naming the command: a
login node whose controller does not answer must not hang ddlbench. Torch-free.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddlbench.errors import DdlbenchError
from ddlbench.launch.resources import Resources
from ddlbench.records import SlurmJob

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 60


class SlurmError(DdlbenchError):
    """A SLURM command failed or is missing."""


def run_slurm(command: list[str], *, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a SLURM client command and return its stdout."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} not found: is this a SLURM login node, and is SLURM on PATH?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(command)}` did not answer within {timeout_s:g} s") from None
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        raise SlurmError(f"`{shlex.join(command)}` failed: {detail}")
    return result.stdout


def parse_oneliner(line: str) -> dict[str, str]:
    """Key=value pairs of one `scontrol show -o` line (values never contain spaces there, except the
    few free-text fields at the end, which ddlbench does not read)."""
    pairs = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            pairs[key] = value
    return pairs


def parse_time_min(text: str) -> int | None:
    """Minutes of a SLURM time ([D-]HH:MM:SS, MM:SS, MM, D-HH[:MM]); None for UNLIMITED/INFINITE."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
        parts = [int(part) for part in text.split(":")] + [0, 0]
        hours, minutes, seconds = parts[:3]
    else:
        parts = [int(part) for part in text.split(":")]
        if len(parts) == 3:
            hours, minutes, seconds = parts
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = 0, parts[0], 0
    return days * 24 * 60 + hours * 60 + minutes + (1 if seconds else 0)


@dataclass(frozen=True, kw_only=True)
class Partition:
    name: str
    total_nodes: int
    max_time_min: int | None  # None: no limit
    state: str


def parse_partitions(text: str) -> dict[str, Partition]:
    partitions = {}
    for line in text.splitlines():
        fields = parse_oneliner(line)
        if "PartitionName" not in fields:
            continue
        partitions[fields["PartitionName"]] = Partition(
            name=fields["PartitionName"],
            total_nodes=int(fields.get("TotalNodes", "0")),
            max_time_min=parse_time_min(fields.get("MaxTime", "UNLIMITED")),
            state=fields.get("State", "UP"),
        )
    return partitions


def query_partitions() -> dict[str, Partition]:
    return parse_partitions(run_slurm(["scontrol", "show", "partition", "-o"]))


def query_account_required() -> bool:
    """Whether the controller rejects jobs without an association (AccountingStorageEnforce)."""
    for line in run_slurm(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageEnforce":
            return "associations" in value.lower()
    return False


def check_resources(
    planned: Iterable[tuple[str, Resources]], partitions: Mapping[str, Partition], *, account_required: bool
) -> None:
    """Refuse, before anything is submitted, a point the cluster would reject or hold forever: an
    unknown partition, more nodes than the partition has, a time limit over the partition's, a missing
    account where one is required. The message names the point and the value."""
    for point_id, resources in planned:
        partition = partitions.get(resources.partition)
        if partition is None:
            raise DdlbenchError(
                f"point {point_id}: partition {resources.partition!r} does not exist; "
                f"partitions of this cluster: {', '.join(sorted(partitions)) or 'none'}"
            )
        if resources.nodes > partition.total_nodes:
            raise DdlbenchError(
                f"point {point_id}: needs {resources.nodes} nodes, but partition {partition.name!r} has "
                f"{partition.total_nodes}; drop the larger node counts or choose another partition"
            )
        if resources.time_min < 1:
            raise DdlbenchError(f"point {point_id}: time limit {resources.time_min} min is not a valid limit")
        if partition.max_time_min is not None and resources.time_min > partition.max_time_min:
            raise DdlbenchError(
                f"point {point_id}: time limit {resources.time_limit} (timeout_s plus the site's margin) is over "
                f"the {partition.max_time_min} min that partition {partition.name!r} allows; lower timeout_s"
            )
        if account_required and not resources.account:
            raise DdlbenchError(
                f"point {point_id}: this cluster requires an account and none is set; "
                "give one with `ddlbench profile slurm --account NAME`"
            )


def check_cluster(planned: list[tuple[str, Resources]], *, account_required: bool | None = None) -> None:
    """check_resources against the live cluster (scontrol), which is asked once."""
    if account_required is None:
        account_required = query_account_required()
    check_resources(planned, query_partitions(), account_required=account_required)


_GPU_TRES = re.compile(r"gres/gpu(?::[^=,]*)?=(\d+)")


def parse_allocation(job_id: str, scontrol_line: str) -> SlurmJob:
    fields = parse_oneliner(scontrol_line.strip().splitlines()[0] if scontrol_line.strip() else "")
    gpus = sum(int(count) for count in _GPU_TRES.findall(fields.get("AllocTRES", "")))

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    array_task = fields.get("ArrayTaskId")
    return SlurmJob(
        job_id=fields.get("JobId", job_id),
        array_job_id=fields.get("ArrayJobId") if array_task else None,
        array_task_id=array_task,
        partition=fields.get("Partition"),
        node_list=fields.get("NodeList"),
        num_nodes=number("NumNodes"),
        num_cpus=number("NumCPUs"),
        num_gpus=gpus,
        restarts=number("Restarts") or 0,
    )


def current_allocation(environ: Mapping[str, str] | None = None) -> SlurmJob | None:
    """The allocation this process runs in, or None outside SLURM. Asks the controller rather than
    reading SLURM_* variables: Snakemake's job step does not pass all of them on."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    # an array task's SLURM_JOB_ID may be the array's own id, which scontrol expands to every task
    array_job, array_task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    query = f"{array_job}_{array_task}" if array_job and array_task else job_id
    try:
        return parse_allocation(job_id, _describe_job(query))
    except SlurmError as exc:
        log.warning("cannot describe SLURM job %s: %s", job_id, exc)
        return SlurmJob(
            job_id=job_id,
            array_job_id=environ.get("SLURM_ARRAY_JOB_ID"),
            array_task_id=environ.get("SLURM_ARRAY_TASK_ID"),
            partition=environ.get("SLURM_JOB_PARTITION"),
            node_list=environ.get("SLURM_JOB_NODELIST"),
            num_nodes=None,
            num_cpus=None,
            num_gpus=0,
            restarts=int(environ.get("SLURM_RESTART_COUNT", "0")),
        )


@functools.cache
def _describe_job(query: str) -> str:
    # the launcher and the record both need the allocation: ask the controller once per process
    return run_slurm(["scontrol", "show", "job", "-o", query])


def first_host(node_list: str) -> str:
    """First hostname of a SLURM node list such as "n[1-4],m2", as scontrol expands it."""
    return run_slurm(["scontrol", "show", "hostnames", node_list]).split()[0]


@dataclass(frozen=True, kw_only=True)
class QueuedJob:
    job_id: str  # 123, or 123_4 for an array task
    state: str  # PENDING, RUNNING, COMPLETING, ...
    name: str
    comment: str


QUEUE_FORMAT = "%i|%T|%j|%k"


def parse_queue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 3)
        if len(parts) == 4:
            jobs.append(QueuedJob(job_id=parts[0], state=parts[1], name=parts[2], comment=parts[3]))
    return jobs


def query_queue() -> list[QueuedJob]:
    """This user's jobs still in the queue, all in one squeue call."""
    user = getpass.getuser()
    return parse_queue(run_slurm(["squeue", "-h", "-r", "-u", user, "-o", QUEUE_FORMAT]))
