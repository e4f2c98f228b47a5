"""Data parallelism through Horovod: a replica per rank, gradients averaged by Horovod's DistributedOptimizer.

ddlbench starts the ranks itself and has already joined them in torch.distributed, so Horovod is
brought up the way `horovodrun --gloo` would bring it up, without horovodrun: rank 0 runs Horovod's
HTTP rendezvous server in-process, every rank learns its address, hostnames and slot (rank, local
and cross rank and size) over torch.distributed, sets the HOROVOD_* variables Horovod's gloo
controller reads, and calls hvd.init().

Devices: CPU tensors are reduced by gloo. CUDA tensors are reduced by NCCL if Horovod was built with
GPU operations (HOROVOD_GPU_OPERATIONS=NCCL, see envs/horovod.sh); otherwise Horovod copies each
fused buffer to the host, reduces it with gloo and copies it back, which facts() shows as
gradient_path "host-copied (gloo)" (and gpu_allreduce "gloo (host copy)").

Exit: close() runs hvd.shutdown(), which stops Horovod's background thread on every rank (the first
rank to call it stops them all; the others' calls return at once). Where close() is not called, the
worker's os._exit ends that thread too; a peer whose thread sees the connection drop may log
"Horovod background loop uncaught exception" and goes on, so neither way hangs or aborts.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.errors import DdlbenchError
from ddlbench.train.recording.comms import trace_horovod
from ddlbench.train.strategies import RankContext, StrategySetup, Trainer
from ddlbench.train.strategies.common import count_parameters, cpu_state, slice_of

log = logging.getLogger(__name__)

SETUP_HINT = "run `make horovod` (envs/horovod.sh builds and installs horovod 0.28.1 into the venv)"
_CONNECT_TIMEOUT_S = 2.0
_MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One rank's place in Horovod's layout: global, per-host (local) and across-hosts (cross) rank and size."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int  # index of this rank's host among the hosts that have a rank with this local_rank
    cross_size: int  # hosts that have a rank with this local_rank


def plan_slots(hostnames: list[str]) -> list[Slot]:
    """Horovod's slots for ranks 0..n-1 running on these hosts (what horovodrun's host assignment gives)."""
    local_ranks: list[int] = []
    seen: dict[str, int] = {}
    for host in hostnames:
        local_ranks.append(seen.get(host, 0))
        seen[host] = local_ranks[-1] + 1
    # hosts that own a given local rank, in order of their first rank
    owners: dict[int, list[str]] = {}
    for host, local in zip(hostnames, local_ranks, strict=True):
        owners.setdefault(local, []).append(host)
    return [
        Slot(
            hostname=host,
            rank=rank,
            size=len(hostnames),
            local_rank=local,
            local_size=seen[host],
            cross_rank=owners[local].index(host),
            cross_size=len(owners[local]),
        )
        for rank, (host, local) in enumerate(zip(hostnames, local_ranks, strict=True))
    ]


def slot_env(slot: Slot) -> dict[str, str]:
    """The variables through which Horovod's gloo controller learns a rank's slot."""
    return {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def import_horovod() -> tuple[ModuleType, ModuleType]:
    """(horovod, horovod.torch), or a DdlbenchError that names the setup step."""
    try:
        import horovod
        import horovod.torch as hvd
    except (ImportError, OSError) as exc:  # OSError: the extension built for another torch fails to load
        raise DdlbenchError(f"horovod is not installed (import failed: {exc}); {SETUP_HINT}") from exc
    return horovod, hvd


def _ipv4_interfaces() -> dict[str, str]:
    """{address: interface} of this host's IPv4 addresses, loopback last."""
    import psutil  # a horovod requirement

    found = {
        addr.address: name
        for name, addrs in psutil.net_if_addrs().items()
        for addr in addrs
        if addr.family == socket.AF_INET
    }
    return dict(sorted(found.items(), key=lambda item: item[0].startswith("127.")))


