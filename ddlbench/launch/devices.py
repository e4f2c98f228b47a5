"""Which device a rank trains on, and what that device is.

One rule from the SLURM request to the rank: a point asks SLURM for `gpus_per_rank × ranks_per_node`
GPUs per node (`--gres=gpu:N`, never `--ntasks-per-gpu`), every rank of a node sees all of the node's
GPUs (CUDA_VISIBLE_DEVICES lists them; an srun step gets all the job's GRES by default), and local
rank r takes the r-th visible device. Local launches follow the same rule with all ranks on one
host. Imported by the rank only (it imports torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ddlbench.errors import DdlbenchError


def rank_device(local_rank: int, local_ranks: int, environ: Mapping[str, str]) -> tuple[torch.device, str]:
    """(device, backend) of local rank `local_rank` of `local_ranks` ranks on this host: CUDA device
    `local_rank` with NCCL when CUDA is available, else the CPU with gloo. Refuses, naming the visible
    devices, a host whose ranks do not each get a GPU of their own."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    count = torch.cuda.device_count()
    if local_ranks > count:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        shown = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"
        raise DdlbenchError(
            f"{local_ranks} ranks on this host need one GPU each, but {count} are visible ({shown}); "
            "ask for one GPU per rank on every node (the site's gpus_per_rank: 1), or run fewer ranks per node"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device, "nccl"


def gpu_identity(device: torch.device, environ: Mapping[str, str]) -> dict[str, Any]:
    """What the rank's GPU is: the devices SLURM (or the user) made visible, and on CUDA the device's
    torch index, name, UUID and PCI address, so that two ranks on one GPU, or a point that asked for
    GPUs and ran on the CPU, show in the record."""
    identity: dict[str, Any] = {"visible": environ.get("CUDA_VISIBLE_DEVICES")}
    if device.type != "cuda":
        return identity
    properties = torch.cuda.get_device_properties(device)
    identity |= {"index": device.index, "name": properties.name}
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        identity["uuid"] = f"GPU-{uuid}"
    # pci_{domain,bus,device}_id: torch's cudaDeviceProp fields, printed as nvidia-smi prints the bus id
    bus = [getattr(properties, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if None not in bus:
        identity["pci_bus_id"] = f"{bus[0]:08X}:{bus[1]:02X}:{bus[2]:02X}.0"
    return identity
