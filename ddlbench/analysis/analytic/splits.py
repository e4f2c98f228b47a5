"""Strategies that split every layer or activation of a replica: tensor, dp_tp, filter, channel, spatial,
dp_filter, dp_spatial — as the ranks run them (ddlbench.train.strategies: tensor.py, paradl.py, spatial.py).

A replica of `split` ranks (consecutive ranks) runs on the replica's whole batch; replicas average their
gradients over the strided dp group. Per step, as implemented:
- tensor (Megatron, Shoeybi et al. 2019): in each transformer block the attention's q/k/v and the MLP's
  first Linear are split by columns, the output projections by rows, so a rank computes 1/t of the
  layers under `attn.` and `mlp.`; two all-reduces of the block's activation (batch × sequence × d_model
  × 4 B) forward and two backward, each blocking the next layer. Embeddings, norms and head replicated.
  dp_tp adds FSDP2 over the dp dimension: per block an all-gather of its (1/t) parameters before the
  forward and the backward, and a reduce-scatter of its gradients.
- filter (ParaDL): a split layer computes 1/p of its output channels from the whole input; its output
  is all-gathered forward (the layer's output × batch × 4 B), its input gradient all-reduced backward.
- channel: a split layer computes from 1/p of its input channels; the partial outputs are all-reduced
  forward; its input gradient all-gathered backward. Split layers: ddlbench.catalog.layer_table's
  predict_split_share (the strategies' own rules). dp_filter: DDP buckets over the dp group.
- spatial: the first `children` blocks run on slabs of 1/p rows (compute and activations 1/p); every
  split convolution exchanges (K−1)/2 halo rows with each neighbour, forward and backward; every norm of
  the region all-gathers its statistics forward and all-reduces them backward; the slabs are gathered
  (all-gather of the region's output) before the first replicated block; after backward the region's
  weight gradients are all-reduced over all ranks in one flat tensor, the tail's over the dp group.
"""

from __future__ import annotations

from ddlbench.analysis.analytic.compute import BlockTimes, split_time_shares
from ddlbench.analysis.analytic.data_parallel import (
    FIRST_BUCKET_BYTES,
    StrategyRun,
    activation_terms,
    plan_buckets,
)
from ddlbench.analysis.analytic.layout import Context, elements
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, rank_memory
from ddlbench.analysis.analytic.simulate import Program
from ddlbench.catalog import MODELS
from ddlbench.catalog.layer_table import predict_split_share

TENSOR_SPLIT = {"attn", "mlp"}
NORM_TYPES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm")


def _groups(ctx: Context) -> tuple[list[int], list[int]]:
    """Rank 0's replica group (consecutive) and dp group (strided)."""
    s = ctx.setting
    return ctx.inner_group(s.split), ctx.outer_group(s.replicas, s.split)


def block_scale(ctx: Context, split_layers: set[str], parts: int) -> list[float]:
    """Share of each block's work one of `parts` ranks does when `split_layers` are cut: 1 − s + s/p with
    s the share of the block's time in those layers (ddlbench.analysis.analytic.compute.split_time_shares)."""
    s = ctx.setting
    shares = split_time_shares(
        ctx.table, ctx.machine, split_layers, batch=s.batch_size, precision=s.precision, threads=s.threads
    )
    return [1.0 - share + share / parts for share in shares]