def _reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _interface_towards(address: str, interfaces: dict[str, str]) -> str | None:
    """The local interface the kernel routes `address` through (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError:
            return None
        return interfaces.get(probe.getsockname()[0])


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where this rank meets the others: Horovod's HTTP rendezvous server and the gloo interface."""

    address: str
    port: int
    iface: str
    hosts: int


def _rendezvous(ctx: RankContext, hvd_runner: ModuleType, env: dict[str, str]) -> tuple[Slot, Rendezvous, Any]:
    """Start the server on rank 0, exchange hostnames and addresses over torch.distributed, pick routes."""
    server = None
    port = 0
    if ctx.rank == 0:
        server = hvd_runner.RendezvousServer(verbose=0)
        port = server.start()  # binds a free port on all interfaces
    interfaces = _ipv4_interfaces()
    addresses = [address for address in interfaces if not address.startswith("127.")]
    mine = {"host": socket.gethostname(), "addresses": addresses, "port": port}
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    slots = plan_slots([peer["host"] for peer in everyone])
    if server is not None:
        from horovod.runner.common.util.hosts import SlotInfo

        server.init([SlotInfo(**asdict(slot)) for slot in slots])
    dist.barrier()  # the server knows the layout before any rank asks it

    root, slot = everyone[0], slots[ctx.rank]
    hosts = len({s.hostname for s in slots})
    if root["host"] == mine["host"]:
        address = "127.0.0.1"
    else:
        master = env.get("MASTER_ADDR")  # srun launches: the first node, usually rank 0's
        candidates = ([master] if master else []) + [root["host"], *root["addresses"]]
        address = next((a for a in candidates if _reachable(a, root["port"])), "")
        if not address:
            raise DdlbenchError(
                f"rank {ctx.rank} cannot reach Horovod's rendezvous server: {candidates}, port {root['port']}"
            )
    # gloo binds one interface and tells the peers its address there: loopback serves one host; several
    # hosts need the interface that routes to them (torch's GLOO_SOCKET_IFNAME if the site set it)
    iface = env.get("HOROVOD_GLOO_IFACE") or env.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if not iface and hosts == 1:
        iface = interfaces.get("127.0.0.1", "lo")
    if not iface:
        other = next(peer for peer in everyone if peer["host"] != mine["host"])
        iface = next(filter(None, (_interface_towards(a, interfaces) for a in other["addresses"])), "")
        if not iface:
            raise DdlbenchError(f"rank {ctx.rank}: no interface routes to host {other['host']}; set GLOO_SOCKET_IFNAME")
    return slot, Rendezvous(address=address, port=root["port"], iface=iface, hosts=hosts), server


def join_horovod(ctx: RankContext, *, fusion_threshold_bytes: int) -> tuple[ModuleType, Slot, Rendezvous]:
    """Bring Horovod up on ranks that torch.distributed already joined; returns horovod.torch and this rank's slot."""
    horovod, hvd = import_horovod()
    if hvd.is_initialized():
        raise DdlbenchError("horovod is already initialised in this process; one point per process")
    from horovod.runner.http import http_server

    slot, meet, server = _rendezvous(ctx, http_server, dict(os.environ))
    os.environ.update(
        slot_env(slot)
        | {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": meet.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(meet.port),
            "HOROVOD_GLOO_IFACE": meet.iface,
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_FUSION_THRESHOLD": str(fusion_threshold_bytes),
        }
    )
    hvd.init()
    dist.barrier()  # every rank's gloo contexts are connected: the HTTP store is not needed any more
    if server is not None:
        server.stop()
    if (hvd.rank(), hvd.size()) != (ctx.rank, ctx.world_size):
        raise DdlbenchError(f"horovod came up as rank {hvd.rank()}/{hvd.size()}, not {ctx.rank}/{ctx.world_size}")
    log.info(
        "horovod %s: %s, rendezvous %s:%d, gloo on %s", horovod.__version__, slot, meet.address, meet.port, meet.iface
    )
    return hvd, slot, meet


