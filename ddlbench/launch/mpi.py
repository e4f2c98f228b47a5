"""The mpirun launcher: a point's ranks started by one `mpirun`/`mpiexec`, for sites without srun (PBS,
Flux with an MPI) and for runs that must start the MPI way.

The ranks learn rank, world size, local rank and where to meet from MPI itself (mpi4py, in
rendezvous.mpi_rank_env): rank 0 broadcasts its host and a free TCP port for torch.distributed, and
MPI is finalised before training starts, so gloo (or NCCL) does all the communication measured.

Two families of mpirun take different options, told apart by `mpirun --version`: Open MPI
(`-np N --map-by ppr:R:node`, variables for remote hosts named with `-x`) and MPICH's Hydra, which
Intel MPI and MVAPICH share (`-n N -ppn R -genvall`). Hosts come from a hostfile (--hostfile, or
$DDLBENCH_HOSTFILE), else from PBS's $PBS_NODEFILE, else this host alone. On this host alone, cores
are checked and ranks pinned as local launches are; on several hosts the ranks run unpinned (their
records say so) since this process cannot claim cores on other hosts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ddlbench.errors import DdlbenchError
from ddlbench.launch.command import RETAIN_ENV, process_env, worker_command
from ddlbench.launch.cores import (
    PIN_BY_LOCAL_RANK_VAR,
    PIN_VAR,
    CoreGrant,
    check_cores,
    claimed_cores,
    grant_for,
    rank_cpus,
)
from ddlbench.launch.placement import NETWORK_ENV_NAMES, launch_settings
from ddlbench.launch.processes import LaunchOutcome, supervise
from ddlbench.launch.rendezvous import MPI_VAR
from ddlbench.point import Point

Flavour = Literal["openmpi", "hydra"]
FLAVOURS: dict[Flavour, str] = {"openmpi": "Open MPI", "hydra": "MPICH/Hydra (Intel MPI, MVAPICH)"}
EXECUTABLES = ("mpirun", "mpiexec")
HOSTFILE_VAR = "DDLBENCH_HOSTFILE"
# what a remote rank needs besides ddlbench's own DDLBENCH_* variables (Open MPI passes only the named)
_PASSED_ON = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
_SET_FOR_RANKS = ("LOCAL_WORLD_SIZE",)  # set by rank_environment, and needed by remote ranks too
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LOCAL_NAMES = ("localhost", "127.0.0.1")


def find_mpirun(environ: Mapping[str, str]) -> str | None:
    """The first of mpirun, mpiexec on the PATH of `environ`."""
    path = environ.get("PATH", os.defpath)
    return next(filter(None, (shutil.which(name, path=path) for name in EXECUTABLES)), None)


def flavour_of(version_text: str, executable: str = "mpirun") -> Flavour:
    """Which family of mpirun printed this `--version` text."""
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return "openmpi"
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI", version_text, re.IGNORECASE):
        return "hydra"
    first = next((line.strip() for line in version_text.splitlines() if line.strip()), "(nothing)")
    raise DdlbenchError(
        f"{executable} --version says {first!r}: not an mpirun ddlbench knows; accepted: {', '.join(FLAVOURS.values())}"
    )


def detect_flavour(executable: str) -> Flavour:
    try:
        result = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DdlbenchError(f"cannot run {executable} --version: {exc}") from None
    return flavour_of(result.stdout + result.stderr, executable)


def read_hostfile(path: Path) -> tuple[str, ...]:
    """Distinct hosts of a hostfile, in order of first appearance. Accepts Open MPI's `host slots=N`,
    MPICH's `host:N` and PBS's one line per slot; `#` starts a comment."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DdlbenchError(f"cannot read hostfile {path}: {exc.strerror}") from None
    hosts: dict[str, None] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        host = words[0].split(":", 1)[0]
        if not _HOSTNAME.fullmatch(host):
            raise DdlbenchError(
                f"hostfile {path} line {number}: {host!r} is not a host name; accepted: letters, digits, '.', '_', '-'"
            )
        hosts[host] = None
    if not hosts:
        raise DdlbenchError(f"hostfile {path} names no host")
    return tuple(hosts)


