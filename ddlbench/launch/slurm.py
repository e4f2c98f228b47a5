"""Talking to SLURM: what the cluster offers, what the current job is, what is in the queue.

Every call is one subprocess with a time limit. A controller that does not answer is waited out for
the site's patience (ddlbench.launch.patience), with the progress line saying so; past it, or on any
other failure, the call fails with a message naming the command. Torch-free.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddlbench.errors import DdlbenchError
from ddlbench.launch.patience import Patience
from ddlbench.launch.resources import MemoryDefaults, Resources
from ddlbench.launch.slurm_call import SlurmError, run_slurm
from ddlbench.records import SlurmJob

log = logging.getLogger(__name__)


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
    def_mem_per_cpu_mb: int | None = None
    def_mem_per_gpu_mb: int | None = None
    def_mem_per_node_mb: int | None = None
    max_mem_per_node_mb: int | None = None
    max_nodes: int | None = None  # MaxNodes: the most nodes one job may have here; None: no limit
    max_cpus_per_node: int | None = None  # MaxCPUsPerNode: the most CPUs of a node the partition's jobs use
    # AllowQos/AllowAccounts (None: ALL) and DenyQos/DenyAccounts: who may submit here at all
    allow_qos: tuple[str, ...] | None = None
    allow_accounts: tuple[str, ...] | None = None
    deny_qos: tuple[str, ...] = ()
    deny_accounts: tuple[str, ...] = ()


def _names(text: str | None) -> tuple[str, ...] | None:
    """A partition's list of names (AllowQos=a,b); None for ALL (or unset)."""
    if not text or text.upper() == "ALL":
        return None
    return tuple(name for name in text.split(",") if name and name != "(null)")


def _mb(text: str | None) -> int | None:
    """MB of a SLURM memory field (plain MB, or with an M/G/T suffix); None for UNLIMITED, 0 or absent."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+)([MGT]?)", text.strip())
    if not match or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) * {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2)]


def parse_partitions(text: str) -> dict[str, Partition]:
    partitions = {}
    for line in text.splitlines():
        fields = parse_oneliner(line)
        if "PartitionName" not in fields:
            continue
        # DefMemPerGPU lives in JobDefaults (e.g. "DefCpuPerGPU=4,DefMemPerGPU=8192"); parse_oneliner
        # splits at the first "=", so the rest of the pair is the value of JobDefaults
        job_defaults = dict(
            item.split("=", 1) for item in fields.get("JobDefaults", "").split(",") if item.count("=") == 1
        )
        partitions[fields["PartitionName"]] = Partition(
            name=fields["PartitionName"],
            total_nodes=int(fields.get("TotalNodes", "0")),
            max_time_min=parse_time_min(fields.get("MaxTime", "UNLIMITED")),
            state=fields.get("State", "UP"),
            def_mem_per_cpu_mb=_mb(fields.get("DefMemPerCPU")),
            def_mem_per_gpu_mb=_mb(job_defaults.get("DefMemPerGPU")),
            def_mem_per_node_mb=_mb(fields.get("DefMemPerNode")),
            max_mem_per_node_mb=_mb(fields.get("MaxMemPerNode")),
            max_nodes=_count(fields.get("MaxNodes")),
            max_cpus_per_node=_count(fields.get("MaxCPUsPerNode")),
            allow_qos=_names(fields.get("AllowQos")),
            allow_accounts=_names(fields.get("AllowAccounts")),
            deny_qos=_names(fields.get("DenyQos")) or (),
            deny_accounts=_names(fields.get("DenyAccounts")) or (),
        )
    return partitions


# Node states in which a node takes no new job: a job that needs it would wait until someone acts
_UNUSABLE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "INVAL", "FUTURE")
_GRES_GPU = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


@dataclass(frozen=True, kw_only=True)
class Node:
    name: str
    cpus: int
    memory_mb: int  # RealMemory less MemSpecLimit: what jobs may ask for
    gpus: int
    state: str  # scontrol's, e.g. IDLE, MIXED, IDLE+DRAIN, DOWN+NOT_RESPONDING
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not any(flag in self.state.upper() for flag in _UNUSABLE_STATES)


def parse_nodes(text: str) -> dict[str, Node]:
    """`scontrol show node -o`: each node's CPUs, memory for jobs, GPUs (its gpu GRES), state, partitions."""
    nodes = {}
    for line in text.splitlines():
        fields = parse_oneliner(line)
        if "NodeName" not in fields:
            continue
        memory = (_mb(fields.get("RealMemory")) or 0) - (_mb(fields.get("MemSpecLimit")) or 0)
        nodes[fields["NodeName"]] = Node(
            name=fields["NodeName"],
            cpus=int(fields.get("CPUTot", "0") or 0),
            memory_mb=max(memory, 0),
            gpus=sum(int(count) for count in _GRES_GPU.findall(fields.get("Gres", ""))),
            state=fields.get("State", "UNKNOWN"),
            partitions=tuple(part for part in fields.get("Partitions", "").split(",") if part),
        )
    return nodes