def gradient_path(*, on_cuda: bool, nccl_built: bool) -> str:
    """How gradients travel between ranks, from what Horovod was built with (horovod.torch.nccl_built()):
    CUDA tensors go through NCCL only when Horovod has NCCL GPU operations; otherwise each fused buffer is
    copied to the host, reduced by gloo and copied back, which a GPU comparison with ddp must not miss."""
    if not on_cuda:
        return "gloo"
    return "nccl" if nccl_built else "host-copied (gloo)"


class HorovodTrainer:
    """Each rank trains on its own contiguous slice of the global batch; Horovod averages the gradients."""

    def __init__(self, model: nn.Module, setup: StrategySetup) -> None:
        self.ctx, self.loss_fn = setup.ctx, setup.loss_fn
        self.fusion_threshold_mb = float(setup.options.get("fusion_threshold_mb", "64"))
        fusion_bytes = int(self.fusion_threshold_mb * _MIB)
        self.hvd, self.slot, self.rendezvous = join_horovod(self.ctx, fusion_threshold_bytes=fusion_bytes)
        hvd = self.hvd
        self.model = model.to(self.ctx.device)
        optimizer = setup.make_optimizer(self.model.parameters())
        # ranks built the same model from the same seed; the broadcasts are Horovod's contract all the same.
        # On a fresh optimizer broadcast_optimizer_state takes one step with zero gradients to create the
        # state (SGD: zero momentum buffers, parameters unchanged), then sends rank 0's.
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # backward hooks start an asynchronous all-reduce as each gradient is ready; step() waits for them
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=self.model.named_parameters(), op=hvd.Average
        )
        trace_horovod(self.optimizer)
        # bf16 autocast only: fp16 (its scaler) and compile are refused at plan time (catalog `refuses`)
        self.execution = setup.execution
        self._facts = self._describe(fusion_bytes)  # read while horovod is up; facts() may come after close()

    def _describe(self, fusion_bytes: int) -> dict[str, Any]:
        import horovod

        hvd, on_cuda = self.hvd, self.ctx.device.type == "cuda"
        nccl = bool(hvd.nccl_built())
        return {
            "mesh": {"dp": hvd.size()},
            "coords": {"dp": hvd.rank()},
            "local_parameters": count_parameters(self.model),
            "horovod_version": horovod.__version__,
            "controller": "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "unknown",
            "fusion_threshold_mb": self.fusion_threshold_mb,
            "fusion_threshold_bytes": fusion_bytes,
            "local_rank": self.slot.local_rank,
            "local_size": self.slot.local_size,
            "cross_rank": self.slot.cross_rank,
            "cross_size": self.slot.cross_size,
            "hosts": self.rendezvous.hosts,
            "gloo_iface": self.rendezvous.iface,
            "nccl_built": nccl,
            "cuda_built": bool(hvd.cuda_built()),
            "gpu_allreduce": ("nccl" if nccl else "gloo (host copy)") if on_cuda else None,
            "gradient_path": gradient_path(on_cuda=on_cuda, nccl_built=nccl),
            "gradient_reduction": "tensor-fused all-reduce overlapped with backward (Horovod DistributedOptimizer: "
            "each gradient queued by its hook as backward produces it, fused up to fusion_threshold_mb)",
        }

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        return slice_of(global_batch_size, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad()  # Horovod's override takes no arguments; torch's default sets None
        with self.execution.autocast():
            loss = self.loss_fn(self.model(self.execution.prepare_inputs(inputs)), targets)
        self.execution.backward(loss)
        # Horovod's step: synchronize() waits for the averaged gradients, then the wrapped step
        self.execution.optimizer_step(self.optimizer)
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        return cpu_state(self.model) if self.ctx.rank == 0 else None

    def facts(self) -> dict[str, Any]:
        return dict(self._facts)

    def close(self) -> None:
        """Stop Horovod's background thread on every rank together, before torch.distributed is torn down."""
        if self.hvd.is_initialized():
            self.hvd.shutdown()


def parallelize_horovod(model: nn.Module, setup: StrategySetup) -> Trainer:
    return HorovodTrainer(model, setup)
