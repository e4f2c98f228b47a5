"""Tensor parallelism as its ranks run it: tensor, dp_tp (ddlbench.train.strategies.tensor). Filter, channel
and spatial parallelism, which split every layer and block on its collectives, are costed layer by layer
in ddlbench.analysis.analytic.layer_splits.

A replica of `split` ranks (consecutive ranks) runs on the replica's whole batch; replicas average their
gradients over the strided dp group. Per step, as implemented:
- tensor (Megatron, Shoeybi et al. 2019): in each transformer block the attention's q/k/v and the MLP's
  first Linear are split by columns, the output projections by rows, so a rank computes 1/t of the
  layers under `attn.` and `mlp.`; two all-reduces of the block's activation (batch × sequence × d_model
  × 4 B) forward and two backward, each blocking the next layer. Embeddings, norms and head replicated.
  With operator fits each layer is costed at the shape the rank holds (tensor_parallel_rows), the sharded
  Linears as DTensor calls: DTensor dispatches every call of a sharded module in Python (its sharding
  propagation, the redistribution of its input and output), which cost 220-640 µs a call on a 2-core CPU
  where a plain Linear's call costs 7-22 µs (2026-12-01), so a small model's tensor parallelism is that
  dispatch more than its arithmetic; the optimizer pays a dispatch per DTensor parameter too.
  dp_tp adds FSDP2 over the dp dimension: per block an all-gather of its (1/t) parameters before the
  forward and the backward, and a reduce-scatter of its gradients.
"""

from __future__ import annotations

from dataclasses import replace

from ddlbench.analysis.analytic.compute import BlockTimes, block_times, split_time_shares
from ddlbench.analysis.analytic.data_parallel import (
    StrategyRun,
    activation_terms,
)
from ddlbench.analysis.analytic.layout import Context, layer_tensors
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, rank_memory
from ddlbench.analysis.analytic.operators import TENSOR_PARALLEL_KINDS
from ddlbench.analysis.analytic.simulate import Program
from ddlbench.catalog import MODELS
from ddlbench.catalog.model_table import LayerRow

TENSOR_SPLIT = {"attn", "mlp"}
# the Linears a block shards, by their name inside the block (ddlbench.train.strategies.tensor's plan)
COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc")
ROWWISE = ("attn.out", "mlp.proj")


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
    rows = tensor_parallel_rows(ctx, split, t)
    if rows is None:  # no operator fits: each block's time scaled by the share a rank computes
        times: BlockTimes = times_for(scale)
    else:  # each layer at the shape a rank holds, its sharded Linears as DTensor calls
        times = block_times(
            table, ctx.machine, batch=s.batch_size, precision=s.precision, threads=s.threads, sharing=ctx.sharing,
            layers=rows,
        )  # fmt: skip
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
                    collective="all_gather",
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
                    collective="all_reduce",
                )
    previous = program.compute(0, times.loss_s, deps=(previous,), label="loss")
    scatters = []
    for i in reversed(range(n)):
        deps = [previous]
        if fsdp and params[i] and i < n - 1:
            deps.append(
                program.comm(
                    0,
                    ctx.collective_s("all_gather", local_params[i] * FP32, dp),
                    label=f"dp all_gather B{i}",
                    collective="all_gather",
                )
            )
        previous = program.compute(0, times.backward_s[i], deps=deps, label=f"B{i}")
        if i in transformer:
            for k in range(2):
                previous = program.comm(
                    0,
                    ctx.collective_s("all_reduce", activation, group),
                    deps=(previous,),
                    label=f"tp all_reduce B{i}.{k}",
                    collective="all_reduce",
                )
        if fsdp and params[i]:
            scatters.append(
                program.comm(
                    0,
                    ctx.collective_s("reduce_scatter", local_params[i] * FP32, dp),
                    deps=(previous,),
                    label=f"dp reduce_scatter {i}",
                    collective="reduce_scatter",
                )
            )
    shard = len(dp) if fsdp else 1
    mine = sum(local_params) * FP32 / shard
    update = times.update_per_param_s * sum(local_params) / shard + dtensor_update_s(ctx, everything=fsdp)
    program.compute(0, update, deps=[previous, *scatters], label="update")
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


def dtensor_update_s(ctx: Context, *, everything: bool) -> float:
    """What the optimizer's step pays beyond its arithmetic for parameters that are DTensors: a dispatch per
    tensor per step (the machine's fsdp_units update cost per tensor: FSDP2 steps over DTensor shards, with
    no collective, as a tensor-parallel rank does), over the sharded Linears' weights and biases, or over
    every parameter (`everything`: dp_tp's FSDP2 makes them all DTensors). 0 where the machine has none."""
    units = ctx.machine.fsdp_units_for(ranks=1, nodes=1) or next(iter(ctx.machine.fsdp_units), None)
    if units is None:
        return 0.0
    sharded = COLWISE + ROWWISE
    tensors = sum(
        layer_tensors(layer)
        for layer in ctx.table.layers
        if everything or (layer.type == "Linear" and layer.name.split(".", 1)[-1] in sharded)
    )
    return units.update_per_tensor_s * tensors


def tensor_parallel_rows(ctx: Context, split: set[str], parts: int) -> list[LayerRow] | None:
    """The model's layers as one of `parts` tensor-parallel ranks runs them, for the operator fits (None
    where the machine has none): a column-wise Linear holds 1/p of the output features, a row-wise one 1/p
    of the input features, both costed as DTensor calls (the operator kinds tp_colwise_linear and
    tp_rowwise_linear: a Linear sharded on a one-rank mesh, DTensor's dispatch without a peer) where the
    calibration timed them, as plain Linears otherwise; the attention runs 1/p of the heads and the MLP's
    activation 1/p of the hidden features; the rest (embeddings, norms, head) whole."""
    s = ctx.setting
    operators = ctx.machine.operator_model_for(s.precision, s.threads, sharing=ctx.sharing)
    if operators is None:
        return None
    dtensor = all((kind, d) in operators.fits for kind in TENSOR_PARALLEL_KINDS for d in ("forward", "backward"))
    rows = []
    for layer in ctx.table.layers:
        if layer.name not in split:
            rows.append(layer)
            continue
        inner = layer.name.split(".", 1)[1]
        linear = layer.type == "Linear"
        if linear and inner in COLWISE:  # 1/p of the output features: the weight's rows
            kind, cut_in, cut_out = "TpColwiseLinear", False, True
            weight = (layer.weight_shape[0] // parts, *layer.weight_shape[1:])
        elif linear and inner in ROWWISE:  # 1/p of the input features: the weight's columns
            kind, cut_in, cut_out = "TpRowwiseLinear", True, False
            weight = (layer.weight_shape[0], *(w // parts for w in layer.weight_shape[1:]))
        else:  # the attention between the projections, the MLP's activation: on the rank's features
            kind, cut_in, cut_out, weight = layer.type, True, True, layer.weight_shape
        rows.append(
            replace(
                layer,
                type=kind if dtensor or not linear else "Linear",
                input_shape=_last_cut(layer.input_shape, parts) if cut_in else layer.input_shape,
                output_shape=_last_cut(layer.output_shape, parts) if cut_out else layer.output_shape,
                weight_shape=weight,
                forward_flops=layer.forward_flops // parts,
                backward_flops=layer.backward_flops // parts,
                params=layer.params // parts,
            )
        )
    return rows


def _last_cut(shape: tuple[int, ...], parts: int) -> tuple[int, ...]:
    """`shape` with its last dimension (the features) cut into `parts`."""
    return (*shape[:-1], shape[-1] // parts)
