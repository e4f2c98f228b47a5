"""Filter, channel and spatial parallelism layer by layer, as their ranks run them
(ddlbench.train.strategies.paradl, .spatial, .halo, .collectives), each layer costed at the shape a rank
really computes and each of its collectives, copies and exchanges counted where it is issued.

Why per layer: these strategies block on one collective per split layer (per norm and per halo too), so
a step is the sum of many small calls (gloo on a shared CPU: about a millisecond each, whatever the size,
ddlbench.train.calibration.kernels' busy mode), and a split layer's time does not fall with its FLOPs (half the
filters of a 16-channel convolution cost more than half the whole: ddlbench.analysis.analytic.operators).

Per step, on every rank of a group of p (rank 0 stands for all; they do the same work):
- filter, per split layer (Conv2d or Linear whose output channels divide by p): forward its 1/p of the
  output channels from the whole input, an all-gather of the slices (`dist.all_gather` into a list, the
  layer's whole output) and their concatenation (a copy of the output); backward a copy of its slice of
  the output gradient, the layer's backward at 1/p of the channels, a copy of the input gradient and
  its all-reduce (the input gradient, summed over the group);
- channel, per split layer: forward a copy of its 1/p of the input channels, the layer on them, a copy of
  the partial output and its all-reduce; backward the layer's backward and an all-gather of the input
  gradient's slices and their concatenation;
- spatial, in the region (the first blocks, on slabs of 1/p of the rows): each convolution with a window
  wider than one row (a 3×3) first swaps its halo rows with its neighbours (one batched send and receive
  per neighbour; a message of rows × columns × channels × batch), copies its window together (its rows,
  the halo and the padding), and computes on it; backward the layer's, a zeroed gradient slab and the
  window's gradient added into it, and the halo's gradient swapped back; each batch norm is the slab
  batch norm (statistics in plain tensor operations: the operator fits' slab_batch_norm2d) with an
  all-gather of its statistics forward and an all-reduce of their gradient backward; the slabs are
  all-gathered and concatenated before the first block after the region, whose backward copies this
  rank's rows of the gradient; after backward the region's gradients are copied into one flat tensor,
  all-reduced over all ranks, scaled and copied back, the tail's all-reduced over the dp group.
  Where the machine file has `spatial_layers` (a toy timed on slabs and alone on one slab,
  ddlbench.analysis.machine.spatial_layers), each 3×3-style convolution that exchanges a halo and the batch
  norm right after it are costed as the toy measured them: the layers' compute as on one slab (the norm a
  plain one), plus the calibrated cost per layer at its slab's bytes forward and backward, in place of the
  halo exchanges, window copies and norm collectives costed one by one (the twenty-second scoring set
  measured those at 0.30 of resnet56's step on 1×28²: gloo's small calls stall a clock tick a fifth of the
  time, and the slab machinery's own calls cost more than their bytes).
Replicas (dp_filter, dp_spatial) reduce gradients as splits.py describes. Every call costs what the
machine's collective fit says after the compute the rank did since its previous call (`after_s`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from ddlbench.analysis.analytic.compute import block_times, layer_costs
from ddlbench.analysis.analytic.data_parallel import (
    FIRST_BUCKET_BYTES,
    StrategyRun,
    activation_terms,
    copy_pass_s,
    plan_buckets,
)
from ddlbench.analysis.analytic.layout import Context, elements
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, rank_memory
from ddlbench.analysis.analytic.simulate import Program
from ddlbench.catalog.layer_table import predict_split_share
from ddlbench.catalog.model_table import LayerRow

NORM_TYPES = ("BatchNorm2d", "GroupNorm")
WINDOWED_TYPES = ("Conv2d", "MaxPool2d", "AvgPool2d", "Conv3d", "MaxPool3d")
SPLIT_CONVS = ("Conv2d", "Conv3d")


class Lane:
    """Rank 0's blocking sequence of compute and communication, and the compute since its last call."""

    def __init__(self, ctx: Context) -> None:
        self.ctx, self.program = ctx, Program()
        self.previous: int | None = None
        self.since_call = 0.0

    def compute(self, seconds: float, label: str) -> int:
        deps = [self.previous] if self.previous is not None else []
        self.previous = self.program.compute(0, seconds, deps=deps, label=label)
        self.since_call += seconds
        return self.previous

    def copy(self, values: float, label: str) -> int:
        return self.compute(copy_pass_s(self.ctx, values), label)

    def collective(self, op: str, nbytes: float, group: list[int], label: str) -> int:
        seconds = self.ctx.collective_s(op, nbytes, group, after_s=self.since_call)
        deps = [self.previous] if self.previous is not None else []
        self.previous = self.program.comm(0, seconds, deps=deps, label=label)
        self.since_call = 0.0
        return self.previous

    def calibrated(self, seconds: float, label: str) -> int:
        """A stretch timed whole (its calls, copies and waits): blocking, as a call is."""
        deps = [self.previous] if self.previous is not None else []
        self.previous = self.program.comm(0, seconds, deps=deps, label=label)
        self.since_call = 0.0
        return self.previous

    def exchange(self, nbytes: float, label: str) -> int:
        seconds = self.ctx.send_s(nbytes, 0, 1, after_s=self.since_call) if self.ctx.setting.split > 1 else 0.0
        deps = [self.previous] if self.previous is not None else []
        self.previous = self.program.comm(0, seconds, deps=deps, label=label)
        self.since_call = 0.0
        return self.previous


