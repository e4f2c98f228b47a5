"""Which device a rank trains on, on which CPUs, with which backend, and what that device is.

From the SLURM request to the rank: a point asks SLURM for `gpus_per_rank × ranks_per_node` GPUs per node
(`--gres=gpu:N`), and the ranks' srun step binds one to each task (`--gpus-per-task=1 --gpu-bind=…`,
ddlbench.launch.placement), telling the ranks so (GPU_BIND_VAR). The rule, in rank_device:

- the step bound GPUs and exactly one is visible: it is the rank's own, cuda:0;
- at least as many GPUs visible as ranks on the host (a step bound with `none`, local launches, mpirun):
  local rank r takes cuda:r;
- fewer: refused, naming the visible devices, unless the point asks for `share_gpus`: local rank r then
  takes cuda:(r mod count), and the ranks meet over gloo, since NCCL refuses two ranks on one device
  ("Duplicate GPU detected", measured with NCCL 2.28.9 on an H200).

Before the process group is made, the ranks of each host tell each other their GPU's UUID through the
rendezvous store (init_process_group): ranks that still land on one device (a map_gpu binding that
names one GPU twice, say) are refused, or, with `share_gpus`, make every rank of the job meet over gloo.

Then each rank moves onto its GPU's NUMA domain (align_cpus), where its CPUs are not there already.
Imported by the rank only (it imports torch).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ddlbench.errors import DdlbenchError
from ddlbench.launch.placement import GPU_BIND_VAR
from ddlbench.train.energy import cuda_identity

# where the kernel lists PCI devices: <domain:bus:device.function>/numa_node and local_cpulist (tests point
# it at a folder of their own)
SYS_PCI_DEVICES = Path("/sys/bus/pci/devices")
_STORE_PREFIX = "ddlbench/gpu"


def _shown(environ: Mapping[str, str]) -> str:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    return f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"


def rank_device(
    local_rank: int, local_ranks: int, environ: Mapping[str, str], *, share_gpus: bool = False
) -> tuple[torch.device, str]:
    """(device, backend) of local rank `local_rank` of `local_ranks` ranks on this host, by the rule of the
    module's docstring: the CPU with gloo without CUDA; else a GPU of its own with NCCL, or, with
    `share_gpus`, one it may share, with gloo. Sets the device current."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    count = torch.cuda.device_count()
    bound = environ.get(GPU_BIND_VAR, "")
    if bound and bound != "none" and count == 1:
        index, backend = 0, "nccl"  # SLURM bound this task to its GPU: the only one it sees
    elif count >= local_ranks:
        index, backend = local_rank, "nccl"
    elif share_gpus:
        index, backend = local_rank % count, "gloo"
    else:
        binding = f", bound by srun --gpu-bind={bound}" if bound else ""
        remedy = (
            "; or give the site a gpu_bind that binds one GPU to each task (single:1, per_task:1)"
            if bound and count > 1
            else ""
        )
        raise DdlbenchError(
            f"{local_ranks} ranks on this host need one GPU each, but {count} are visible to local rank "
            f"{local_rank} ({_shown(environ)}{binding}); set `share_gpus: true` in the sweep to let ranks share "
            f"GPUs (they then meet over gloo), or run fewer ranks per node{remedy}"
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device, backend


def device_key(device: torch.device) -> str:
    """What names the rank's device among its host's: the GPU's UUID (its PCI bus id, else its index where
    torch knows no UUID); "cpu" off CUDA."""
    if device.type != "cuda":
        return "cpu"
    identity = gpu_identity(device, {})
    return str(identity.get("uuid") or identity.get("pci_bus_id") or f"cuda:{device.index}")


def host_group(environ: Mapping[str, str]) -> str:
    """The name of this rank's host among the job's: its hostname, and SLURM's node name where there is one
    (virtual nodes may share a hostname; an MPI launch may hand the launching node's name to every host)."""
    return f"{socket.gethostname()}/{environ.get('SLURMD_NODENAME', '')}"


def ranks_sharing(store: Any, *, host: str, local_rank: int, local_ranks: int, key: str) -> list[int]:
    """Tell the host's other ranks this rank's device `key` through `store`, and read theirs: the local
    ranks (this one left out) on the same device."""
    store.set(f"{_STORE_PREFIX}/{host}/{local_rank}", key)
    keys = [store.get(f"{_STORE_PREFIX}/{host}/{other}").decode() for other in range(local_ranks)]
    return [other for other, theirs in enumerate(keys) if other != local_rank and theirs == key]


def any_rank_shares(store: Any, *, world_size: int, shares: bool) -> bool:
    """Whether any rank of the job shares its GPU: every rank counts itself in (the sharers first), the
    last one to arrive opens the gate, and all read the count once it is open. O(world size) store calls
    in all, not one per pair of ranks."""
    if shares:
        store.add(f"{_STORE_PREFIX}/sharing", 1)
    if store.add(f"{_STORE_PREFIX}/arrived", 1) == world_size:
        store.set(f"{_STORE_PREFIX}/all_arrived", "1")
    store.wait([f"{_STORE_PREFIX}/all_arrived"])
    return store.add(f"{_STORE_PREFIX}/sharing", 0) > 0


def settle_backend(
    store: Any,
    device: torch.device,
    backend: str,
    *,
    host: str,
    local_rank: int,
    local_ranks: int,
    world_size: int,
    share_gpus: bool,
) -> tuple[str, list[int]]:
    """The job's backend once its ranks know whether any two of them are on one GPU, and the local ranks
    that share this rank's. Off CUDA, `backend` as it is. A shared GPU without `share_gpus` is refused
    (on every rank, so all stop); with it, every rank of the job meets over gloo."""
    if device.type != "cuda":
        return backend, []
    key = device_key(device)
    shared_with = ranks_sharing(store, host=host, local_rank=local_rank, local_ranks=local_ranks, key=key)
    if not any_rank_shares(store, world_size=world_size, shares=bool(shared_with)):
        return backend, []
    if not share_gpus:
        where = (
            f"local ranks {', '.join(map(str, sorted([local_rank, *shared_with])))} of {host} are all on {key}"
            if shared_with
            else "ranks of another host share one GPU"
        )
        raise DdlbenchError(
            f"two ranks on one GPU: {where}; set `share_gpus: true` in the sweep to let ranks share GPUs (they "
            "then meet over gloo), or run fewer ranks per node, or bind one GPU to each task (the site's gpu_bind)"
        )
    return "gloo", shared_with


def init_process_group(
    device: torch.device,
    backend: str,
    *,
    init_method: str,
    rank: int,
    world_size: int,
    local_rank: int,
    local_ranks: int,
    timeout: timedelta,
    environ: Mapping[str, str],
    share_gpus: bool = False,
) -> tuple[str, list[int]]:
    """Make the default process group, and return its backend and the local ranks sharing this rank's GPU.
    On CUDA the store is made first (torch's own rendezvous of `init_method`), so that the ranks settle
    their backend through it (settle_backend) before the group exists; on the CPU torch makes both."""
    import torch.distributed as dist

    if device.type != "cuda":
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
        return backend, []
    store, rank, world_size = next(dist.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    backend, shared_with = settle_backend(
        store,
        device,
        backend,
        host=host_group(environ),
        local_rank=local_rank,
        local_ranks=local_ranks,
        world_size=world_size,
        share_gpus=share_gpus,
    )
    # the prefix torch gives a store it makes itself from an init_method
    dist.init_process_group(
        backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size, timeout=timeout
    )
    return backend, shared_with


def sysfs_name(pci_bus_id: str) -> str:
    """nvidia-smi's bus id (00000000:3B:00.0) as the kernel names the device in /sys (0000:3b:00.0)."""
    domain, bus, rest = pci_bus_id.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0-15,32-47") as sorted CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cpus))


def gpu_numa(pci_bus_id: str) -> tuple[int | None, tuple[int, ...] | None]:
    """The GPU's NUMA node (None where the kernel says -1, no NUMA information, or cannot say) and the CPUs
    local to it (None where unreadable), from SYS_PCI_DEVICES."""
    folder = SYS_PCI_DEVICES / sysfs_name(pci_bus_id)
    try:
        node = int((folder / "numa_node").read_text().strip())
    except (OSError, ValueError):
        node = -1
    try:
        local = parse_cpulist((folder / "local_cpulist").read_text())
    except (OSError, ValueError):
        local = None
    return (node if node >= 0 else None), (local or None)


def align_cpus(
    numa_node: int | None,
    local_cpus: tuple[int, ...] | None,
    needed: int,
    *,
    affinity: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
    set_affinity: Callable[[set[int]], None] = lambda cpus: os.sched_setaffinity(0, cpus),
) -> str:
    """Keep the rank on CPUs local to its GPU: where its affinity reaches beyond them, and the CPUs it has
    there are at least `needed` (its threads and loader workers), restrict it to those. Says what it did.

    Done here, in the rank, rather than left to SLURM (--gpu-bind=closest with --cpu-bind): that needs
    task/affinity and gres.conf's Cores on the cluster, and covers neither local launches nor mpirun; this
    works wherever the kernel knows the GPU's NUMA node, keeps within the CPUs the launcher (or SLURM)
    granted, and is recorded. Before the process group and the thread pools exist, so their threads
    inherit it."""
    if numa_node is None:
        return "left as they were: no NUMA information for the GPU (numa_node -1)"
    if not local_cpus:
        return f"left as they were: the CPUs local to the GPU (NUMA node {numa_node}) are unknown"
    current = set(affinity())
    local = set(local_cpus)
    inside = current & local
    if inside == current:
        return f"already on the GPU's NUMA node {numa_node}"
    if not inside:
        return f"left as they were: none of the rank's {len(current)} CPUs is local to the GPU (NUMA node {numa_node})"
    if len(inside) < needed:
        return (
            f"left as they were: {len(inside)} of the rank's {len(current)} CPUs are local to the GPU (NUMA node "
            f"{numa_node}), fewer than its {needed} threads and workers"
        )
    set_affinity(inside)
    return f"restricted to the {len(inside)} of its {len(current)} CPUs local to the GPU (NUMA node {numa_node})"


def place_on_gpu_numa_node(device: torch.device, needed: int) -> str:
    """align_cpus for the rank's GPU; "" off CUDA or where torch does not know the GPU's PCI bus id."""
    if device.type != "cuda":
        return ""
    bus = gpu_identity(device, {}).get("pci_bus_id")
    if not bus:
        return "left as they were: the GPU's PCI bus id is unknown"
    return align_cpus(*gpu_numa(bus), needed)


def gpu_identity(device: torch.device, environ: Mapping[str, str], **placement: Any) -> dict[str, Any]:
    """What the rank's GPU is: the devices SLURM (or the user) made visible and the binding the step asked
    for, and on CUDA the device's torch index, name, UUID, PCI address, NUMA node and local CPUs, so that
    two ranks on one GPU, or a point that asked for GPUs and ran on the CPU, show in the record.
    `placement`: what the rank did about it (cpu_alignment, shared_with), added as given."""
    identity: dict[str, Any] = {"visible": environ.get("CUDA_VISIBLE_DEVICES")}
    if environ.get(GPU_BIND_VAR):
        identity["bind"] = environ[GPU_BIND_VAR]
    if device.type != "cuda":
        return identity
    identity |= {"index": device.index, "name": torch.cuda.get_device_properties(device).name}
    uuid, bus_id = cuda_identity(device)  # as NVML and nvidia-smi print them
    if uuid is not None:
        identity["uuid"] = uuid
    if bus_id is not None:
        identity["pci_bus_id"] = bus_id
        numa_node, local_cpus = gpu_numa(bus_id)
        identity |= {"numa_node": numa_node, "local_cpus": list(local_cpus) if local_cpus else None}
    return identity | placement
