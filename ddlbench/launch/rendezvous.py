"""Who a rank is and where ranks meet, from the environment its launcher gave it.

Local launches set torchrun-style variables (RANK, WORLD_SIZE, ...); srun sets SLURM_PROCID and
friends; ranks that mpirun started ask MPI (mpi4py). All end as one RankEnv, so the worker does not
care which launcher started it.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import DdlbenchError

log = logging.getLogger(__name__)

INIT_METHOD_VAR = "DDLBENCH_INIT_METHOD"
# Set to 1 by the mpirun launcher. An explicit mark rather than OMPI_COMM_WORLD_RANK or PMI_RANK: those
# leak into whatever a rank starts, and a SLURM step's SLURM_PROCID would leak into mpirun's ranks
MPI_VAR = "DDLBENCH_MPI"
# what an MPI runtime sets in the ranks it starts (Open MPI; MPICH's Hydra and Intel MPI; PMIx; MVAPICH)
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    init_method: str  # torch.distributed init_method: file://... (one host) or tcp://host:port


def rank_env(environ: Mapping[str, str], *, keep_mpi: bool = False) -> RankEnv:
    """Read a rank's identity from MPI when mpirun started it, else from torchrun-style variables,
    else from srun's SLURM_* variables. `keep_mpi`: leave MPI initialised (for a point that measures
    through MPI, ddlbench.train.calibration); it is finalised at exit."""
    if environ.get(MPI_VAR) == "1":
        if not any(name in environ for name in MPI_RANK_VARS):
            # mpi4py would start a one-rank MPI of its own here: every rank would be rank 0 of 1
            raise DdlbenchError(
                f"{MPI_VAR}=1 marks a rank of mpirun, but no MPI runtime started this process "
                f"(none of {', '.join(MPI_RANK_VARS)} is set); start it with mpirun/mpiexec, or unset {MPI_VAR}"
            )
        return mpi_rank_env(environ, keep_mpi=keep_mpi)
    if "RANK" in environ:
        keys = {
            "rank": "RANK",
            "world_size": "WORLD_SIZE",
            "local_rank": "LOCAL_RANK",
            "node_rank": "NODE_RANK",
        }
    elif "SLURM_PROCID" in environ:
        keys = {
            "rank": "SLURM_PROCID",
            "world_size": "SLURM_NTASKS",
            "local_rank": "SLURM_LOCALID",
            "node_rank": "SLURM_NODEID",
        }
    else:
        raise DdlbenchError("no rank in the environment: neither RANK (local launch) nor SLURM_PROCID (srun) is set")
    try:
        values = {field: int(environ[var]) for field, var in keys.items()}
    except KeyError as missing:
        raise DdlbenchError(f"rank environment incomplete: {missing.args[0]} is not set") from None
    init_method = environ.get(INIT_METHOD_VAR)
    if not init_method:
        if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
            raise DdlbenchError(f"no rendezvous: set {INIT_METHOD_VAR}, or MASTER_ADDR and MASTER_PORT")
        init_method = f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return RankEnv(**values, init_method=init_method)


def mpi_rank_env(environ: Mapping[str, str], *, keep_mpi: bool = False) -> RankEnv:
    """Who this mpirun-started rank is, from MPI; rank 0 picks the rendezvous (its host and a free TCP
    port) and broadcasts it. MPI is then finalised, collectively: it only bootstraps, and keeps nothing
    (threads, sockets, a pending MPI_Finalize) alive beside gloo, whose worker leaves with os._exit.

    The launcher sets LOCAL_WORLD_SIZE to the point's ranks per node, which the worker maps GPUs by;
    where MPI placed the ranks otherwise (an Intel MPI that follows the batch system's placement over
    -ppn, one host listed under two names), every rank refuses alike, naming each host's count."""
    try:
        from mpi4py import MPI  # here only: MPI_Init runs on import, and only mpirun's ranks may run it
    except ImportError as exc:
        raise DdlbenchError(f"rank started by mpirun, but mpi4py cannot be imported: {exc}") from exc
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)  # the ranks sharing this host's memory
    leader = node.bcast(world.rank, root=0)  # lowest world rank on this host
    hosts = world.allgather((leader, node.size, socket.gethostname()))
    leaders = sorted({first for first, _, _ in hosts})
    meet = None
    if world.rank == 0:
        # loopback when every rank is on this host: it needs no name resolution and no interface choice
        host = "127.0.0.1" if node.size == world.size else socket.gethostname()
        meet = (host, mpi_master_port())
    host, port = world.bcast(meet, root=0)
    env = RankEnv(
        rank=world.rank,
        world_size=world.size,
        local_rank=node.rank,
        node_rank=leaders.index(leader),
        init_method=f"tcp://{host}:{port}",
    )
    node.Free()
    if not keep_mpi:
        MPI.Finalize()
    misplaced = misplacement(hosts, environ.get("LOCAL_WORLD_SIZE"))
    if misplaced:
        raise DdlbenchError(misplaced)
    return env


