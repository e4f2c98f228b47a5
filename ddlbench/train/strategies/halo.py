"""Halo exchange for spatial parallelism: which input rows each rank's share of a convolution or pooling
reads, the autograd functions that move rows (and their gradients) between the ranks of a group, and the
layers (convolution, pooling, batch and group norm) that compute on a slab what they compute on the whole.

Rows are numbered globally along the split axis (dim 2: height, or depth for volumes); rank r of p holds
the contiguous slab [r·extent/p, (r+1)·extent/p) of a layer's input and computes the slab
[r·out/p, (r+1)·out/p) of its output. The arithmetic is pure so it can be tested without ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd import Function

from ddlbench.catalog.split_rules import slab_problem

CONVS = (nn.Conv2d, nn.Conv3d)
MAX_POOLS = (nn.MaxPool2d, nn.MaxPool3d)
AVG_POOLS = (nn.AvgPool2d, nn.AvgPool3d)
WINDOWED = CONVS + MAX_POOLS + AVG_POOLS  # layers whose output rows read several input rows
NORMS = (nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm)  # layers whose statistics span the whole extent


@dataclass(frozen=True, kw_only=True)
class Piece:
    """Global rows [start, stop) of a layer's input, held by rank `owner` (or sent to it, in `sends`)."""

    owner: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, kw_only=True)
class Window:
    """The input rows one rank's output slab reads: [start, stop) globally, of which pad_before rows lie
    before the input and pad_after after it (the layer's padding), and the rest come in `pieces`, in order."""

    start: int
    stop: int
    pad_before: int
    pad_after: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """What one rank does for one layer: assemble its window from its own slab and received pieces, and
    send the rows of its slab that other ranks' windows read (`sends`: owner = the destination)."""

    rank: int
    slab_start: int  # global row of the first row of this rank's slab
    slab_rows: int
    window: Window
    sends: tuple[Piece, ...]

    @property
    def receives(self) -> tuple[Piece, ...]:
        return tuple(piece for piece in self.window.pieces if piece.owner != self.rank)

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.receives)

    @property
    def halo_rows(self) -> int:
        """Rows this rank receives from other ranks (the halo), per sample and channel."""
        return sum(piece.rows for piece in self.receives)


