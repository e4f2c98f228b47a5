"""What a point asks of SLURM: one pure mapping from a point and the site's settings to an allocation.

Snakemake's SLURM plugin and submitit both submit from this mapping, so a point gets the same
allocation whichever way it is submitted. Torch-free: the Snakefile imports it on the login node.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch.placement import DEFAULT_GPU_BIND, check_gpu_bind, check_network_env
from ddlbench.point import Point

# The batch step on the first node holds the point's launcher (run-point: supervision, the record) and,
# under Snakemake, the job-side Snakemake process: 440 MB together, measured on the test cluster, where
# SLURM holds every step of the job to the job's per-node memory. Added to every node's request.
LAUNCHER_MEM_MB = 768
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # the sweep schema's each_node pattern


@dataclass(frozen=True, kw_only=True)
class Site:
    """A cluster's settings, written once by `ddlbench profile slurm`; every point is submitted with them."""

    partition: str
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_rank: int = 0  # 1 on GPU partitions: each rank takes one of its node's GPUs
    # None: the partition's default (DefMemPerGPU, DefMemPerCPU, else a node's memory shared by its ranks)
    mem_per_rank_mb: int | None = None
    time_margin_s: int = 300  # added to a point's timeout: start-up, data generation, writing the record
    require_account: bool = False  # the site rejects jobs without an account
    # Whole nodes for every measured point (sbatch --exclusive): a benchmark that shares its nodes with
    # other jobs shares their memory bandwidth, caches, network links and GPUs' hosts, and its figures say
    # nothing about the hardware. On by default, as benchmarking practice; off only to fit a busy queue.
    exclusive: bool = True
    # what a node-hour costs here (any currency), for the cost models of `ddlbench fit`; None: not priced
    price_per_node_hour: float | None = None
    # how long every scheduler call keeps trying while the controller does not answer (a restart with its
    # state reloaded takes minutes); past it the call fails (ddlbench.launch.patience)
    controller_patience_s: int = 1800
    # how the ranks' srun step binds a GPU to each task where gpus_per_rank is 1 (srun --gpus-per-task=1
    # --gpu-bind=…; ddlbench.launch.placement says why single:1, not closest)
    gpu_bind: str = DEFAULT_GPU_BIND
    # NCCL/gloo network variables every launcher puts into its ranks' environment (placement.NETWORK_ENV_NAMES)
    network_env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SITE_KEYS = tuple(field.name for field in fields(Site))


