"""Launchers: start a point's ranks as local processes, or with srun inside a SLURM allocation (mpirun:
ddlbench/launch/mpi.py).

Both run the same worker command; they differ in who starts the ranks and how the ranks find each
other (a rendezvous file on one host; the first node of the allocation over TCP under SLURM).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ddlbench.errors import DdlbenchError
from ddlbench.launch.command import process_env, worker_command
from ddlbench.launch.cores import PIN_VAR, CoreGrant, check_cores, claimed_cores, grant_for, rank_cpus
from ddlbench.launch.mpi import MpirunLauncher, find_mpirun
from ddlbench.launch.patience import OutageOver, current_patience, is_transient, keep_trying
from ddlbench.launch.placement import GPU_BIND_VAR, launch_settings
from ddlbench.launch.processes import LaunchOutcome, StderrTee, host_oom_kills, start_process, supervise
from ddlbench.launch.rendezvous import INIT_METHOD_VAR, slurm_master_port
from ddlbench.launch.slurm import current_allocation, first_host
from ddlbench.point import Point

log = logging.getLogger(__name__)

LAUNCHERS = ("auto", "local", "srun", "mpirun")


class Launcher(Protocol):
    name: str

    def launch(
        self, point: Point, *, rank_dir: Path, dump_params: Path | None, timeout_s: float, group: Path | None = None
    ) -> LaunchOutcome: ...


class LocalLauncher:
    """nodes × ranks_per_node processes on this host; rank r stands in for node r // ranks_per_node.

    Before anything starts, ranks × threads is checked against the cores granted (`cores`: Snakemake's
    share, and the CPU affinity); each rank is pinned to cores of its own when enough are free.
    """

    name = "local"

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores

    def check(self, point: Point) -> CoreGrant:
        grant = grant_for(point, self.cores)
        check_cores(point, grant)
        return grant

    def launch(
        self, point: Point, *, rank_dir: Path, dump_params: Path | None, timeout_s: float, group: Path | None = None
    ) -> LaunchOutcome:
        grant = self.check(point)
        with claimed_cores(grant) as claimed:
            return self._start(
                point, rank_dir=rank_dir, dump_params=dump_params, timeout_s=timeout_s, claimed=claimed, group=group
            )

    def _start(
        self,
        point: Point,
        *,
        rank_dir: Path,
        dump_params: Path | None,
        timeout_s: float,
        claimed: tuple[int, ...] | None,
        group: Path | None = None,
    ) -> LaunchOutcome:
        rendezvous = rank_dir / "rendezvous"
        rendezvous.unlink(missing_ok=True)
        network = launch_settings(os.environ).rank_env()  # the site's NCCL/gloo variables, where one was given
        processes = []
        before = host_oom_kills()  # every rank runs on this host: the kernel's count tells an OOM kill apart
        for rank in range(point.world_size):
            pin = {PIN_VAR: ",".join(map(str, rank_cpus(claimed, rank, point.cores_per_rank)))} if claimed else {}
            env = {
                **pin,
                **os.environ,
                **network,
                **process_env(point, os.environ),
                "RANK": str(rank),
                "WORLD_SIZE": str(point.world_size),
                # every "node" is this host, so the device index is the rank among all ranks here
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(point.world_size),
                "NODE_RANK": str(rank // point.ranks_per_node),
                # a file store: no port to pick, so points running side by side cannot collide
                INIT_METHOD_VAR: f"file://{rendezvous.resolve()}",
            }
            env.pop(GPU_BIND_VAR, None)  # no SLURM binding here: every rank sees the host's GPUs
            processes.append(start_process(worker_command(point, rank_dir, dump_params, group), env))
        ranks = [(rank,) for rank in range(point.world_size)]
        outcome = supervise(processes, ranks_of_process=ranks, timeout_s=timeout_s)
        after = host_oom_kills()
        if before is None or after is None:
            return outcome
        return dataclasses.replace(outcome, host_oom_kills=after - before)


# What slurmstepd and srun print when SLURM's memory enforcement kills a step (jobacct_gather's
# OverMemoryKill says "exceeded memory limit"; the cgroup plugin reports "oom-kill event(s)").
SLURM_MEMORY_KILL = re.compile(r"exceeded (job |step )?memory limit|oom[-_ ]kill", re.IGNORECASE)


# SLURM_* variables that describe the job as a whole and that srun may read: everything else (the
# enclosing step's shape, the batch script's task geometry: SLURM_NTASKS_PER_GPU, SLURM_TRES_PER_TASK,
# SLURM_CPUS_PER_TASK, SLURM_MEM_PER_CPU, SLURM_DISTRIBUTION, SLURM_CPU_BIND…) is input to srun too, and
# would override or contradict the options ddlbench gives the ranks' step (srun 22.05 refuses
# --ntasks-per-node beside an inherited SLURM_NTASKS_PER_GPU, for one: tests/test_slurm_gpu.py).
_JOB_WIDE = re.compile(
    r"SLURM_(JOB_[A-Z0-9_]+|JOBID|CONF|CLUSTER_NAME|NODELIST|SUBMIT_DIR|SUBMIT_HOST|ARRAY_[A-Z_]+"
    r"|RESTART_COUNT|MEM_PER_NODE|WORKING_CLUSTER)"
)


def step_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the ranks' srun step: the caller's, less every SLURM_* variable that is not
    job-wide (SLURM_MEM_PER_NODE stays: the step shares the job's memory per node)."""
    return {key: value for key, value in environ.items() if not key.startswith("SLURM_") or _JOB_WIDE.fullmatch(key)}