def known_hosts(hostfile: Path | None, environ: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """The hosts mpirun may use and where that list came from."""
    if hostfile is None and environ.get(HOSTFILE_VAR):
        hostfile = Path(environ[HOSTFILE_VAR])
    if hostfile is not None:
        return read_hostfile(hostfile), f"hostfile {hostfile}"
    if environ.get("PBS_NODEFILE"):
        return read_hostfile(Path(environ["PBS_NODEFILE"])), f"$PBS_NODEFILE ({environ['PBS_NODEFILE']})"
    return (socket.gethostname(),), "this host (no --hostfile, $DDLBENCH_HOSTFILE or $PBS_NODEFILE)"


def is_this_host(host: str) -> bool:
    name = socket.gethostname()
    return host in {*_LOCAL_NAMES, name, name.split(".")[0], socket.getfqdn()}


def mpirun_command(
    flavour: Flavour,
    executable: str,
    *,
    point: Point,
    hosts: tuple[str, ...],
    worker: list[str],
    exported: tuple[str, ...] = (),
    as_root: bool = False,
) -> list[str]:
    """The one command that starts all ranks: `point.ranks_per_node` on each of `hosts`, in rank order
    host by host. `exported`: variables Open MPI must pass on to remote hosts (by name: values stay in
    the environment, off the command line); Hydra passes the whole environment (-genvall)."""
    ranks, per_node = str(point.world_size), str(point.ranks_per_node)
    if flavour == "openmpi":
        command = [executable, "-np", ranks, "--host", ",".join(f"{host}:{per_node}" for host in hosts)]
        # ddlbench pins ranks itself (DDLBENCH_CPUS_BY_LOCAL_RANK); Open MPI's own binding would override it
        command += ["--map-by", f"ppr:{per_node}:node", "--bind-to", "none"]
        if as_root:  # Open MPI refuses root unless told; only where we are root
            command.append("--allow-run-as-root")
        for name in exported:
            command += ["-x", name]
    else:
        command = [executable, "-n", ranks, "-ppn", per_node, "-hosts", ",".join(hosts), "-genvall"]
    return [*command, *worker]


@dataclass(frozen=True, kw_only=True)
class MpiPlan:
    """How one point's ranks are started: which mpirun, which family, which hosts."""

    executable: str
    flavour: Flavour
    hosts: tuple[str, ...]  # the point's nodes: the first `point.nodes` of the known hosts
    on_this_host: bool  # one node, this host: cores are checked and ranks pinned as local launches are


class MpirunLauncher:
    """One mpirun (or mpiexec) command for all ranks; ranks meet over TCP at the address rank 0
    broadcasts through MPI."""

    name = "mpirun"

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        hostfile: Path | None = None,
        cores: int | None = None,
        executable: str | None = None,
    ) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.hostfile = hostfile
        self.cores = cores
        self.executable = executable
        self._flavours: dict[str, Flavour] = {}

    def plan(self, point: Point) -> MpiPlan:
        """Find mpirun and the hosts; refuse a point that needs more nodes than hosts are known."""
        executable = self.executable or find_mpirun(self.environ)
        if executable is None:
            raise DdlbenchError(
                "the mpirun launcher needs mpirun or mpiexec on PATH (Debian: apt-get install openmpi-bin)"
            )
        if executable not in self._flavours:
            self._flavours[executable] = detect_flavour(executable)
        hosts, source = known_hosts(self.hostfile, self.environ)
        if point.nodes > len(hosts):
            raise DdlbenchError(
                f"point {point.point_id} needs {point.nodes} nodes, but mpirun knows {len(hosts)} "
                f"host{'s' if len(hosts) > 1 else ''} ({', '.join(hosts)}) from {source}; list more in a hostfile "
                f"(--hostfile or ${HOSTFILE_VAR}), or run inside a PBS job"
            )
        chosen = hosts[: point.nodes]
        return MpiPlan(
            executable=executable,
            flavour=self._flavours[executable],
            hosts=chosen,
            on_this_host=len(chosen) == 1 and is_this_host(chosen[0]),
        )

    def check(self, point: Point) -> CoreGrant | None:
        """Refusals before anything starts; the core grant when all ranks run on this host."""
        return self._grant(point, self.plan(point))

    def _grant(self, point: Point, plan: MpiPlan) -> CoreGrant | None:
        if not plan.on_this_host:
            return None
        grant = grant_for(point, self.cores)
        check_cores(point, grant)
        return grant

    def launch(
        self, point: Point, *, rank_dir: Path, dump_params: Path | None, timeout_s: float, group: Path | None = None
    ) -> LaunchOutcome:
        plan = self.plan(point)
        grant = self._grant(point, plan)
        with claimed_cores(grant) if grant else contextlib.nullcontext() as claimed:
            env = self.rank_environment(point, claimed)
            command = self.command(point, plan, env, rank_dir=rank_dir, dump_params=dump_params, group=group)
            process = subprocess.Popen(command, env=env, start_new_session=True)
            try:
                return supervise([process], ranks_of_process=[tuple(range(point.world_size))], timeout_s=timeout_s)
            finally:
                kill_session(process.pid)

    def command(
        self,
        point: Point,
        plan: MpiPlan,
        env: Mapping[str, str],
        *,
        rank_dir: Path,
        dump_params: Path | None,
        group: Path | None = None,
    ) -> list[str]:
        """The mpirun command of `plan`, naming for Open MPI the variables of `env` its ranks need."""
        # the retaining allocator's variables, whoever set them: glibc reads them as each remote rank starts
        passed_on = (*_PASSED_ON, *_SET_FOR_RANKS, *process_env(point, {}), *RETAIN_ENV, *NETWORK_ENV_NAMES)
        exported = tuple(sorted(name for name in env if name.startswith("DDLBENCH_") or name in passed_on))
        return mpirun_command(
            plan.flavour,
            plan.executable,
            point=point,
            hosts=plan.hosts,
            worker=worker_command(point, rank_dir, dump_params, group),
            exported=exported,
            as_root=os.geteuid() == 0,
        )

    def rank_environment(self, point: Point, claimed: tuple[int, ...] | None) -> dict[str, str]:
        env = {key: value for key, value in self.environ.items() if key not in (PIN_VAR, PIN_BY_LOCAL_RANK_VAR)}
        env |= launch_settings(self.environ).rank_env()  # the site's network variables
        env |= process_env(point, env) | {
            MPI_VAR: "1",
            # ranks per host as mpirun is told to place them: the worker maps local ranks to GPUs by it
            # (a caller's own LOCAL_WORLD_SIZE, from torchrun say, must not reach the ranks), and each
            # rank checks MPI's actual placement against it (rendezvous.misplacement)
            "LOCAL_WORLD_SIZE": str(point.ranks_per_node),
            # Intel MPI follows a batch system's placement over -ppn unless told not to; others ignore it
            "I_MPI_JOB_RESPECT_PROCESS_PLACEMENT": "off",
        }
        if claimed:
            slices = (rank_cpus(claimed, local, point.cores_per_rank) for local in range(point.ranks_per_node))
            env[PIN_BY_LOCAL_RANK_VAR] = ";".join(",".join(map(str, cpus)) for cpus in slices)
        return env


def kill_session(session: int) -> None:
    """SIGKILL what is left of the session mpirun led: Open MPI puts each local rank in a process group of
    its own, so stopping mpirun's group reaches the ranks only through mpirun, which may be gone."""
    proc = Path("/proc")
    if not proc.is_dir():
        return
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == session:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # field 6 of stat is the session id; the command name before it may hold spaces, in parentheses
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:
                os.kill(int(entry.name), signal.SIGKILL)