def site_from_mapping(raw: object, *, source: str = "site settings") -> Site:
    """Validate site settings (a site file's content, or options) into a Site."""
    if not isinstance(raw, dict):
        raise ConfigError("", f"{source} must be a mapping of {', '.join(SITE_KEYS)}")
    unknown = sorted(set(raw) - set(SITE_KEYS))
    if unknown:
        raise ConfigError(unknown[0], f"unknown site setting in {source}; accepted: {', '.join(SITE_KEYS)}")
    if not raw.get("partition"):
        raise ConfigError("partition", f"{source} must name the SLURM partition to submit to")
    for key in ("partition", "account", "qos", "constraint"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(key, f"{value!r} is not a name; give a non-empty string")
    for key, lowest in (
        ("gpus_per_rank", 0),
        ("mem_per_rank_mb", 16),
        ("time_margin_s", 0),
        ("controller_patience_s", 0),
    ):
        value = raw.get(key, getattr(Site, key))
        if value is None and key == "mem_per_rank_mb":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise ConfigError(key, f"{value!r} is not accepted; give an integer >= {lowest}")
    if raw.get("gpus_per_rank", 0) > 1:
        raise ConfigError(
            "gpus_per_rank",
            f"{raw['gpus_per_rank']} is not accepted: a rank trains on one device; "
            "give 0 (CPU) or 1 (one GPU per rank)",
        )
    price = raw.get("price_per_node_hour")
    if price is not None and (isinstance(price, bool) or not isinstance(price, int | float) or price <= 0):
        raise ConfigError("price_per_node_hour", f"{price!r} is not accepted; give a positive number")
    for key in ("require_account", "exclusive"):
        if not isinstance(raw.get(key, False), bool):
            raise ConfigError(key, f"{raw[key]!r} is not accepted; give true or false")
    checked = dict(raw)
    checked["gpu_bind"] = check_gpu_bind(raw.get("gpu_bind", DEFAULT_GPU_BIND))
    checked["network_env"] = check_network_env(raw.get("network_env"))
    return Site(**checked)


def load_site(path: str | Path) -> Site:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError("", f"cannot read the site file {str(path)!r}: {exc.strerror}") from None
    return site_from_mapping(raw, source=str(path))


@dataclass(frozen=True, kw_only=True)
class MemoryDefaults:
    """What a partition gives a job that names no memory (scontrol), in MB; None where it sets nothing."""

    partition: str
    per_gpu_mb: int | None = None  # DefMemPerGPU
    per_cpu_mb: int | None = None  # DefMemPerCPU (the partition's, else the cluster's)
    per_node_mb: int | None = None  # DefMemPerNode (the partition's, else the cluster's)
    smallest_node_mb: int | None = None  # the least memory a node of the partition offers to jobs


@dataclass(frozen=True, kw_only=True)
class Resources:
    """One point's SLURM allocation: nodes × tasks_per_node ranks, each with cpus_per_task cores."""

    partition: str
    account: str | None
    qos: str | None
    constraint: str | None
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    mem_per_node_mb: int
    time_min: int
    # SLURM's warning before the time limit (submitit requeues on it): inside the margin, so that
    # ddlbench's own timeout, which writes a `timeout` record, comes first
    signal_delay_s: int
    exclusive: bool = False
    mem_source: str = ""  # where the memory per rank came from, for messages
    node: str = ""  # the node the point is pinned to (Point.node; sbatch --nodelist), "" any
    after_earlier_jobs: bool = False  # sbatch --dependency=singleton (the sweep's slurm.pinned_one_at_a_time)

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task

    @property
    def time_limit(self) -> str:
        """The time limit as sbatch's D-HH:MM:SS."""
        days, minutes = divmod(self.time_min, 24 * 60)
        return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def resources_for(
    point: Point,
    site: Site,
    *,
    mem_per_rank_mb: int | None = None,
    partition: str | None = None,
    mem_factor: float = 1.0,
    time_factor: float = 1.0,
    memory_defaults: MemoryDefaults | None = None,
    pinned_one_at_a_time: bool = False,
) -> Resources:
    """The allocation of `point`: its nodes and ranks, `cores_per_rank` cores per rank (threads and loader
    workers), `gpus_per_rank` GPUs per rank on each node, memory per rank (the sweep's value, else the
    site's, else the partition's default: `memory_defaults`) times `mem_factor`, plus the launcher's share
    on every node, and a time limit of the point's timeout × `time_factor` plus the site's margin, so that
    ddlbench's own timeout fires first and still writes a `timeout` record."""
    per_rank, source = _mem_per_rank(point, site, mem_per_rank_mb, memory_defaults)
    return Resources(
        partition=partition or site.partition,
        account=site.account,
        qos=site.qos,
        constraint=site.constraint,
        nodes=point.nodes,
        tasks_per_node=point.ranks_per_node,
        cpus_per_task=point.cores_per_rank,
        gpus_per_node=gpus_per_node(point, site),
        mem_per_node_mb=math.ceil(per_rank * point.ranks_per_node * mem_factor) + LAUNCHER_MEM_MB,
        time_min=math.ceil((point.timeout_s * time_factor + site.time_margin_s) / 60),
        signal_delay_s=max(10, min(90, site.time_margin_s // 2)),
        exclusive=site.exclusive,
        mem_source=source + (f" × mem factor {mem_factor:g}" if mem_factor != 1 else ""),
        node=getattr(point, "node", ""),  # calibration points are never pinned
        after_earlier_jobs=bool(getattr(point, "node", "")) and pinned_one_at_a_time,
    )


def gpus_per_node(point: Point, site: Site) -> int:
    """GPUs a point asks of each node: gpus_per_rank for each of its ranks, or, where its ranks may share
    GPUs (`share_gpus`), gpus_per_rank for all of them together (an --exclusive job gets every GPU of its
    nodes all the same, and the ranks take them in turn: ddlbench.launch.devices)."""
    return site.gpus_per_rank * (1 if getattr(point, "share_gpus", False) else point.ranks_per_node)


def _mem_per_rank(point: Point, site: Site, sweep_mb: int | None, defaults: MemoryDefaults | None) -> tuple[float, str]:
    """MB per rank and where the figure comes from."""
    if sweep_mb is not None:
        return sweep_mb, f"{sweep_mb} MB per rank from the sweep's slurm.mem_per_rank_mb"
    if site.mem_per_rank_mb is not None:
        return site.mem_per_rank_mb, f"{site.mem_per_rank_mb} MB per rank from the site's mem_per_rank_mb"
    if defaults is None:
        raise ConfigError(
            "mem_per_rank_mb",
            "no memory per rank: the site leaves it to the partition, whose defaults are not known here; "
            "give mem_per_rank_mb in the site (`ddlbench profile slurm --mem-per-rank-mb MB`) "
            "or in the sweep's slurm section",
        )
    where = f"partition {defaults.partition!r}"
    if site.gpus_per_rank and defaults.per_gpu_mb:
        per_rank = defaults.per_gpu_mb * site.gpus_per_rank
        return per_rank, f"{per_rank} MB per rank from {where}'s DefMemPerGPU"
    if defaults.per_cpu_mb:
        per_rank = defaults.per_cpu_mb * point.cores_per_rank
        return per_rank, f"{per_rank} MB per rank from {where}'s DefMemPerCPU × {point.cores_per_rank} cores"
    node = defaults.per_node_mb or defaults.smallest_node_mb
    if node:
        what = "DefMemPerNode" if defaults.per_node_mb else "smallest node's memory"
        per_rank = max(16, (node - LAUNCHER_MEM_MB) // point.ranks_per_node)
        return per_rank, f"{per_rank} MB per rank: {where}'s {what} less the launcher, shared by the node's ranks"
    raise ConfigError(
        "mem_per_rank_mb",
        f"{where} sets no default memory and its nodes' memory is unknown; give mem_per_rank_mb in the site or sweep",
    )


def calibration_job(points: Sequence[Any], sweep: Mapping[str, Resources], site: Site) -> Resources:
    """One job running a calibration suite's points one after another (`ddlbench calibrate` under
    Snakemake), where the sweep's points run: their partition, account, QOS, constraint and whole-node
    setting, as many GPUs and as much memory per node as the sweep's largest point (a GPU sweep is
    calibrated on a GPU node); the nodes, ranks per node and cores per rank of the suite's widest point;
    a time limit of every point at its timeout, one after another, plus the site's margin."""
    shapes = list(sweep.values())
    if not shapes or not points:
        raise DdlbenchError("a calibration job needs the sweep's points and the suite's points")
    first = shapes[0]
    seconds = sum(point.timeout_s for point in points) + site.time_margin_s
    return dataclasses.replace(
        first,
        nodes=max(point.nodes for point in points),
        tasks_per_node=max(point.ranks_per_node for point in points),
        cpus_per_task=max(point.cores_per_rank for point in points),
        gpus_per_node=max(r.gpus_per_node for r in shapes),
        mem_per_node_mb=max(r.mem_per_node_mb for r in shapes),
        time_min=math.ceil(seconds / 60),
        mem_source="the sweep's largest point's",
        node="",
        after_earlier_jobs=False,
    )


def snakemake_resources(resources: Resources) -> dict[str, Any]:
    """Resources of the run_point rule, as the Snakemake SLURM executor plugin reads them.

    Every point carries the `mpi` key, so the plugin's job step runs the rule's shell command in the
    batch script itself (without it, it would wrap the command in `srun -n1`) and ddlbench's own srun
    starts the ranks. The plugin wants `mpi` true only with more than one task, and one of `tasks` and
    `tasks_per_node`, each above 1; the keys are the same for every point, with falsy values where a
    setting does not apply, because Snakemake needs one set of resource keys per rule."""
    several = resources.ntasks > 1
    per_node = several and resources.tasks_per_node > 1
    out: dict[str, Any] = {
        "slurm_partition": resources.partition,
        "nodes": resources.nodes,
        "cpus_per_task": resources.cpus_per_task,
        "mem_mb": resources.mem_per_node_mb,
        "runtime": resources.time_min,
        "mpi": "srun" if several else "",
        "tasks": 0 if per_node else resources.ntasks,
        "tasks_per_node": resources.tasks_per_node if per_node else 0,
    }
    # site-wide settings: present for every point or for none
    if resources.account:
        out["slurm_account"] = resources.account
    if resources.qos:
        out["qos"] = resources.qos
    if resources.constraint:
        out["constraint"] = resources.constraint
    if resources.gpus_per_node:
        # GPUs per node for the job; the ranks' srun step binds one to each task (--gpus-per-task,
        # ddlbench.launch.placement). tasks_per_gpu 0 keeps the plugin from adding --ntasks-per-gpu to the
        # job (it falls back to `tasks` when the key is absent), which clashes with --ntasks-per-node.
        out["gres"] = f"gpu:{resources.gpus_per_node}"
        out["tasks_per_gpu"] = 0
    # present for every point: "" where nodes may be shared
    out["slurm_extra"] = " ".join(_extra_options(resources))
    return out


def _extra_options(resources: Resources) -> list[str]:
    """sbatch options the plugin has no resource for. A node name is checked against the schema's
    pattern before it gets here (the plugin puts slurm_extra into a shell line as it is)."""
    options = ["--exclusive"] if resources.exclusive else []
    if resources.node:
        if not NODE_NAME.fullmatch(resources.node):
            raise ConfigError("each_node", f"{resources.node!r} is not a node name ([A-Za-z0-9_.-]+)")
        options.append(f"--nodelist={resources.node}")
    if resources.after_earlier_jobs:
        options.append("--dependency=singleton")
    return options


def submitit_parameters(resources: Resources) -> dict[str, Any]:
    """`update_parameters` keywords of a submitit AutoExecutor for this allocation.

    submitit runs its function once, in an `srun` step of one task on the first node (the point's
    launcher), and the ranks start in a second step that overlaps it, as under Snakemake. submitit
    counts the results it waits for from its own `nodes` and `tasks_per_node`, so those stay 1 and
    the allocation's real shape goes to sbatch directly."""
    sbatch: dict[str, Any] = {"nodes": resources.nodes, "ntasks_per_node": resources.tasks_per_node}
    for key, value in (("account", resources.account), ("qos", resources.qos)):
        if value:
            sbatch[key] = value
    params: dict[str, Any] = {
        "slurm_partition": resources.partition,
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": resources.cpus_per_task,
        "slurm_mem": f"{resources.mem_per_node_mb}M",
        "timeout_min": resources.time_min,
        "slurm_signal_delay_s": resources.signal_delay_s,
        "slurm_srun_args": ["--ntasks=1", "--nodes=1"],
        "slurm_additional_parameters": sbatch,
    }
    if resources.gpus_per_node:
        params["gpus_per_node"] = resources.gpus_per_node
    if resources.exclusive:
        params["slurm_exclusive"] = True
    if resources.node:
        sbatch["nodelist"] = resources.node
    if resources.after_earlier_jobs:
        sbatch["dependency"] = "singleton"
    if resources.constraint:
        params["slurm_constraint"] = resources.constraint
    return params