# A packed sweep's dispatcher (ddlbench.launch.allocation) gives each point the nodes of its step and
# a port for its ranks' rendezvous that no other step of the allocation uses at the same time
STEP_NODES_VAR = "DDLBENCH_STEP_NODES"
STEP_PORT_VAR = "DDLBENCH_STEP_PORT"
SRUN_STEP_ID = re.compile(r"launching StepId=(\d+(?:\.\d+)?)")
# srun could not make the step because resources of the allocation are still held, e.g. by a step that
# ended while the controller was away and whose end it has not taken in yet: it passes, as an outage does
STEP_NOT_YET = re.compile(
    r"Unable to create step.*(?:Memory required by task is not available|Requested nodes are busy"
    r"|temporarily unavailable)",
    re.IGNORECASE,
)


class SrunLauncher:
    """One srun step over the allocation; ranks meet over TCP on the allocation's first node.

    In a packed allocation ($DDLBENCH_STEP_NODES set), the step runs on those nodes only, holding its
    CPUs alone (`--exclusive`), so that points run side by side on disjoint nodes; srun says its step
    id (`-v`) and the record keeps it.

    Where the site asks for GPUs (its launch settings, ddlbench.launch.placement), each task gets its own:
    `--gpus-per-task=1 --gpu-bind=<the site's gpu_bind>`, so SLURM makes one GPU visible to each rank, and
    the ranks learn it from GPU_BIND_VAR (ddlbench.launch.devices.rank_device takes cuda:0 then). A point
    whose ranks may share GPUs (`share_gpus`) asks for fewer GPUs than ranks: its step binds none, and its
    ranks take the job's GPUs in turn. The site's network variables go into the step's environment."""

    name = "srun"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = dict(os.environ if environ is None else environ)

    def step_nodes(self) -> list[str]:
        """The nodes of this point's step in a packed allocation; [] otherwise."""
        return [node for node in self.environ.get(STEP_NODES_VAR, "").split(",") if node]

    def command(
        self, point: Point, *, rank_dir: Path, dump_params: Path | None, group: Path | None = None
    ) -> list[str]:
        nodes = self.step_nodes()
        if nodes and len(nodes) != point.nodes:
            raise DdlbenchError(
                f"point {point.point_id} needs {point.nodes} nodes; its step was given {','.join(nodes)}"
            )
        # packed: the step holds its nodes' CPUs alone, beside other points' steps. Otherwise the launcher
        # may itself run in a step (submitit's, Snakemake's `srun -n1`) that holds the allocation's CPUs and
        # memory, and the ranks share them with it.
        placement = ["--exclusive", f"--nodelist={','.join(nodes)}", "-v"] if nodes else ["--overlap"]
        return [
            "srun",
            f"--nodes={point.nodes}",
            f"--ntasks={point.world_size}",
            f"--ntasks-per-node={point.ranks_per_node}",
            f"--cpus-per-task={point.cores_per_rank}",
            *self.gpu_options(point),
            *placement,
            "--kill-on-bad-exit=0",  # ddlbench stops the step itself, after collecting failure texts
            "--export=ALL",
            *worker_command(point, rank_dir, dump_params, group),
        ]

    def gpu_options(self, point: Point) -> list[str]:
        """srun's GPU options for the ranks' step: one GPU per task, bound as the site says; none where
        the site asks for no GPUs or the point's ranks may share them."""
        if getattr(point, "share_gpus", False):
            return []
        return launch_settings(self.environ).srun_options()

    def step_env(self, point: Point) -> dict[str, str]:
        """What the launcher adds to the step's environment for placement: the site's network variables,
        and the binding its GPU options asked for (the ranks read it: ddlbench.launch.devices)."""
        settings = launch_settings(self.environ)
        env = settings.rank_env()
        if self.gpu_options(point):
            env[GPU_BIND_VAR] = settings.gpu_bind
        return env

    def rendezvous_env(self) -> dict[str, str]:
        job_id = self.environ["SLURM_JOB_ID"]
        nodes = self.step_nodes()
        if nodes:
            master, port = nodes[0], int(self.environ.get(STEP_PORT_VAR) or slurm_master_port(job_id))
            return {"MASTER_ADDR": master, "MASTER_PORT": str(port), INIT_METHOD_VAR: f"tcp://{master}:{port}"}
        node_list = self.environ.get("SLURM_JOB_NODELIST")
        if not node_list:  # Snakemake's job step passes on only the job id
            allocation = current_allocation(self.environ)
            node_list = allocation.node_list if allocation else None
        if not node_list:
            raise DdlbenchError(f"cannot find the nodes of SLURM job {job_id}")
        master = first_host(node_list)
        port = slurm_master_port(job_id)
        return {"MASTER_ADDR": master, "MASTER_PORT": str(port), INIT_METHOD_VAR: f"tcp://{master}:{port}"}

    def launch(
        self, point: Point, *, rank_dir: Path, dump_params: Path | None, timeout_s: float, group: Path | None = None
    ) -> LaunchOutcome:
        stepped = {key: value for key, value in step_environment(self.environ).items() if key != GPU_BIND_VAR}
        env = {
            **stepped,
            **process_env(point, stepped),
            **self.rendezvous_env(),
            **self.step_env(point),
        }
        command = self.command(point, rank_dir=rank_dir, dump_params=dump_params, group=group)
        began = time.monotonic()
        last: dict[str, LaunchOutcome] = {}

        def attempt() -> tuple[bool, object]:
            left = max(timeout_s - (time.monotonic() - began), 1.0)
            process = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
            tee = StderrTee(process.stderr, SLURM_MEMORY_KILL, step=SRUN_STEP_ID)
            tee.start()
            outcome = supervise([process], ranks_of_process=[tuple(range(point.world_size))], timeout_s=left)
            tee.join(timeout=10)
            last["outcome"] = dataclasses.replace(outcome, launcher_messages=tuple(tee.matches), step_id=tee.step_id)
            # the controller never made the step (it did not answer, or still held the step's resources for
            # one that had ended): no rank ran, so it is started again
            said = "\n".join(tee.tail)
            never_made = (
                any(code != 0 for code in outcome.returncodes)
                and not outcome.timed_out
                and (is_transient(said) or bool(STEP_NOT_YET.search(said)))
                and not any(rank_dir.glob("rank-*.json"))
            )
            return (False, tee.tail[-1] if tee.tail else "srun failed") if never_made else (True, last["outcome"])

        # the outage is waited out within the point's own time limit
        patience = current_patience()
        patience = dataclasses.replace(patience, patience_s=min(patience.patience_s, timeout_s))
        try:
            return keep_trying(attempt, what=f"the srun step of point {point.point_id}", patience=patience)
        except OutageOver as exc:
            log.warning("%s", exc)
            return last["outcome"]


def select_launcher(
    name: str, environ: Mapping[str, str] | None = None, *, cores: int | None = None, hostfile: Path | None = None
) -> Launcher:
    """`auto` is srun inside a SLURM allocation (SLURM_JOB_ID set, srun on PATH), else mpirun inside a PBS
    job (PBS_NODEFILE set, mpirun or mpiexec on PATH: local processes would put every node's ranks on
    the job's first node), else local processes. `hostfile` is for mpirun only."""
    environ = os.environ if environ is None else environ
    if name not in LAUNCHERS:
        raise DdlbenchError(f"unknown launcher {name!r}; accepted: {', '.join(LAUNCHERS)}")
    if name == "auto":
        if "SLURM_JOB_ID" in environ and shutil.which("srun"):
            name = "srun"
        else:
            name = "mpirun" if environ.get("PBS_NODEFILE") and find_mpirun(environ) else "local"
    if hostfile is not None and name != "mpirun":
        raise DdlbenchError(f"a hostfile is for the mpirun launcher only, not for {name!r}")
    if name == "mpirun":
        return MpirunLauncher(environ, hostfile=hostfile, cores=cores)
    return SrunLauncher(environ) if name == "srun" else LocalLauncher(cores)