def model_tensor(ctx: Context, times_for) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    t = s.split  # the Setting's split is Point's: the world size for a model cut over every rank
    group, dp = _groups(ctx)
    # the attention (its heads) and the MLP, with their Linears: what a tensor-parallel rank computes 1/t of
    split = {layer.name for layer in table.layers if TENSOR_SPLIT & set(layer.name.split(".")[1:])}
    scale = block_scale(ctx, split, t)
    times: BlockTimes = times_for(scale)
    d_model = int(dict(MODELS.get(s.model).shape).get("d_model", 0))
    activation = s.batch_size * table.sample_shape[0] * d_model * FP32
    transformer = sorted({layer.block for layer in table.layers if layer.name in split})
    params = [b.params for b in table.blocks]
    local_params = [p * scale[i] for i, p in enumerate(params)]
    program = Program()
    n = len(table.blocks)
    fsdp = len(dp) > 1
    previous = None
    for i in range(n):
        deps = [previous] if previous is not None else []
        if fsdp and params[i]:
            deps.append(
                program.comm(
                    0,
                    ctx.collective_s("all_gather", local_params[i] * FP32, dp),
                    deps=deps[:1],
                    label=f"dp all_gather F{i}",
                )
            )
        previous = program.compute(0, times.forward_s[i], deps=deps, label=f"F{i}")
        if i in transformer:
            for k in range(2):
                previous = program.comm(
                    0,
                    ctx.collective_s("all_reduce", activation, group),
                    deps=(previous,),
                    label=f"tp all_reduce F{i}.{k}",
                )
    previous = program.compute(0, times.loss_s, deps=(previous,), label="loss")
    scatters = []
    for i in reversed(range(n)):
        deps = [previous]
        if fsdp and params[i] and i < n - 1:
            deps.append(
                program.comm(0, ctx.collective_s("all_gather", local_params[i] * FP32, dp), label=f"dp all_gather B{i}")
            )
        previous = program.compute(0, times.backward_s[i], deps=deps, label=f"B{i}")
        if i in transformer:
            for k in range(2):
                previous = program.comm(
                    0,
                    ctx.collective_s("all_reduce", activation, group),
                    deps=(previous,),
                    label=f"tp all_reduce B{i}.{k}",
                )
        if fsdp and params[i]:
            scatters.append(
                program.comm(
                    0,
                    ctx.collective_s("reduce_scatter", local_params[i] * FP32, dp),
                    deps=(previous,),
                    label=f"dp reduce_scatter {i}",
                )
            )
    shard = len(dp) if fsdp else 1
    mine = sum(local_params) * FP32 / shard
    program.compute(0, times.update_per_param_s * sum(local_params) / shard, deps=[previous, *scatters], label="update")
    saved, grads, flowing = activation_terms(ctx, s.batch_size, scale=scale)
    memory = rank_memory(
        params=mine + table.buffer_bytes,
        grads=mine,
        optimizer=MOMENTUM_STATES * mine,
        buffers=0,
        saved=saved,
        grad_per_block=[g * f / shard for g, f in zip(grads, scale, strict=True)],
        flowing=flowing,
        extra_peak=(2 * max(local_params, default=0) * FP32) if fsdp else 0.0,
        detail=f"attention and MLP split {t} ways" + (f", sharded over {len(dp)} replicas (FSDP2)" if fsdp else ""),
    )
    what = f"{4 * len(transformer)} all-reduces of {activation / 1e6:.3g} MB over {t} ranks"
    if fsdp:
        what += f"; per block all-gathers and reduce-scatters over {len(dp)} replicas"
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


def model_filter_channel(ctx: Context, times_for, *, kind: str) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p = s.split
    group, dp = _groups(ctx)
    share = predict_split_share(s.model, s.dataset, s.model_options, kind, p)
    names = set(share.names)
    scale = block_scale(ctx, names, p)
    times: BlockTimes = times_for(scale)
    per_block: dict[int, list] = {}
    for layer in table.layers:
        if layer.name in names:
            per_block.setdefault(layer.block, []).append(layer)
    program = Program()
    n = len(table.blocks)
    forward_op, backward_op = {}, {}
    previous = None
    b = s.batch_size
    fwd_op, bwd_op = ("all_gather", "all_reduce") if kind == "filter" else ("all_reduce", "all_gather")
    for i in range(n):
        previous = forward_op[i] = program.compute(
            0, times.forward_s[i], deps=[previous] if previous is not None else [], label=f"F{i}"
        )
        for layer in per_block.get(i, []):
            previous = program.comm(
                0,
                ctx.collective_s(fwd_op, elements(layer.output_shape) * b * FP32, group),
                deps=(previous,),
                label=f"{fwd_op} {layer.name}",
            )
    previous = program.compute(0, times.loss_s, deps=(previous,), label="loss")
    for i in reversed(range(n)):
        previous = backward_op[i] = program.compute(0, times.backward_s[i], deps=(previous,), label=f"B{i}")
        for layer in per_block.get(i, []):
            previous = program.comm(
                0,
                ctx.collective_s(bwd_op, elements(layer.input_shape) * b * FP32, group),
                deps=(previous,),
                label=f"{bwd_op} grad {layer.name}",
            )
            backward_op[i] = previous
    reductions = []
    if len(dp) > 1:
        for k, bucket in enumerate(plan_buckets(ctx, 25 * 2**20, first_cap_bytes=FIRST_BUCKET_BYTES)):
            nbytes = bucket.bytes * (scale[bucket.ready_block] if bucket.ready_block in per_block else 1.0)
            reductions.append(
                program.comm(
                    0,
                    ctx.collective_s("all_reduce", nbytes, dp),
                    deps=(backward_op[bucket.ready_block],),
                    label=f"dp all_reduce {k}",
                )
            )
    split_params = sum(layer.params for layer in table.layers if layer.name in names)
    local = (table.params - split_params + split_params / p) * FP32
    program.compute(0, times.update_per_param_s * local / FP32, deps=[previous, *reductions], label="update")
    saved, grads, flowing = activation_terms(ctx, b)
    if kind == "channel":  # each split layer saves its slice of the input: a copy, beside the whole input
        for layer in table.layers:
            if layer.name in names:
                saved[layer.block] += elements(layer.input_shape) * b * FP32 / p
    memory = rank_memory(
        params=local + table.buffer_bytes,
        grads=local,
        optimizer=MOMENTUM_STATES * local,
        buffers=local if len(dp) > 1 else 0,
        saved=saved,
        grad_per_block=[g * f for g, f in zip(grads, scale, strict=True)],
        flowing=flowing,
        detail=f"{share.split} of {share.of} layers split {p} ways "
        f"({share.flops_share:.0%} of the FLOPs); activations whole",
    )
    what = f"{len(names)} split layers: {fwd_op} forward and {bwd_op} backward each, over {p} ranks"
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