def _input_grad(layer: LayerRow) -> bool:
    """Whether backward computes the layer's input gradient: not for the model's first layer, whose input
    (the batch) needs none; the table's backward FLOPs then count the weights' gradient alone."""
    return layer.backward_flops >= 1.5 * layer.forward_flops if layer.forward_flops else True


def _costs(ctx: Context, rows: list[LayerRow]) -> list[tuple[float, float]]:
    s = ctx.setting
    return layer_costs(
        ctx.table, ctx.machine, rows, batch=s.batch_size, precision=s.precision, threads=s.threads, sharing=ctx.sharing
    )


def _split_row(layer: LayerRow, parts: int, kind: str) -> LayerRow:
    """The layer as one of `parts` ranks computes it: 1/p of its output channels (filter) or input
    channels (channel); its FLOPs and weights 1/p."""
    if kind == "filter":
        output = (layer.output_shape[0] // parts, *layer.output_shape[1:])
        if layer.type == "Linear":
            output = (*layer.output_shape[:-1], layer.output_shape[-1] // parts)
        return replace(
            layer,
            output_shape=output,
            weight_shape=(layer.weight_shape[0] // parts, *layer.weight_shape[1:]) if layer.weight_shape else (),
            forward_flops=layer.forward_flops // parts,
            backward_flops=layer.backward_flops // parts,
            params=layer.params // parts,
        )
    inputs = (layer.input_shape[0] // parts, *layer.input_shape[1:])
    if layer.type == "Linear":
        inputs = (*layer.input_shape[:-1], layer.input_shape[-1] // parts)
    weight = layer.weight_shape
    if len(weight) >= 2:
        weight = (weight[0], weight[1] // parts, *weight[2:])
    return replace(
        layer,
        input_shape=inputs,
        weight_shape=weight,
        forward_flops=layer.forward_flops // parts,
        backward_flops=layer.backward_flops // parts,
        params=layer.params // parts,
    )


def model_filter_channel_layers(ctx: Context, *, kind: str) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p, b = s.split, s.batch_size
    group, dp = ctx.inner_group(s.split), ctx.outer_group(s.replicas, s.split)
    share = predict_split_share(s.model, s.dataset, s.model_options, kind, p)
    names = set(share.names)
    rows = [_split_row(layer, p, kind) if layer.name in names else layer for layer in table.layers]
    costs = _costs(ctx, rows)
    lane = Lane(ctx)
    for layer, (forward, _) in zip(table.layers, costs, strict=True):
        if layer.name not in names:
            lane.compute(forward, f"F {layer.name}")
            continue
        out_values, in_values = elements(layer.output_shape) * b, elements(layer.input_shape) * b
        if kind == "filter":
            lane.compute(forward, f"F {layer.name} (1/{p} filters)")
            lane.collective("all_gather", out_values * FP32, group, f"all_gather {layer.name}")
            lane.copy(out_values, f"cat {layer.name}")
        else:
            lane.copy(in_values / p, f"slice {layer.name}")
            lane.compute(forward, f"F {layer.name} (1/{p} channels)")
            lane.copy(out_values, f"clone {layer.name}")
            lane.collective("all_reduce", out_values * FP32, group, f"all_reduce {layer.name}")
    lane.compute(ctx_loss_s(ctx), "loss")
    backward_op: dict[int, int] = {}
    for layer, (_, backward) in reversed(list(zip(table.layers, costs, strict=True))):
        if layer.name not in names:
            backward_op[layer.block] = lane.compute(backward, f"B {layer.name}")
            continue
        out_values, in_values = elements(layer.output_shape) * b, elements(layer.input_shape) * b
        # a layer whose input needs no gradient (the model's first) reduces or gathers none
        if kind == "filter":
            lane.copy(out_values / p, f"own slice of grad {layer.name}")
            backward_op[layer.block] = lane.compute(backward, f"B {layer.name}")
            if _input_grad(layer):
                lane.copy(in_values, f"clone grad {layer.name}")
                backward_op[layer.block] = lane.collective(
                    "all_reduce", in_values * FP32, group, f"all_reduce grad {layer.name}"
                )
        else:
            backward_op[layer.block] = lane.compute(backward, f"B {layer.name}")
            if _input_grad(layer):
                lane.collective("all_gather", in_values * FP32, group, f"all_gather grad {layer.name}")
                backward_op[layer.block] = lane.copy(in_values, f"cat grad {layer.name}")
    program = lane.program
    last = lane.previous
    reductions = []
    split_params = sum(layer.params for layer in table.layers if layer.name in names)
    local = (table.params - split_params + split_params / p) * FP32
    if len(dp) > 1:
        scale = local / max(1, table.param_bytes)
        for k, bucket in enumerate(plan_buckets(ctx, 25 * 2**20, first_cap_bytes=FIRST_BUCKET_BYTES)):
            reductions.append(
                program.comm(
                    0,
                    ctx.collective_s("all_reduce", bucket.bytes * scale, dp),
                    deps=(backward_op.get(bucket.ready_block, last),),
                    label=f"dp all_reduce {k}",
                    collective="all_reduce",
                )
            )
    program.compute(0, update_s(ctx) * local / FP32, deps=[last, *reductions], label="update")
    saved, grads, flowing = activation_terms(ctx, b)
    if kind == "channel":  # each split layer saves its slice of the input: a copy, beside the whole input
        for layer in table.layers:
            if layer.name in names:
                saved[layer.block] += elements(layer.input_shape) * b * FP32 / p
    block_scale = [1.0] * len(table.blocks)
    for layer in table.layers:
        if layer.name in names and table.blocks[layer.block].params:
            block_scale[layer.block] -= (layer.params - layer.params / p) / table.blocks[layer.block].params
    memory = rank_memory(
        params=local + table.buffer_bytes,
        grads=local,
        optimizer=MOMENTUM_STATES * local,
        buffers=local if len(dp) > 1 else 0,
        saved=saved,
        grad_per_block=[g * f for g, f in zip(grads, block_scale, strict=True)],
        flowing=flowing,
        detail=f"{share.split} of {share.of} layers split {p} ways "
        f"({share.flops_share:.0%} of the FLOPs); activations whole",
    )
    fwd_op, bwd_op = ("all_gather", "all_reduce") if kind == "filter" else ("all_reduce", "all_gather")
    what = f"{len(names)} split layers: {fwd_op} forward and {bwd_op} backward each, over {p} ranks, with their copies"
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


def ctx_loss_s(ctx: Context) -> float:
    """The loss's forward and backward at the replica's batch (ddlbench.analysis.analytic.compute)."""
    s = ctx.setting
    times = block_times(
        ctx.table, ctx.machine, batch=s.batch_size, precision=s.precision, threads=s.threads, sharing=ctx.sharing
    )
    return times.loss_s


def update_s(ctx: Context) -> float:
    """The optimizer's seconds per parameter element (ddlbench.analysis.analytic.compute)."""
    s = ctx.setting
    times = block_times(
        ctx.table, ctx.machine, batch=s.batch_size, precision=s.precision, threads=s.threads, sharing=ctx.sharing
    )
    return times.update_per_param_s


def window_rows(extent: int, parts: int, *, kernel: int, stride: int, padding: int, rank: int) -> tuple[int, int]:
    """(rows of the window rank `rank` computes its output slab from, halo rows it receives from other
    ranks) for a windowed layer along the split axis (the arithmetic of halo.halo_windows, per rank)."""
    window, received, _ = _window(extent, parts, kernel=kernel, stride=stride, padding=padding, rank=rank)
    return window, received


def _window(extent: int, parts: int, *, kernel: int, stride: int, padding: int, rank: int) -> tuple[int, int, int]:
    """(window rows, rows received, rows sent) of rank `rank`: it sends the rows of its slab that other
    ranks' windows read."""

    def span(r: int) -> tuple[int, int]:
        out_slab = ((extent + 2 * padding - kernel) // stride + 1) // parts
        start = r * out_slab * stride - padding
        return start, ((r + 1) * out_slab - 1) * stride - padding + kernel

    def overlap(start: int, stop: int, owner: int) -> int:
        slab = extent // parts
        return max(0, min(stop, (owner + 1) * slab) - max(start, owner * slab))

    start, stop = span(rank)
    received = sum(overlap(start, stop, owner) for owner in range(parts) if owner != rank)
    sent = sum(overlap(*span(other), rank) for other in range(parts) if other != rank)
    return stop - start, received, sent


def _slab_rows(table_layers: list[LayerRow], region: int, parts: int) -> tuple[list[LayerRow], dict[str, tuple]]:
    """The region's layers as rank 0 runs them (rows of its slab or window), and per windowed layer whose
    window is not its slab: (window rows, rows exchanged, its input's elements per row, whether the
    window is a copy). Rows are the split axis, dim 2 of the tensor (halo.py): an image's height, a
    volume's depth (C, D, H, W: a row is H × W per channel)."""
    rows, windows = [], {}
    for layer in table_layers:
        if layer.block >= region or len(layer.input_shape) not in (3, 4):
            rows.append(layer)
            continue
        c_in, h_in, *across_in = layer.input_shape
        sliced = len(layer.output_shape) == len(layer.input_shape)  # not a flatten or a head's vector
        c_out, h_out = layer.output_shape[:2] if sliced else (0, 1)
        input_rows, out_rows = h_in // parts, max(1, h_out // parts)
        if layer.type in WINDOWED_TYPES:
            conv = layer.type in SPLIT_CONVS
            kernel = layer.weight_shape[-1] if conv else (layer.kernel_size or (2,))[0]
            stride = max(1, round(h_in / max(1, h_out)))
            padding = kernel // 2 if conv else 0
            window, received, sent = _window(h_in, parts, kernel=kernel, stride=stride, padding=padding, rank=0)
            if window != input_rows or received or sent:
                # a rank that sends or receives rows exchanges them (halo.HaloExchange): its message is
                # the larger of the two; it assembles a window (a copy) when it received rows or pads
                # the edge, else computes on a view of its slab (halo.fetch_window)
                copies = bool(received or padding)
                windows[layer.name] = (window, max(received, sent), c_in * math.prod(across_in), copies)
            input_rows = window
        kind = "SlabBatchNorm2d" if layer.type == "BatchNorm2d" else layer.type
        rows.append(
            replace(
                layer,
                type=kind,
                input_shape=(c_in, input_rows, *across_in),
                output_shape=(c_out, out_rows, *layer.output_shape[2:]) if sliced else layer.output_shape,
                forward_flops=layer.forward_flops // parts,
                backward_flops=layer.backward_flops // parts,
            )
        )
    return rows, windows


def _paired_norms(layers: list[LayerRow], region: int, windows: dict[str, tuple]) -> dict[str, str]:
    """{windowed convolution: the batch norm right after it} for each convolution in the region that exchanges
    a halo and is followed by a batch norm: the unit the machine's spatial_layers toy times whole."""
    pairs = {}
    for layer, after in itertools.pairwise(layers):
        if (
            layer.block < region
            and layer.type == "Conv2d"
            and layer.name in windows
            and windows[layer.name][1]
            and after.type == "BatchNorm2d"
            and after.block < region
        ):
            pairs[layer.name] = after.name
    return pairs


def _slab_bytes(layer: LayerRow, parts: int, batch: int) -> float:
    """One rank's input slab of `layer`, float32: what the spatial_layers fit reads."""
    c_in, h_in, w_in = layer.input_shape
    return c_in * (h_in // parts) * w_in * batch * FP32


def model_spatial_layers(ctx: Context) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p, b = s.split, s.batch_size
    group, dp = ctx.inner_group(s.split), ctx.outer_group(s.replicas, s.split)
    share = predict_split_share(s.model, s.dataset, s.model_options, "spatial", p)
    region = share.split
    rows, windows = _slab_rows(list(table.layers), region, p)
    timed = ctx.machine.spatial_layers_for(ranks=p, nodes=ctx.nodes_spanned(group)) if p > 1 else None
    # a windowed convolution with a halo and the batch norm right after it: timed whole where the machine has
    # spatial_layers (their exchanges, copies, norm collectives and waits), its norm then a plain one's compute
    paired = _paired_norms(table.layers, region, windows) if timed is not None else {}
    named = {layer.name: layer for layer in table.layers}
    conv_before = {norm: named[conv] for conv, norm in paired.items()}  # the paired norms, each to its conv
    rows = [replace(row, type="BatchNorm2d") if row.name in conv_before else row for row in rows]
    note = f"spatial's halo layers timed whole ({timed.point_id}, p={timed.ranks})" if timed is not None else None
    if note is not None and note not in ctx.notes:
        ctx.notes.append(note)
    costs = _costs(ctx, rows)
    lane = Lane(ctx)
    norms = 0
    for index, (layer, row, (forward, _)) in enumerate(zip(table.layers, rows, costs, strict=True)):
        if region and layer.block == region and (index == 0 or table.layers[index - 1].block < region):
            whole = elements(table.blocks[region - 1].output_shape) * b
            lane.collective("all_gather", whole * FP32, group, "gather slabs")
            lane.copy(whole, "cat slabs")
        if layer.name in windows and layer.name not in paired:
            window, halo, per_row, copies = windows[layer.name]
            if halo:
                lane.exchange(halo * per_row * b * FP32, f"halo {layer.name}")
            if copies:
                lane.copy(window * per_row * b, f"window {layer.name}")
        lane.compute(forward, f"F {row.name}")
        if layer.block < region and layer.type in NORM_TYPES:
            norms += 1
            if layer.name not in conv_before:
                lane.collective("all_gather", 2 * layer.input_shape[0] * FP32, group, f"norm stats {layer.name}")
        if (conv := conv_before.get(layer.name)) is not None:
            lane.calibrated(timed.forward_s(_slab_bytes(conv, p, b)), f"halo layer {conv.name} (timed)")
    if region == len(table.blocks):
        whole = elements(table.blocks[-1].output_shape) * b
        lane.collective("all_gather", whole * FP32, group, "gather slabs")
        lane.copy(whole, "cat slabs")
    lane.compute(ctx_loss_s(ctx), "loss")
    for index in reversed(range(len(rows))):
        layer, row, (_, backward) = table.layers[index], rows[index], costs[index]
        lane.compute(backward, f"B {row.name}")
        if layer.block < region and layer.type in NORM_TYPES and layer.name not in conv_before:
            lane.collective("all_reduce", p * 2 * layer.input_shape[0] * FP32, group, f"norm stats grad {layer.name}")
        if layer.name in paired:
            lane.calibrated(timed.backward_s(_slab_bytes(layer, p, b)), f"halo layer grad {layer.name} (timed)")
        elif layer.name in windows and _input_grad(layer) and windows[layer.name][1]:
            # halo.HaloExchange.backward: a zeroed gradient slab, the window's gradient added, the halo's
            # gradient swapped back (a window without a message is a cat, whose backward is views)
            _, halo, per_row, _ = windows[layer.name]
            slab = layer.input_shape[1] // p  # this rank's own rows: zeroed, then the window's gradient added
            lane.copy(2 * slab * per_row * b, f"window grad into slab {layer.name}")
            if halo:
                lane.exchange(halo * per_row * b * FP32, f"halo grad {layer.name}")
        if region and layer.block == region and (index == 0 or table.layers[index - 1].block < region):
            lane.copy(elements(table.blocks[region - 1].output_shape) * b / p, "own rows of the gradient")
    region_params = sum(table.blocks[i].params for i in range(region))
    tail_bytes = table.param_bytes - region_params * FP32
    lane.copy(region_params, "flatten region gradients")
    lane.collective("all_reduce", region_params * FP32, list(range(s.world_size)), "region gradients")
    lane.copy(2 * region_params, "scale and copy back")
    if len(dp) > 1:
        lane.collective("all_reduce", tail_bytes, dp, "tail gradients")
    lane.compute(update_s(ctx) * table.params, "update")
    scale = [1.0 / p if i < region else 1.0 for i in range(len(table.blocks))]
    saved, grads, flowing = activation_terms(ctx, b, scale=scale)
    # what the slab versions keep beyond the table's layers (halo.py): a slab batch norm, in plain tensor
    # operations, saves x − mean twice (for the square and for the scaling) and the normalised x (for the
    # affine product) where a fused one saves its input once: two more slabs; a windowed convolution
    # saves the window it assembled (a new tensor, not the previous layer's output)
    for layer, row in zip(table.layers, rows, strict=True):
        if layer.block < region and layer.type == "BatchNorm2d":
            saved[layer.block] += 2 * elements(row.input_shape) * b * FP32
        if layer.name in windows and layer.type in SPLIT_CONVS and windows[layer.name][3]:
            saved[layer.block] += elements(row.input_shape) * b * FP32
    memory = rank_memory(
        params=table.param_bytes + table.buffer_bytes,
        grads=table.param_bytes,
        optimizer=MOMENTUM_STATES * table.param_bytes,
        buffers=0,
        saved=saved,
        grad_per_block=grads,
        flowing=[f * sc for f, sc in zip(flowing, scale, strict=True)],
        # the flat copy of the region's gradients while they are reduced: after the walk, the activations gone
        after_backward=region_params * FP32,
        detail=f"{region} of {len(table.blocks)} blocks on slabs of 1/{p} ({share.flops_share:.0%} of the FLOPs); "
        f"{share.detail}",
    )
    halos = sum(1 for window in windows.values() if window[1])
    what = (
        f"{halos} halo exchanges and {norms} norm-statistics collectives each way, "
        "a slab gather, gradient all-reduces, with their copies"
    )
    return StrategyRun(timeline=ctx.simulate(lane.program), memory=memory, comm=what)