def output_extent(extent: int, *, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output rows of a convolution or pooling (floor mode) along one axis."""
    return (extent + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def halo_windows(
    extent: int, parts: int, *, kernel: int, stride: int, padding: int, dilation: int = 1
) -> tuple[Window, ...]:
    """The window each of `parts` ranks reads to compute its equal share of the output.

    Raises ValueError when the input or the output does not split into `parts` equal slabs of at least one
    row. A window may reach into any rank's slab, not only a neighbour's (a wide or dilated kernel on thin
    slabs), so no case needs a separate rule.
    """
    out = output_extent(extent, kernel=kernel, stride=stride, padding=padding, dilation=dilation)
    if (problem := slab_problem(extent, out, parts)) is not None:  # the rule planning checks too
        raise ValueError(problem)
    slab, out_slab = extent // parts, out // parts
    windows = []
    for rank in range(parts):
        first_out, last_out = rank * out_slab, (rank + 1) * out_slab - 1
        start = first_out * stride - padding
        stop = last_out * stride - padding + dilation * (kernel - 1) + 1
        pieces = tuple(
            Piece(owner=owner, start=max(start, owner * slab), stop=min(stop, (owner + 1) * slab))
            for owner in range(parts)
            if max(start, owner * slab) < min(stop, (owner + 1) * slab)
        )
        windows.append(
            Window(
                start=start,
                stop=stop,
                pad_before=max(0, min(stop, 0) - start),
                pad_after=max(0, stop - max(start, extent)),
                pieces=pieces,
            )
        )
    return tuple(windows)


def rank_plan(windows: tuple[Window, ...], rank: int, extent: int) -> RankPlan:
    """One rank's part of a layer's exchange, from every rank's window."""
    slab = extent // len(windows)
    sends = tuple(
        Piece(owner=other, start=piece.start, stop=piece.stop)
        for other, window in enumerate(windows)
        if other != rank
        for piece in window.pieces
        if piece.owner == rank
    )
    return RankPlan(rank=rank, slab_start=rank * slab, slab_rows=slab, window=windows[rank], sends=sends)


def _resized(x: Tensor, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[2] = rows
    return shape


def _exchange(sends: list[tuple[int, Tensor]], receives: list[tuple[int, Tensor]], group: dist.ProcessGroup) -> None:
    """Post every send and receive at once (peers are ranks of `group`) and wait for all; since nothing
    blocks before everything is posted, no order of ranks can deadlock. Sends go in peer order, then
    receives, so every rank issues the same sequence (NCCL batches them into one group call)."""
    ops = [dist.P2POp(dist.isend, tensor, group=group, group_peer=peer) for peer, tensor in sorted(sends, key=_peer)]
    ops += [
        dist.P2POp(dist.irecv, tensor, group=group, group_peer=peer) for peer, tensor in sorted(receives, key=_peer)
    ]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _peer(item: tuple[int, Tensor]) -> int:
    return item[0]


class HaloExchange(Function):
    """Slab → the layer's window: the slab's own rows, rows received from the ranks that hold them, and
    fill rows (the layer's padding) at the global edges. Backward returns each received row's gradient to
    its owner, which adds it to its slab's gradient; the fill rows' gradient is dropped."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: RankPlan, group: dist.ProcessGroup, fill: float) -> Tensor:
        ctx.plan, ctx.group, ctx.shape = plan, group, x.shape
        sends = [(p.owner, x.narrow(2, p.start - plan.slab_start, p.rows).contiguous()) for p in plan.sends]
        received = {p.owner: x.new_empty(_resized(x, p.rows)) for p in plan.receives}
        _exchange(sends, list(received.items()), group)
        window = plan.window
        parts = [x.new_full(_resized(x, window.pad_before), fill)] if window.pad_before else []
        for piece in window.pieces:
            if piece.owner == plan.rank:
                parts.append(x.narrow(2, piece.start - plan.slab_start, piece.rows))
            else:
                parts.append(received[piece.owner])
        if window.pad_after:
            parts.append(x.new_full(_resized(x, window.pad_after), fill))
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        plan: RankPlan = ctx.plan
        grad_slab = grad.new_zeros(ctx.shape)
        returned: list[tuple[int, Tensor]] = []
        offset = plan.window.pad_before
        for piece in plan.window.pieces:
            part = grad.narrow(2, offset, piece.rows)
            if piece.owner == plan.rank:
                grad_slab.narrow(2, piece.start - plan.slab_start, piece.rows).add_(part)
            else:
                returned.append((piece.owner, part.contiguous()))
            offset += piece.rows
        incoming = [(p, grad.new_empty(_resized(grad, p.rows))) for p in plan.sends]
        _exchange(returned, [(p.owner, buffer) for p, buffer in incoming], ctx.group)
        for piece, buffer in incoming:
            grad_slab.narrow(2, piece.start - plan.slab_start, piece.rows).add_(buffer)
        return grad_slab, None, None, None


def fetch_window(x: Tensor, plan: RankPlan, group: dist.ProcessGroup, fill: float) -> Tensor:
    """The layer's window for this rank; plain tensor ops (no messages) when it needs no other rank's rows."""
    if plan.communicates:
        return HaloExchange.apply(x, plan, group, fill)
    window = plan.window
    rows = [x.narrow(2, p.start - plan.slab_start, p.rows) for p in window.pieces]
    if window.pad_before:
        rows.insert(0, x.new_full(_resized(x, window.pad_before), fill))
    if window.pad_after:
        rows.append(x.new_full(_resized(x, window.pad_after), fill))
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=2)


class GatherSlabs(Function):
    """All-gather the slabs along dim 2 into the whole tensor, from where the model runs replicated.
    Every rank then computes the same loss from the same tensor, so its gradient is the same everywhere
    and each rank keeps its own slab's rows of it (no message in backward)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, parts: int, index: int) -> Tensor:
        ctx.index, ctx.rows = index, x.shape[2]
        x = x.contiguous()
        slabs = [torch.empty_like(x) for _ in range(parts)]
        dist.all_gather(slabs, x, group=group)
        return torch.cat(slabs, dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return grad.narrow(2, ctx.index * ctx.rows, ctx.rows).contiguous(), None, None, None


class GatherStats(Function):
    """All-gather each rank's small statistics tensor, stacked along a new dim 0. Each rank used every
    rank's statistics, so the gradient of rank q's statistics is the sum over ranks of their gradient for
    entry q: an all-reduce of the stacked gradient, of which each rank keeps its own entry."""

    @staticmethod
    def forward(ctx, stats: Tensor, group: dist.ProcessGroup, parts: int, index: int) -> Tensor:
        ctx.group, ctx.index = group, index
        stats = stats.contiguous()
        gathered = [torch.empty_like(stats) for _ in range(parts)]
        dist.all_gather(gathered, stats, group=group)
        return torch.stack(gathered)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.index], None, None, None


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """A windowed layer's kernel, stride, padding and dilation over its spatial dims (split axis first)."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


def _tuple(value: int | tuple[int, ...], dims: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, tuple | list) else (value,) * dims


def geometry(layer: nn.Module) -> Geometry | str:
    """The layer's geometry, or why it cannot run on slabs as it runs on the whole."""
    dims = 3 if isinstance(layer, nn.Conv3d | nn.MaxPool3d | nn.AvgPool3d) else 2
    if isinstance(layer, CONVS):
        if layer.padding_mode != "zeros":
            return f"padding_mode {layer.padding_mode!r} (only zero padding is split)"
        padding = layer.padding
        if isinstance(padding, str):  # "valid" or "same"; "same" is symmetric only for an even total
            totals = [d * (k - 1) for k, d in zip(layer.kernel_size, layer.dilation, strict=True)]
            if padding == "same" and any(total % 2 for total in totals):
                return "asymmetric 'same' padding"
            padding = tuple(total // 2 for total in totals) if padding == "same" else (0,) * dims
        return Geometry(kernel=layer.kernel_size, stride=layer.stride, padding=padding, dilation=layer.dilation)
    if isinstance(layer, MAX_POOLS):
        if layer.return_indices:
            return "max-pool returning indices"
        dilation = _tuple(layer.dilation, dims)
    elif isinstance(layer, AVG_POOLS):
        if not layer.count_include_pad and _tuple(layer.padding, dims)[0]:
            return "average pool excluding padding from its divisor along the split axis"
        dilation = (1,) * dims
    else:
        return f"{type(layer).__name__} is not a windowed layer"
    kernel = _tuple(layer.kernel_size, dims)
    stride = _tuple(layer.stride or layer.kernel_size, dims)
    return Geometry(kernel=kernel, stride=stride, padding=_tuple(layer.padding, dims), dilation=dilation)


class SlabWindowed(nn.Module):
    """A convolution or pooling on a slab: fetch the window (halo rows from other ranks, padding at the
    global edges), then run the layer with no padding along the split axis and its own on the others.
    Holds the original parameters under the original names, so state dicts keep their keys."""

    def __init__(self, layer: nn.Module, plan: RankPlan, group: dist.ProcessGroup) -> None:
        super().__init__()
        geo = geometry(layer)
        if isinstance(geo, str):
            raise ValueError(geo)
        self.plan, self.group, self.layer_name = plan, group, type(layer).__name__
        self.kernel, self.stride, self.dilation = geo.kernel, geo.stride, geo.dilation
        self.padding = (0, *geo.padding[1:])
        three_d = isinstance(layer, nn.Conv3d | nn.MaxPool3d | nn.AvgPool3d)
        self.fill, self.weighted = 0.0, isinstance(layer, CONVS)
        if isinstance(layer, CONVS):
            self.weight = layer.weight
            self.register_parameter("bias", layer.bias)
            self.op = partial(
                F.conv3d if three_d else F.conv2d,
                stride=self.stride,
                padding=self.padding,
                dilation=self.dilation,
                groups=layer.groups,
            )
        elif isinstance(layer, MAX_POOLS):
            self.fill = -math.inf  # what max-pool's own padding is
            self.op = partial(
                F.max_pool3d if three_d else F.max_pool2d,
                kernel_size=self.kernel,
                stride=self.stride,
                padding=self.padding,
                dilation=self.dilation,
                ceil_mode=layer.ceil_mode,
            )
        else:
            self.op = partial(
                F.avg_pool3d if three_d else F.avg_pool2d,
                kernel_size=self.kernel,
                stride=self.stride,
                padding=self.padding,
                ceil_mode=layer.ceil_mode,
                count_include_pad=layer.count_include_pad,
                divisor_override=layer.divisor_override,
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.compute(fetch_window(x, self.plan, self.group, self.fill))

    def compute(self, window: Tensor) -> Tensor:
        """The layer on this rank's window: exactly this rank's rows of the whole layer's output."""
        return self.op(window, self.weight, self.bias) if self.weighted else self.op(window)

    def extra_repr(self) -> str:
        window = self.plan.window
        return f"{self.layer_name}, window rows [{window.start}, {window.stop}), halo rows {self.plan.halo_rows}"


def global_moments(
    x: Tensor, dims: tuple[int, ...], group: dist.ProcessGroup, parts: int, index: int
) -> tuple[Tensor, Tensor, int]:
    """Mean and biased variance over `dims` of the whole tensor whose dim-2 slabs the ranks hold (keepdim
    shapes), and the element count behind them. Each rank sends its slab's mean and centred sum of squares
    and every rank combines them (Chan et al.'s pairwise rule, exact for equal counts): one all-gather, and
    no cancellation as a sum-of-squares formula would have."""
    count = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdim=True)
    m2 = (x - mean).square().sum(dims, keepdim=True)
    stats = GatherStats.apply(torch.stack([mean, m2]), group, parts, index)
    means, m2s = stats[:, 0], stats[:, 1]
    total_mean = means.mean(0)
    total_m2 = m2s.sum(0) + count * (means - total_mean).square().sum(0)
    return total_mean, total_m2 / (count * parts), count * parts


def _channel_shape(x: Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


class SlabBatchNorm(nn.Module):
    """BatchNorm over the whole spatial extent: per-channel statistics from every rank's slab, running
    statistics updated as nn.BatchNorm updates them (unbiased variance over batch × whole extent)."""

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm, group: dist.ProcessGroup, parts: int, index: int):
        super().__init__()
        self.group, self.parts, self.index = group, parts, index
        self.eps, self.momentum = norm.eps, norm.momentum
        self.register_parameter("weight", norm.weight)
        self.register_parameter("bias", norm.bias)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(name, getattr(norm, name))
        self.train(norm.training)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training and self.running_mean is not None:  # running statistics: nothing to share
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        dims = (0, *range(2, x.dim()))
        mean, var, count = global_moments(x, dims, self.group, self.parts, self.index)
        if self.training and self.running_mean is not None:
            self._track(mean.detach().reshape(-1), var.detach().reshape(-1), count)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight.view(_channel_shape(x)) + self.bias.view(_channel_shape(x))
        return y

    @torch.no_grad()
    def _track(self, mean: Tensor, var: Tensor, count: int) -> None:
        factor = self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if factor is None:  # cumulative moving average, as nn.BatchNorm with momentum=None
                factor = 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(var * (count / max(count - 1, 1)), alpha=factor)


class SlabGroupNorm(nn.Module):
    """GroupNorm whose per-sample, per-group statistics span the whole spatial extent."""

    def __init__(self, norm: nn.GroupNorm, group: dist.ProcessGroup, parts: int, index: int) -> None:
        super().__init__()
        self.group, self.parts, self.index = group, parts, index
        self.num_groups, self.eps = norm.num_groups, norm.eps
        self.register_parameter("weight", norm.weight)
        self.register_parameter("bias", norm.bias)

    def forward(self, x: Tensor) -> Tensor:
        grouped = x.reshape(x.shape[0], self.num_groups, -1)
        mean, var, _ = global_moments(grouped, (2,), self.group, self.parts, self.index)
        y = ((grouped - mean) * torch.rsqrt(var + self.eps)).reshape(x.shape)
        if self.weight is not None:
            y = y * self.weight.view(_channel_shape(x)) + self.bias.view(_channel_shape(x))
        return y
