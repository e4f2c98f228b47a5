"""Whether a job could ever start under the limits that hold for it, asked before anything is submitted,
and the largest allocation that could (for sizing packed allocations).

SLURM takes a job over a QOS' or an association's per-job limit (MaxWall, MaxTRESPerJob, MaxTRESPerNode,
MaxTRESPerUser, GrpTRES) into the queue and leaves it pending for good with a reason such as
QOSMaxWallDurationPerJobLimit, unless the QOS has DenyOnLimit; a job in a partition whose AllowQos or
AllowAccounts leave it out is refused. Either way, hours later a sweep has not run. Here each point, or
each packed allocation as the N-node job it is, is held against:

- the partition: MaxTime, MaxNodes, MaxCPUsPerNode, MaxMemPerNode and its nodes
  (ddlbench.launch.slurm.check_resources), AllowQos/DenyQos, AllowAccounts/DenyAccounts;
- the QOS the job runs in and the user's association (ddlbench.launch.limits, read from sacctmgr where
  AccountingStorageEnforce holds limits): MaxWall, MaxTRESPerJob, MaxTRESPerNode, MaxTRESPerUser and
  GrpTRES (a job alone over what the user or group may hold at once), MaxJobs=0.

A job's TRES are counted as the least it is charged: CPUs and memory as requested (a whole node is
charged more, never less) and GPUs as requested; so a refusal here is certain, never a guess. Each
refusal names the point or allocation, the limit, its value and the remedy. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddlbench.errors import DdlbenchError
from ddlbench.launch.limits import JobLimit, UserLimits, read_limits
from ddlbench.launch.resources import Resources
from ddlbench.launch.slurm import ClusterFacts, Partition, check_resources, query_cluster


@dataclass(frozen=True, kw_only=True)
class JobShape:
    """What one job asks for, as its limits count it."""

    nodes: int
    cpus_per_node: int
    mem_per_node_mb: int | None  # None: whole nodes (--mem=0), not counted against a memory limit
    gpus_per_node: int
    time_min: int

    def tres(self) -> dict[str, int]:
        """The job's TRES in total (per job); memory in MB."""
        total = {
            "node": self.nodes,
            "cpu": self.nodes * self.cpus_per_node,
            "gres/gpu": self.nodes * self.gpus_per_node,
        }
        if self.mem_per_node_mb is not None:
            total["mem"] = self.nodes * self.mem_per_node_mb
        return total

    def tres_per_node(self) -> dict[str, int]:
        per_node = {"node": 1, "cpu": self.cpus_per_node, "gres/gpu": self.gpus_per_node}
        if self.mem_per_node_mb is not None:
            per_node["mem"] = self.mem_per_node_mb
        return per_node


def shape_of(resources: Resources) -> JobShape:
    return JobShape(
        nodes=resources.nodes,
        cpus_per_node=resources.cpus_per_node,
        mem_per_node_mb=resources.mem_per_node_mb,
        gpus_per_node=resources.gpus_per_node,
        time_min=resources.time_min,
    )


_TRES_WORDS = {"node": "nodes", "cpu": "CPUs", "mem": "MB of memory", "gres/gpu": "GPUs"}
_TRES_REMEDY = {
    "node": "drop the larger node counts (or --pack fewer nodes)",
    "cpu": "lower threads, loader_workers or ranks_per_node, or the node counts",
    "mem": "lower mem_per_rank_mb or ranks_per_node",
    "gres/gpu": "lower ranks_per_node or the node counts",
}


def never_starts(shape: JobShape, *, partition: Partition | None, limits: UserLimits) -> str | None:
    """Why a job of `shape` could never start (one line naming the limit, its value and the remedy); None
    where no limit read forbids it."""
    problem = _not_allowed(partition, limits)
    if problem:
        return problem
    for limit in (*limits.running, *limits.submit):
        if limit.value == 0:
            return (
                f"{limit.name} is 0: no job of yours may run under it; ask your administrator, "
                "or use another account or QOS"
            )
    for limit in limits.per_job:
        problem = _over(shape, limit)
        if problem:
            return problem
    return None


def _not_allowed(partition: Partition | None, limits: UserLimits) -> str | None:
    if partition is None:
        return None
    name = repr(partition.name)
    qos, account = limits.qos, limits.account
    if qos and ((partition.allow_qos is not None and qos not in partition.allow_qos) or qos in partition.deny_qos):
        allowed = ", ".join(partition.allow_qos or ()) or "not this one"
        return (
            f"QOS {qos!r} may not submit to partition {name} (AllowQos={allowed}"
            + (f", DenyQos={','.join(partition.deny_qos)}" if partition.deny_qos else "")
            + "); give an allowed one with `ddlbench profile slurm --qos NAME`"
        )
    if account and (
        (partition.allow_accounts is not None and account not in partition.allow_accounts)
        or account in partition.deny_accounts
    ):
        allowed = ", ".join(partition.allow_accounts or ()) or "not this one"
        return (
            f"account {account!r} may not submit to partition {name} (AllowAccounts={allowed}); "
            "give an allowed one with `ddlbench profile slurm --account NAME`"
        )
    return None


