"""Tensor parallelism as its ranks run it: tensor, dp_tp (ddlbench.train.strategies.tensor). Filter, channel
and spatial parallelism, which split every layer and block on its collectives, are costed layer by layer
in ddlbench.analysis.analytic.layer_splits.

A replica of `split` ranks (consecutive ranks) runs on the replica's whole batch; replicas average their
gradients over the strided dp group. Per step, as implemented:
- tensor (Megatron, Shoeybi et al. 2019): in each transformer block the attention's q/k/v and the MLP's
  first Linear are split by columns, the output projections by rows, so a rank computes 1/t of the
  layers under `attn.` and `mlp.`; two all-reduces of the block's activation (batch × sequence × d_model
  × 4 B) forward and two backward, each blocking the next layer. Embeddings, norms and head replicated.
  dp_tp adds FSDP2 over the dp dimension: per block an all-gather of its (1/t) parameters before the
  forward and the backward, and a reduce-scatter of its gradients.
"""

from __future__ import annotations

from ddlbench.analysis.analytic.compute import BlockTimes, split_time_shares
from ddlbench.analysis.analytic.data_parallel import (
    StrategyRun,
    activation_terms,
)
from ddlbench.analysis.analytic.layout import Context
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, rank_memory
from ddlbench.analysis.analytic.simulate import Program
from ddlbench.catalog import MODELS

TENSOR_SPLIT = {"attn", "mlp"}


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