def misplacement(hosts: list[tuple[int, int, str]], expected: str | None) -> str | None:
    """Why MPI's placement (per rank: its host's lowest rank, its host's rank count, its host name)
    differs from `expected` ranks on every host; None where it does not, or nothing is expected."""
    if not expected:
        return None
    counts = {first: (size, name) for first, size, name in hosts}
    if all(size == int(expected) for size, _ in counts.values()):
        return None
    placed = ", ".join(f"{counts[first][0]} on {counts[first][1]}" for first in sorted(counts))
    return (
        f"mpirun placed the {len(hosts)} ranks {placed}, but the point runs {expected} per node "
        "(LOCAL_WORLD_SIZE): list each host once in the hostfile, and check that the batch system's "
        "placement does not override mpirun's ranks per node"
    )


# Rendezvous ports that ddlbench derives (rather than asks the kernel for) stay below Linux's ephemeral
# range (net.ipv4.ip_local_port_range, 32768–60999 by default), from which the kernel picks the source port
# of every outgoing connection: a derived port inside it can be taken by any client on the host. "Free" is
# checked where the port is chosen (the launcher; a packed allocation's dispatcher), which is the master's
# host when the master is the allocation's first node (as srun runs the batch script and Snakemake's job
# step there); a master elsewhere is not probed from here, and a port taken there fails the rendezvous.
MPI_PORTS = range(10000, 20000)  # mpi_master_port: an mpirun launch's ranks meet here
MASTER_PORTS = range(20000, 24000)  # slurm_master_port: a job's ranks meet here
STEP_PORTS = range(24000, 32768)  # step_port: the steps of a packed allocation
STEP_LANES = 128  # steps of one allocation running at once that never share a port
PORT_TRIES = 32  # candidates looked at before giving up on finding one free
DEFAULT_EPHEMERAL = (32768, 60999)


def slurm_master_port(job_id: str, *, check: bool = True) -> int:
    """A port that differs between concurrent jobs, outside the ephemeral range and free on this host.

    One process picks it (the launcher, which runs on the job's first node) and hands it to every rank
    in MASTER_PORT, so the ranks agree whatever the check chose. The candidates are fixed by the job id:
    a port already bound here moves the choice to the next candidate, not to a random one."""
    span, job = len(MASTER_PORTS), int(job_id)
    candidates = (MASTER_PORTS.start + (job + k * 997) % span for k in range(PORT_TRIES))
    return _first_free(candidates, check=check, what=f"job {job_id}")


def mpi_master_port(draw: random.Random | None = None) -> int:
    """A port for an mpirun launch's rendezvous, chosen by its rank 0 and broadcast: free on rank 0's host and
    outside its ephemeral range. A port the kernel hands out (bind to port 0) lies inside it, where MPI's own
    connections and every other client's take their source ports: in CI one took such a port in the moment
    between its choice and torch's store binding it (EADDRINUSE, 2026-12-06). Candidates drawn at random
    from MPI_PORTS, so two launches at once on one host rarely try the same."""
    candidates = (draw or random.SystemRandom()).sample(MPI_PORTS, PORT_TRIES)
    return _first_free(candidates, check=True, what="an mpirun launch")


def step_port(job_id: str, lane: int, *, check: bool = True) -> int:
    """A rendezvous port for a step of packed job `job_id` running in `lane` (a number no other step of
    the job running at that moment holds, below STEP_LANES): outside the ephemeral range, free on this
    host. Steps in different lanes never share a port, whichever candidates the check skips: every
    candidate of a lane is `lane` modulo STEP_LANES."""
    slots, job = len(STEP_PORTS) // STEP_LANES, int(job_id)
    candidates = (STEP_PORTS.start + ((job + k) % slots) * STEP_LANES + lane % STEP_LANES for k in range(PORT_TRIES))
    return _first_free(candidates, check=check, what=f"step lane {lane} of job {job_id}")


def port_is_free(port: int) -> bool:
    """Whether a TCP listener could bind `port` on this host now (as torch's store does: SO_REUSEADDR, so a
    port whose last connection lingers in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """This host's ephemeral ports (first, last); Linux's default where the file cannot be read."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def _first_free(candidates: Iterable[int], *, check: bool, what: str) -> int:
    """The first candidate outside this host's ephemeral range and free now; where the site's range
    covers them all, the first free one; where none is free, the first (its rendezvous then says so)."""
    ports = list(candidates)
    if not check:
        return ports[0]
    low, high = ephemeral_range()
    outside = [port for port in ports if not low <= port <= high]
    if not outside:
        log.warning("every rendezvous port for %s lies in this host's ephemeral range %d-%d", what, low, high)
    for port in outside or ports:
        if port_is_free(port):
            return port
    log.warning("no free rendezvous port for %s among %d candidates; using %d", what, len(ports), ports[0])
    return ports[0]