@dataclass(frozen=True, kw_only=True)
class ClusterFacts:
    """What the controller says about partitions, nodes and defaults; asked once, before submission."""

    partitions: dict[str, Partition]
    nodes: dict[str, Node]
    account_required: bool = False  # the site insists on an account named (site's require_account)
    # AccountingStorageEnforce: with associations, a job needs an account; sbatch charges the user's
    # default account where none is named
    associations_enforced: bool = False
    limits_enforced: bool = False  # the associations' and QOS' limits hold (limits, or safe)
    user: str = ""
    default_account: str | None = None  # the user's DefaultAccount (sacctmgr), asked where associations hold
    default_account_known: bool = True  # False: sacctmgr did not answer, so sbatch is left to decide
    cluster_name: str | None = None
    max_array_size: int | None = None  # MaxArraySize: an array's task ids run 0 .. MaxArraySize - 1
    max_job_count: int | None = None  # MaxJobCount: jobs the controller holds at once, every user's
    def_mem_per_cpu_mb: int | None = None  # the cluster's DefMemPerCPU (a partition's own comes first)
    def_mem_per_node_mb: int | None = None
    # KillWait: from SLURM's SIGTERM at a job's end to its SIGKILL (a packed dispatcher stops its points within it)
    kill_wait_s: int | None = None

    def nodes_of(self, partition: str) -> list[Node]:
        return [node for node in self.nodes.values() if partition in node.partitions]

    def memory_defaults(self, partition: str) -> MemoryDefaults | None:
        """What a job in `partition` gets when it names no memory; None for an unknown partition."""
        found = self.partitions.get(partition)
        if found is None:
            return None
        own = found.def_mem_per_cpu_mb or found.def_mem_per_node_mb
        members = self.nodes_of(partition)
        return MemoryDefaults(
            partition=partition,
            per_gpu_mb=found.def_mem_per_gpu_mb,
            per_cpu_mb=found.def_mem_per_cpu_mb if own else self.def_mem_per_cpu_mb,
            per_node_mb=found.def_mem_per_node_mb if own else self.def_mem_per_node_mb,
            smallest_node_mb=min((node.memory_mb for node in members), default=None) or None,
        )


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`: "Key = value" lines."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def query_partitions() -> dict[str, Partition]:
    return parse_partitions(run_slurm(["scontrol", "show", "partition", "-o"]))


def _count(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def parse_default_account(text: str) -> str | None:
    """`sacctmgr -nP show user NAME format=DefaultAccount`: the account, or None where the user has none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else None


@functools.cache
def query_cluster() -> ClusterFacts:
    """Partitions, nodes and the cluster's defaults, in three scontrol calls, once per process; where
    associations are enforced, also the user's default account (one sacctmgr call)."""
    config = parse_config(run_slurm(["scontrol", "show", "config"]))
    enforce = {word.strip() for word in config.get("AccountingStorageEnforce", "").lower().split(",")}
    # `limits` and `safe` imply associations (slurm.conf(5))
    associations = bool(enforce & {"associations", "limits", "safe", "qos", "wckeys"})
    user = getpass.getuser()
    default_account, known = None, True
    if associations:
        try:
            default_account = parse_default_account(
                run_slurm(["sacctmgr", "-nP", "show", "user", user, "format=DefaultAccount"])
            )
        except SlurmError as exc:
            log.warning("cannot read the default account of %s (%s); sbatch will say if one is missing", user, exc)
            known = False
    return ClusterFacts(
        partitions=query_partitions(),
        nodes=parse_nodes(run_slurm(["scontrol", "show", "node", "-o"])),
        associations_enforced=associations,
        limits_enforced=bool(enforce & {"limits", "safe"}),
        user=user,
        default_account=default_account,
        default_account_known=known,
        cluster_name=config.get("ClusterName"),
        max_array_size=_count(config.get("MaxArraySize")),
        max_job_count=_count(config.get("MaxJobCount")),
        def_mem_per_cpu_mb=_mb(config.get("DefMemPerCPU")),
        def_mem_per_node_mb=_mb(config.get("DefMemPerNode")),
        kill_wait_s=_count((config.get("KillWait") or "").split(" ")[0]),
    )


def check_resources(planned: Iterable[tuple[str, Resources]], facts: ClusterFacts, *, label: str = "point") -> None:
    """Refuse, before anything is submitted, a point the cluster would reject or hold forever: an unknown
    partition or one not UP, more nodes than the partition has, a time limit over the partition's, more
    CPUs, memory or GPUs per node than its nodes have, too few nodes able to hold it that are not down or
    drained, a missing account where one is required. Each refusal is one line naming the point and the
    value."""
    for point_id, resources in planned:
        problem = _problem(resources, facts)
        if problem:
            raise DdlbenchError(f"{label} {point_id}: {problem}" if label else f"{point_id}: {problem}")


def _problem(resources: Resources, facts: ClusterFacts) -> str | None:
    partition = facts.partitions.get(resources.partition)
    if partition is None:
        return (
            f"partition {resources.partition!r} does not exist; "
            f"partitions of this cluster: {', '.join(sorted(facts.partitions)) or 'none'}"
        )
    name = repr(partition.name)
    if partition.state.upper() != "UP":
        return f"partition {name} is {partition.state}, not UP: its jobs would wait until an administrator acts"
    if partition.max_nodes is not None and resources.nodes > partition.max_nodes:
        return (
            f"needs {resources.nodes} nodes, over partition {name}'s MaxNodes={partition.max_nodes} (the most one "
            "job may have there): it would wait forever; drop the larger node counts or choose another partition"
        )
    if partition.max_cpus_per_node is not None and resources.cpus_per_node > partition.max_cpus_per_node:
        return (
            f"needs {resources.cpus_per_node} CPUs per node, over partition {name}'s MaxCPUsPerNode="
            f"{partition.max_cpus_per_node}; lower threads, loader_workers or ranks_per_node"
        )
    if resources.nodes > partition.total_nodes:
        return (
            f"needs {resources.nodes} nodes, but partition {name} has {partition.total_nodes}; "
            "drop the larger node counts or choose another partition"
        )
    if resources.time_min < 1:
        return f"time limit {resources.time_min} min is not a valid limit"
    if partition.max_time_min is not None and resources.time_min > partition.max_time_min:
        return (
            f"time limit {resources.time_limit} (timeout_s plus the site's margin) is over "
            f"the {partition.max_time_min} min that partition {name} allows; lower timeout_s"
        )
    if facts.account_required and not resources.account:
        return "this cluster requires an account and none is set; give one with `ddlbench profile slurm --account NAME`"
    if (
        facts.associations_enforced
        and not resources.account
        and facts.default_account_known
        and not facts.default_account
    ):
        who = f"user {facts.user!r}" if facts.user else "this user"
        return (
            f"this cluster requires an account (AccountingStorageEnforce) and none is set, and {who} has no "
            "default account for sbatch to use; give one with `ddlbench profile slurm --account NAME` "
            f"(`sacctmgr show assoc user={facts.user or '$USER'} format=account` lists yours)"
        )
    mem, cpus, gpus = resources.mem_per_node_mb, resources.cpus_per_node, resources.gpus_per_node
    if partition.max_mem_per_node_mb is not None and mem > partition.max_mem_per_node_mb:
        return (
            f"needs {mem} MB of memory per node ({resources.mem_source}, plus the launcher's share), over the "
            f"{partition.max_mem_per_node_mb} MB that partition {name} allows (MaxMemPerNode)"
        )
    members = facts.nodes_of(partition.name)
    if not members:
        return None  # nodes not visible to this user: the checks above are all that can be made
    shapes = (
        ("GPUs per node", gpus, max(node.gpus for node in members), "lower ranks_per_node, or choose a GPU partition"),
        ("CPUs per node", cpus, max(node.cpus for node in members), "lower threads, loader_workers or ranks_per_node"),
        (
            "MB of memory per node",
            mem,
            max(node.memory_mb for node in members),
            "lower mem_per_rank_mb or ranks_per_node",
        ),
    )
    for what, needed, most, way_out in shapes:
        if needed > most:
            detail = f" ({resources.mem_source}, plus the launcher's share)" if what.startswith("MB") else ""
            return f"needs {needed} {what}{detail}, but the nodes of partition {name} have at most {most}; {way_out}"
    fitting = [node for node in members if node.cpus >= cpus and node.memory_mb >= mem and node.gpus >= gpus]
    shape = f"{cpus} CPUs, {mem} MB" + (f" and {gpus} GPUs" if gpus else "")
    if len(fitting) < resources.nodes:
        return (
            f"needs {resources.nodes} nodes with {shape} each, but only {len(fitting)} of the "
            f"{len(members)} nodes of partition {name} have them"
        )
    usable = [node for node in fitting if node.usable]
    if len(usable) < resources.nodes:
        out = ", ".join(f"{node.name} {node.state}" for node in fitting if not node.usable)
        return (
            f"needs {resources.nodes} nodes with {shape} each, but only {len(usable)} of the {len(fitting)} nodes "
            f"of partition {name} that have them take jobs ({out}); wait for them or choose another partition"
        )
    return None


_GPU_TRES = re.compile(r"gres/gpu(?::[^=,]*)?=(\d+)")


def parse_allocation(job_id: str, scontrol_line: str) -> SlurmJob:
    fields = parse_oneliner(scontrol_line.strip().splitlines()[0] if scontrol_line.strip() else "")
    # scontrol prints the allocation as TRES= (22.05) or AllocTRES= (other releases)
    tres = fields.get("AllocTRES") or fields.get("TRES", "")
    gpus = sum(int(count) for count in _GPU_TRES.findall(tres))

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
        # --exclusive shows as OverSubscribe=NO (=USER or =MCS for those forms of it); OK: shared
        exclusive=fields["OverSubscribe"] in ("NO", "USER", "MCS") if "OverSubscribe" in fields else None,
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
        return job_from_environment(environ, job_id)


def job_from_environment(environ: Mapping[str, str], job_id: str) -> SlurmJob:
    """The job as its SLURM_* variables describe it, where the controller does not (CPUs and GPUs unknown)."""
    nodes = environ.get("SLURM_JOB_NUM_NODES", "")
    return SlurmJob(
        job_id=job_id,
        array_job_id=environ.get("SLURM_ARRAY_JOB_ID"),
        array_task_id=environ.get("SLURM_ARRAY_TASK_ID"),
        partition=environ.get("SLURM_JOB_PARTITION"),
        node_list=environ.get("SLURM_JOB_NODELIST"),
        num_nodes=int(nodes) if nodes.isdigit() else None,
        num_cpus=None,
        num_gpus=0,
        restarts=int(environ.get("SLURM_RESTART_COUNT", "0") or 0),
    )


@functools.cache
def _describe_job(query: str) -> str:
    # the launcher and the record both need the allocation: ask the controller once per process
    return run_slurm(["scontrol", "show", "job", "-o", query])


def first_host(node_list: str) -> str:
    """First hostname of a SLURM node list such as "n[1-4],m2", as scontrol expands it."""
    return run_slurm(["scontrol", "show", "hostnames", node_list]).split()[0]


def allocation_hosts(environ: Mapping[str, str]) -> list[str]:
    """The nodes of the allocation this process runs in, in SLURM's order (one scontrol call)."""
    node_list = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not node_list:
        raise DdlbenchError("SLURM_JOB_NODELIST is not set: packed points run inside a SLURM allocation")
    return run_slurm(["scontrol", "show", "hostnames", node_list]).split()


RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING"})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"})
# a job in one of these counts against the submit limits; squeue also lists ended jobs for MinJobAge
ACTIVE_STATES = RUNNING_STATES | PENDING_STATES


@dataclass(frozen=True, kw_only=True)
class QueuedJob:
    job_id: str  # 123, or 123_4 for an array task
    state: str  # PENDING, RUNNING, COMPLETING, ...
    name: str
    comment: str
    account: str = ""
    qos: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


# the comment is free text, so it comes last and the line is split only that far
QUEUE_FORMAT = "%i|%T|%j|%a|%q|%k"


def parse_queue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) == 6:
            job_id, state, name, account, qos, comment = parts
            jobs.append(QueuedJob(job_id=job_id, state=state, name=name, account=account, qos=qos, comment=comment))
    return jobs


def query_queue(*, patience: Patience | None = None) -> list[QueuedJob]:
    """This user's jobs in the queue (array tasks one by one), all in one squeue call; tried while the
    controller does not answer for `patience` (default: the site's, ddlbench.launch.patience)."""
    user = getpass.getuser()
    return parse_queue(run_slurm(["squeue", "-h", "-r", "-u", user, "-o", QUEUE_FORMAT], patience=patience))
