"""Pieces several strategies share: batch slices, gradient averaging over a group, state gathering."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddlbench.train.strategies import RankContext


def ddp_options() -> dict[str, Any]:
    """Keywords every DistributedDataParallel of ddlbench takes: init_sync=False, no broadcast of the
    weights, which every rank already draws alike (ddlbench.train.models.init)."""
    return {"init_sync": False}


def slice_of(total: int, index: int, parts: int) -> tuple[int, int]:
    """[start, stop) of the index-th of `parts` equal contiguous slices of `total` items."""
    if total % parts:
        raise ValueError(f"{total} items do not split into {parts} equal parts")
    size = total // parts
    return index * size, (index + 1) * size


def build_mesh(ctx: RankContext, split: int, inner: str) -> DeviceMesh:
    """The 2-D mesh (dp, inner) of world_size // split replicas of `split` ranks; ranks of one replica
    are consecutive, so a replica sits inside a node when split divides ranks per node."""
    return init_device_mesh(ctx.device.type, (ctx.world_size // split, split), mesh_dim_names=("dp", inner))


def cpu_state(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """A detached CPU copy of a module's state dict, names prefixed."""
    return {f"{prefix}{name}": value.detach().cpu().clone() for name, value in module.state_dict().items()}


def gather_state_on_rank0(local: dict[str, Tensor], group: dist.ProcessGroup | None = None) -> dict[str, Tensor] | None:
    """Merge every rank's partial state dict on rank 0 (global rank 0 of the default group).

    Entries present on several ranks (replicated layers) must be equal; rank 0's copy is kept.
    """
    world = dist.get_world_size(group)
    parts: list[Any] = [None] * world if dist.get_rank() == 0 else []
    dist.gather_object(local, parts if dist.get_rank() == 0 else None, dst=0, group=group)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, Tensor] = {}
    for part in parts:
        for name, value in part.items():
            merged.setdefault(name, value)
    return merged


def count_parameters(module: nn.Module) -> int:
    """Elements of the parameters a module holds locally (a DTensor counts its local shard)."""
    total = 0
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel()
    return total