def _over(shape: JobShape, limit: JobLimit) -> str | None:
    if limit.minutes is not None:
        if shape.time_min > limit.minutes:
            return (
                f"time limit {shape.time_min} min is over {limit.name}={limit.minutes} min: the job would wait "
                "forever; lower timeout_s (the job's limit is timeout_s plus the site's time_margin_s), or use a "
                "QOS that allows longer jobs (`ddlbench profile slurm --qos NAME`)"
            )
        return None
    wanted = shape.tres() if limit.per == "job" else shape.tres_per_node()
    for key, most in limit.tres:
        if key in wanted and wanted[key] > most:
            per = "per node" if limit.per == "node" else "in all"
            return (
                f"needs {wanted[key]} {_TRES_WORDS.get(key, key)} {per}, over {limit.name} {key}={most}: the job "
                f"would wait forever; {_TRES_REMEDY.get(key, 'ask for less')}, or use a QOS or account with a "
                "larger limit"
            )
    return None


@dataclass(frozen=True, kw_only=True)
class Caps:
    """The largest job these limits let start: nodes and minutes (None: no limit), and who sets each."""

    nodes: int | None
    nodes_by: str
    time_min: int | None
    time_by: str


def caps(
    limits: UserLimits,
    partition: Partition | None,
    *,
    cpus_per_node: int,
    gpus_per_node: int,
    mem_per_node_mb: int | None,
) -> Caps:
    """The most nodes and minutes a job of nodes this wide (CPUs, GPUs, memory per node) may have."""
    nodes: list[tuple[int, str]] = []
    times: list[tuple[int, str]] = []
    if partition is not None:
        if partition.max_nodes is not None:
            nodes.append((partition.max_nodes, f"partition {partition.name!r} MaxNodes"))
        if partition.max_time_min is not None:
            times.append((partition.max_time_min, f"partition {partition.name!r} MaxTime"))
    per_node = {"node": 1, "cpu": cpus_per_node, "gres/gpu": gpus_per_node}
    if mem_per_node_mb is not None:
        per_node["mem"] = mem_per_node_mb
    for limit in limits.per_job:
        if limit.minutes is not None:
            times.append((limit.minutes, limit.name))
        elif limit.per == "job":
            for key, most in limit.tres:
                if per_node.get(key):
                    nodes.append((most // per_node[key], f"{limit.name} {key}={most}"))
    most_nodes = min(nodes, default=(None, ""))
    most_time = min(times, default=(None, ""))
    return Caps(nodes=most_nodes[0], nodes_by=most_nodes[1], time_min=most_time[0], time_by=most_time[1])


def check_submission(
    planned: Iterable[tuple[str, Resources]],
    *,
    account_required: bool | None = None,
    facts: ClusterFacts | None = None,
    limits_of=None,
) -> None:
    """Refuse, before anything is submitted, a point that the cluster would reject or that could never
    start: the partition and its nodes (check_resources), then every limit that holds for its account
    and QOS (never_starts). Limits are read once per account, QOS and partition."""
    planned = list(planned)
    facts = facts or query_cluster()
    if account_required is not None:
        facts = dataclasses.replace(facts, account_required=account_required)
    check_resources(planned, facts)
    read: dict[tuple[str | None, str | None, str], UserLimits] = {}
    for point_id, resources in planned:
        key = (resources.account, resources.qos, resources.partition)
        if key not in read:
            read[key] = (limits_of or _read)(facts, *key)
        problem = never_starts(
            shape_of(resources), partition=facts.partitions.get(resources.partition), limits=read[key]
        )
        if problem:
            raise DdlbenchError(f"point {point_id}: {problem}")


def check_allocations(
    allocations: Sequence[Any],
    requests: Sequence[Any],
    planned: Mapping[str, Resources],
    *,
    facts: ClusterFacts,
    limits: UserLimits,
) -> None:
    """Refuse a packed allocation (ddlbench.launch.packing.Allocation, with its packed.Request) that could
    never start, held as the one job of N nodes it is: the partition's nodes and limits, then the user's."""
    for allocation, request in zip(allocations, requests, strict=True):
        members = [planned[task.key] for task in allocation.order]
        first = members[0]
        job = dataclasses.replace(
            first,
            nodes=allocation.nodes,
            tasks_per_node=1,
            cpus_per_task=max(r.cpus_per_node for r in members),
            gpus_per_node=max(r.gpus_per_node for r in members),
            mem_per_node_mb=max(r.mem_per_node_mb for r in members),
            time_min=math.ceil(request.time_limit_s / 60),
            node="",
        )
        what = f"allocation {allocation.index} ({allocation.nodes} nodes, {len(allocation.order)} points)"
        check_resources([(what, job)], facts, label="")
        shape = dataclasses.replace(shape_of(job), mem_per_node_mb=None if job.exclusive else job.mem_per_node_mb)
        problem = never_starts(shape, partition=facts.partitions.get(job.partition), limits=limits)
        if problem:
            raise DdlbenchError(f"{what}: {problem}")


def _read(facts: ClusterFacts, account: str | None, qos: str | None, partition: str) -> UserLimits:
    return read_limits(facts, account=account, qos=qos, partition=partition)
