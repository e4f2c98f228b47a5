"""Autograd-aware collectives for layers split over a process group whose ranks all compute the same loss.

Every rank of the group runs the replicated parts of the model (norms, activations, the loss) on the
same data, so the gradient arriving at a replicated tensor is already identical on every rank. That
fixes the backward of each collective: a gather needs no reduction on the way back (each rank keeps
its own slice of a gradient it already holds in full), and a sum needs none either (each summand's
gradient is the sum's gradient). torch.distributed.nn.functional's all_reduce instead sums the
gradient in backward, which is right for a loss summed over ranks and p times too large here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

Group = dist.ProcessGroup | None  # None: the default (world) group


def gather_slices(x: Tensor, dim: int, group: Group) -> Tensor:
    """Every rank's `x` concatenated along `dim`, in group-rank order (no autograd: for states and gradients)."""
    x = x.contiguous()  # NCCL and gloo both send contiguous buffers only
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _own_slice(x: Tensor, dim: int, group: Group) -> Tensor:
    """This rank's equal slice of `x` along `dim`, as a tensor of its own (not a view of x)."""
    parts, index = dist.get_world_size(group), dist.get_rank(group)
    size = x.shape[dim] // parts
    # a copy, so that an in-place op downstream (ReLU(inplace=True)) never writes into x
    return x.narrow(dim, index * size, size).clone(memory_format=torch.contiguous_format)


class _CopyToGroup(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (sum) the gradient over the group."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Group) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)  # all_reduce is in place; autograd may share grad
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: all-reduce (sum) over the group. Backward: identity."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Group) -> Tensor:
        out = x.clone(memory_format=torch.contiguous_format)  # all_reduce is in place; leave the input untouched
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromGroup(torch.autograd.Function):
    """Forward: all-gather the ranks' slices and concatenate them along dim. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, group: Group) -> Tensor:
        ctx.dim, ctx.group = dim, group
        return gather_slices(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return _own_slice(grad, ctx.dim, ctx.group), None, None


class _SliceForGroup(torch.autograd.Function):
    """Forward: keep this rank's slice along dim. Backward: all-gather the slices' gradients along dim."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, group: Group) -> Tensor:
        ctx.dim, ctx.group = dim, group
        return _own_slice(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return gather_slices(grad, ctx.dim, ctx.group), None, None


def copy_to_group(x: Tensor, group: Group = None) -> Tensor:
    """Mark a replicated input that each rank uses for a partial result: its gradient is summed over the group."""
    return _CopyToGroup.apply(x, group)


def reduce_from_group(x: Tensor, group: Group = None) -> Tensor:
    """Sum the ranks' partial results; each rank's partial result receives the sum's gradient unchanged."""
    return _ReduceFromGroup.apply(x, group)


def gather_from_group(x: Tensor, dim: int, group: Group = None) -> Tensor:
    """Rebuild a replicated tensor from the ranks' equal slices along dim (concatenated in group-rank order)."""
    return _GatherFromGroup.apply(x, dim % x.dim(), group)


def slice_for_group(x: Tensor, dim: int, group: Group = None) -> Tensor:
    """This rank's equal slice along dim of a replicated tensor; the full gradient is rebuilt in backward."""
    if x.shape[dim] % dist.get_world_size(group):
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} does not split over {dist.get_world_size(group)}")
    return _SliceForGroup.apply(x, dim % x.dim(), group)