def model_spatial(ctx: Context, times_for) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p = s.split
    group, dp = _groups(ctx)
    share = predict_split_share(s.model, s.dataset, s.model_options, "spatial", p)
    region = share.split  # the first `region` blocks run on slabs
    scale = [1.0 / p if i < region else 1.0 for i in range(len(table.blocks))]
    times: BlockTimes = times_for(scale)
    b = s.batch_size
    halos: dict[int, list[float]] = {}
    norms: dict[int, list[float]] = {}
    for layer in table.layers:
        if layer.block >= region:
            continue
        if layer.type.startswith("Conv") and len(layer.weight_shape) >= 3 and layer.weight_shape[-1] > 1:
            rows = (layer.weight_shape[-1] - 1) // 2
            row_elements = elements(layer.input_shape) // max(1, layer.input_shape[1])  # C × W (× D)
            halos.setdefault(layer.block, []).append(rows * row_elements * b * FP32)
        if layer.type in NORM_TYPES:
            norms.setdefault(layer.block, []).append(2 * layer.input_shape[0] * FP32)
    program = Program()
    n = len(table.blocks)
    previous = None
    for i in range(n):
        deps = [previous] if previous is not None else []
        if i == region and region:
            gather_bytes = elements(table.blocks[region - 1].output_shape) * b * FP32
            previous = program.comm(
                0, ctx.collective_s("all_gather", gather_bytes, group), deps=deps, label="gather slabs"
            )
            deps = [previous]
        previous = program.compute(0, times.forward_s[i], deps=deps, label=f"F{i}")
        for nbytes in halos.get(i, []):
            previous = program.comm(
                0, ctx.send_s(nbytes, 0, 1 if p > 1 else 0) if p > 1 else 0.0, deps=(previous,), label=f"halo F{i}"
            )
        for nbytes in norms.get(i, []):
            previous = program.comm(
                0, ctx.collective_s("all_gather", nbytes, group), deps=(previous,), label=f"norm stats F{i}"
            )
    previous = program.compute(0, times.loss_s, deps=(previous,), label="loss")
    for i in reversed(range(n)):
        previous = program.compute(0, times.backward_s[i], deps=(previous,), label=f"B{i}")
        for nbytes in halos.get(i, []):
            previous = program.comm(0, ctx.send_s(nbytes, 0, 1) if p > 1 else 0.0, deps=(previous,), label=f"halo B{i}")
        for nbytes in norms.get(i, []):
            previous = program.comm(
                0, ctx.collective_s("all_reduce", nbytes, group), deps=(previous,), label=f"norm stats B{i}"
            )
    region_bytes = sum(table.blocks[i].params for i in range(region)) * FP32
    tail_bytes = table.param_bytes - region_bytes
    everyone = list(range(s.world_size))
    last = program.comm(
        0, ctx.collective_s("all_reduce", region_bytes, everyone), deps=(previous,), label="region gradients"
    )
    deps = [previous, last]
    if len(dp) > 1:
        deps.append(
            program.comm(0, ctx.collective_s("all_reduce", tail_bytes, dp), deps=(last,), label="tail gradients")
        )
    program.compute(0, times.update_per_param_s * table.params, deps=deps, label="update")
    saved, grads, flowing = activation_terms(ctx, b, scale=scale)
    memory = rank_memory(
        params=table.param_bytes + table.buffer_bytes,
        grads=table.param_bytes,
        optimizer=MOMENTUM_STATES * table.param_bytes,
        buffers=0,
        saved=saved,
        grad_per_block=grads,
        flowing=[f * sc for f, sc in zip(flowing, scale, strict=True)],
        extra_peak=region_bytes,  # the flat copy of the region's gradients while they are reduced
        detail=f"{region} of {n} blocks on slabs of 1/{p} ({share.flops_share:.0%} of the FLOPs); {share.detail}",
    )
    what = (
        f"{sum(len(v) for v in halos.values())} halo exchanges and "
        f"{sum(len(v) for v in norms.values())} norm-statistics "
        f"collectives each way, a slab gather, gradient all-reduces"
    )
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)
