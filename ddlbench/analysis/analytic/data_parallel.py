"""Data-parallel strategies as the ranks run them: ddp, horovod, zero2, fsdp.

Every rank runs the whole model on its own batch (the point's batch_size) and all ranks do the same, so
rank 0 stands for all. What each issues per step, as implemented (ddlbench.train.strategies):
- ddp: torch DDP. A broadcast of the model's buffers (BatchNorm statistics) before every forward
  (broadcast_buffers, on by default); gradients all-reduced in buckets during backward: buckets are
  filled in reverse parameter order, the first capped at 1 MiB (torch's _DEFAULT_FIRST_BUCKET_BYTES),
  the rest at `bucket_cap_mb`; a bucket is issued when the backward of the block holding its last
  parameter ends. The reducer (gradient_as_bucket_view off, torch's default) copies each gradient into its
  bucket as it is ready and back once reduced: two passes over the parameters, each at least at the memory
  bandwidth (`copy_pass_s`); gloo's all-reduce on a group of one returns at once (0.3 ms for 400 MiB). The
  update waits for every bucket.
- horovod: DistributedOptimizer: each gradient is submitted when ready; Horovod's background thread
  fuses what is ready into one all-reduce up to `fusion_threshold_mb`; backward blocks take far longer
  than its cycle, so a fused all-reduce per block. synchronize() before the update.
- zero2: buckets (no small first one) reduce-scattered during backward; each rank updates 1/p of the
  parameters; then every bucket's shard is all-gathered back into the flat parameters before the step ends.
  Its own buffers cost passes over the parameters and memory mapped anew every step (zero2_buffers_s):
  zero-filled bucket buffers the gradients are copied into and divided in, the shards and their clones,
  and on one rank gloo's copies; on one 2-core rank vgg11's zero2 step measured 1.3× ddp's, gpt_medium's
  1.9× (2026-12-01), where the model had them equal.
- fsdp: FSDP2 fully_shard per block: before each block's forward its parameters are all-gathered (on gloo
  the all-gather is issued at the block's pre-forward, so nothing hides it); in backward the next block's
  all-gather is prefetched while the current one runs, and each block's gradients are reduce-scattered
  as soon as its backward ends. Update of 1/p of the parameters. Beyond its collectives FSDP2 costs the
  rank's thread time per unit (hooks, copies into and out of the flat buffer, async calls waited for at
  once) and the optimizer DTensor dispatch per tensor: where the machine file has `fsdp_units` (a toy timed
  sharded and unsharded) that remainder is added per block, else the model says it is left out. On a
  2-core host it was most of fsdp's cost: resnet8 at batch 16 measured ×1.6 of ddp where the collectives
  alone predicted ×1.2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ddlbench.analysis.analytic.compute import MAPPED_ANEW_BYTES, BlockTimes, elementwise_s, mapped_anew_bytes
from ddlbench.analysis.analytic.layout import Context, block_params, block_tensors, elements
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, BucketMoments, RankMemory, rank_memory
from ddlbench.analysis.analytic.simulate import Program, Timeline

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True, kw_only=True)
class StrategyRun:
    """A strategy model's answer: the step's timeline, the busiest rank's memory, what it communicates."""

    timeline: Timeline
    memory: RankMemory
    comm: str  # the collectives of one step, in words


@dataclass(frozen=True, kw_only=True)
class Bucket:
    bytes: int
    ready_block: int  # the block whose backward completes it


def plan_buckets(ctx: Context, cap_bytes: float, *, first_cap_bytes: float | None = None) -> list[Bucket]:
    """Gradient buckets in reverse parameter order (layer by layer, from the table)."""
    buckets: list[Bucket] = []
    size, cap = 0, first_cap_bytes or cap_bytes
    block = -1
    for layer in reversed(ctx.table.layers):
        if not layer.params:
            continue
        size += layer.params * FP32
        block = layer.block
        if size >= cap:
            buckets.append(Bucket(bytes=size, ready_block=block))
            size, cap = 0, cap_bytes
    if size:
        buckets.append(Bucket(bytes=size, ready_block=block))
    return buckets


def plan_zero2_buckets(ctx: Context, cap_bytes: float) -> list[Bucket]:
    """zero2's buckets as its trainer cuts them (ddlbench.train.strategies.sharded.plan_buckets): parameter
    tensors in reverse registration order (a layer's bias before its weight), a new bucket whenever the next
    tensor would take the current one past the cap, so a tensor larger than the cap has a bucket of its own
    (alexnet's: 5 buckets, its two large Linears' weights alone, where DDP's cut, plan_buckets, makes 3). A
    bucket is launched when the backward of the block holding its last tensor ends."""
    buckets: list[Bucket] = []
    size, block = 0, -1
    for layer in reversed(ctx.table.layers):
        if not layer.params:
            continue
        weight = min(layer.params, math.prod(layer.weight_shape) if layer.weight_shape else layer.params)
        for count in (layer.params - weight, weight):  # reversed: the bias (registered after) first
            if count <= 0:
                continue
            if size and size + count * FP32 > cap_bytes:
                buckets.append(Bucket(bytes=size, ready_block=block))
                size = 0
            size += count * FP32
            block = layer.block
    if size:
        buckets.append(Bucket(bytes=size, ready_block=block))
    return buckets


def add_passes(
    program: Program,
    rank: int,
    times: BlockTimes,
    blocks: range,
    *,
    first_deps=(),
    tag: str = "",
    after_backward: Callable[[int, int], None] | None = None,
) -> tuple[dict[int, int], dict[int, int], int]:
    """Forward over `blocks`, the loss, backward in reverse; returns (forward op, backward op) per block
    and the last op. `after_backward(block, op)`, where given, is called as each block's backward is issued,
    so that what the backward's own thread does once a block's gradients are ready (DDP's copies into its
    buckets) is issued there, in the compute lane's order, and not after the whole backward."""
    forward, backward = {}, {}
    deps = tuple(first_deps)
    for i in blocks:
        forward[i] = program.compute(rank, times.forward_s[i], deps=deps, label=f"F{i}{tag}")
        deps = ()
    last = program.compute(rank, times.loss_s, label=f"loss{tag}")
    for i in reversed(blocks):
        backward[i] = program.compute(rank, times.backward_s[i], label=f"B{i}{tag}")
        last = backward[i]
        if after_backward is not None:
            after_backward(i, backward[i])
    return forward, backward, last


def activation_terms(ctx: Context, batch: float, blocks: range | None = None, scale: list[float] | None = None):
    """(saved, grads, flowing) per block for the memory walk, at `batch` samples (bytes)."""
    table = ctx.table
    blocks = blocks if blocks is not None else range(len(table.blocks))
    scale = scale or [1.0] * len(table.blocks)
    saved = [(table.blocks[i].saved_bytes * batch + table.blocks[i].saved_fixed_bytes) * scale[i] for i in blocks]
    grads = [table.blocks[i].params * FP32 for i in blocks]
    flowing = [
        (elements(table.blocks[i].input_shape) + elements(table.blocks[i].output_shape)) * FP32 * batch for i in blocks
    ]
    last = len(table.blocks) - 1
    if blocks and blocks[-1] == last:
        # the loss (outside the model): cross-entropy keeps the log-softmax of the logits for backward, and
        # backward starts from the logits' gradient, both of the last block's output size
        logits = elements(table.blocks[last].output_shape) * FP32 * batch
        saved[-1] += logits
        flowing[-1] += logits
    return saved, grads, flowing


def model_ddp(ctx: Context, times: BlockTimes, *, horovod: bool = False) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    world = list(range(s.world_size))
    program = Program()
    blocks = range(len(table.blocks))
    first = None
    buffer_bytes = table.buffer_bytes
    if not horovod and buffer_bytes and s.world_size > 1:
        first = program.comm(0, ctx.collective_s("broadcast", buffer_bytes, world), label="broadcast buffers")
    if horovod:
        cap = float(s.option("fusion_threshold_mb")) * 2**20
        # a block's gradients in fused all-reduces of at most the fusion threshold each
        buckets = [
            Bucket(bytes=int(min(cap, table.blocks[i].params * FP32 - start)), ready_block=i)
            for i in reversed(blocks)
            for start in range(0, table.blocks[i].params * FP32, int(cap))
        ]
        what = f"{len(buckets)} fused all-reduce(s) of the gradients, one per block "
        what += f"(Horovod, fusion ≤ {cap / 2**20:g} MiB)"
    else:
        cap = float(s.option("bucket_cap_mb")) * 2**20
        buckets = plan_buckets(ctx, cap, first_cap_bytes=FIRST_BUCKET_BYTES)
        what = f"{len(buckets)} bucket all-reduce(s) of {table.param_bytes / 1e6:.3g} MB of gradients during backward"
        if buffer_bytes and s.world_size > 1:
            what += f"; a broadcast of {buffer_bytes} B of buffers before each forward"
    ready: dict[int, int] = {}  # bucket → the op after which its all-reduce may start

    def filled(block: int, op: int) -> None:
        for k, b in enumerate(buckets):
            if b.ready_block != block:
                continue
            if horovod:
                ready[k] = op
            else:  # the reducer copies each gradient into its bucket as it is ready, on the backward's thread:
                # issued right after the block's backward, so that a bucket filled early (a classifier's
                # gradients come first) is all-reduced under the rest of the backward, as DDP runs it
                ready[k] = program.compute(0, copy_pass_s(ctx, b.bytes / FP32), deps=(op,), label=f"into bucket {k}")

    first_deps = (first,) if first is not None else ()
    _, backward, _ = add_passes(program, 0, times, blocks, first_deps=first_deps, after_backward=filled)
    reductions = [
        program.comm(
            0,
            ctx.collective_s("all_reduce", b.bytes, world),
            deps=(ready[k],),
            label=f"all_reduce {k}",
            collective="all_reduce",
        )
        for k, b in enumerate(buckets)
    ]
    deps = [*reductions, backward[0]]
    if not horovod:  # and back into the gradients once reduced (gloo's all-reduce of one rank copies nothing)
        deps = [program.compute(0, copy_pass_s(ctx, table.params), deps=deps, label="buckets back")]
    program.compute(0, times.update_per_param_s * table.params, deps=deps, label="update")
    saved, grads, flowing = activation_terms(ctx, s.batch_size)
    # DDP's buckets copy every gradient; Horovod allocates its whole fusion buffer once it fuses anything
    comm_buffer = table.param_bytes if not horovod else (cap if s.world_size > 1 else 0)
    memory = rank_memory(
        params=table.param_bytes + table.buffer_bytes,
        grads=table.param_bytes,
        optimizer=MOMENTUM_STATES * table.param_bytes,
        buffers=comm_buffer,
        saved=saved,
        grad_per_block=grads,
        flowing=flowing,
        detail="DDP buckets hold a copy of the gradients"
        if not horovod
        else f"Horovod's fusion buffer of {cap / 2**20:g} MiB",
    )
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


def model_zero2(ctx: Context, times: BlockTimes) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p = s.world_size
    program = Program()
    blocks = range(len(table.blocks))
    _, backward, _ = add_passes(program, 0, times, blocks)
    buckets = plan_zero2_buckets(ctx, float(s.option("bucket_cap_mb")) * 2**20)
    scatters = [
        program.comm(
            0,
            zero2_collective_s(ctx, "reduce_scatter", b.bytes),
            deps=(backward[b.ready_block],),
            label=f"reduce_scatter {k}",
            collective="reduce_scatter",
        )
        for k, b in enumerate(buckets)
    ]
    update = program.compute(
        0,
        times.update_per_param_s * table.params / p + zero2_buffers_s(ctx, table.params, p),
        deps=[*scatters, backward[0]],
        label="update",
    )
    for k, b in enumerate(buckets):
        gather_s = zero2_collective_s(ctx, "all_gather", b.bytes)
        program.comm(0, gather_s, deps=(update,), label=f"all_gather {k}", collective="all_gather")
    saved, grads, flowing = activation_terms(ctx, s.batch_size)
    if ctx.machine.device_kind == "cpu":
        walked, launched, transient = list(grads), [0.0] * len(grads), 0.0
        for b in buckets:
            launched[b.ready_block] += b.bytes / p  # its shard; its buffer takes its gradients' place in `walked`
        moments = gloo_bucket_moments(ctx, times, buckets, p)
    else:
        # NCCL: a bucket's gradients are copied into its buffer and freed once it is full, the reduce-scatter
        # writes into the shard and is done by the next launch: one bucket's gradients and buffer at a time,
        # early in backward while nearly every activation is still kept. Not right yet: on one H200 at one
        # rank it predicted 66-67 % of the measured peak (docs/analytic.md: workspaces are not modelled)
        largest = max((b.bytes for b in buckets), default=0)
        walked, launched, moments, transient = [0.0] * len(grads), None, None, 2.0 * largest
    memory = rank_memory(
        params=table.param_bytes + table.buffer_bytes,
        grads=table.param_bytes / p,
        optimizer=MOMENTUM_STATES * table.param_bytes / p,
        buffers=0,
        saved=saved,
        grad_per_block=walked,
        flowing=flowing,
        extra_peak=transient,
        launched=launched,
        moments=moments,
        detail="full parameters (one flat buffer); gradient and optimizer shards of 1/p",
    )
    what = f"{len(buckets)} reduce-scatter(s) during backward, {len(buckets)} all-gather(s) after the update"
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


def block_spans(times: BlockTimes) -> list[tuple[float, float]]:
    """Each block's backward as (start, end) seconds from the start of backward, which walks the blocks in
    reverse."""
    spans, clock = [(0.0, 0.0)] * len(times.backward_s), 0.0
    for k in range(len(times.backward_s) - 1, -1, -1):
        spans[k] = (clock, clock + times.backward_s[k])
        clock += times.backward_s[k]
    return spans


def gloo_schedule(ctx: Context, times: BlockTimes, buckets: list[Bucket], p: int) -> list[tuple[float, float]]:
    """When each zero2 bucket's reduce-scatter on gloo runs, as (start, end) seconds from the start of
    backward. gloo runs a group's collectives one after another on its own thread: bucket k starts when its
    ready block's backward ends or when bucket k−1's is done, whichever is later, and takes zero2_collective_s
    (on one rank without that figure, an elementwise pass: gloo copies the bucket, no peer) and the first touch
    of its temporary where that is mapped anew."""
    s = ctx.setting
    spans = block_spans(times)
    measured = alone_measured(ctx)  # one rank, its calls timed: their temporaries' first touches are inside
    done, schedule = 0.0, []
    for bucket in buckets:
        launched = spans[bucket.ready_block][1]
        if p > 1 or measured:
            seconds = zero2_collective_s(ctx, "reduce_scatter", bucket.bytes)
        else:
            seconds = elementwise_s(
                ctx.machine, bucket.bytes / FP32, precision=s.precision, threads=s.threads, sharing=ctx.sharing
            )
        if bucket.bytes >= MAPPED_ANEW_BYTES and not measured:  # its temporary mapped anew: first touch
            seconds += bucket.bytes * (ctx.machine.first_touch_s_per_byte or 0.0)
        begin = max(done, launched)
        done = begin + seconds
        schedule.append((begin, done))
    return schedule


def gloo_bucket_moments(ctx: Context, times: BlockTimes, buckets: list[Bucket], p: int) -> BucketMoments:
    """What zero2's buckets on gloo hold for a while (ddlbench.train.strategies.sharded.ZeroStage2Trainer):
    - at its launch, at the end of its ready block's backward, a bucket's buffer (its size) is made and
      filled beside its gradients, which are freed only then;
    - gloo's reduce-scatter flattens its input into a temporary of the whole bucket (not 1/p: measured,
      100 MiB at 1 and 2 ranks for a 100 MiB bucket, torch 2.13; its all-gather's too), made when the
      collective starts on gloo's thread (gloo_schedule) and kept by its Work, which the trainer drops only
      at the first launch after the collective is done (or once backward is over): held from its start to
      then.
    The buffers and shards themselves stay to the end of backward (rank_memory's `launched`)."""
    n = len(times.backward_s)
    spans = block_spans(times)
    schedule = gloo_schedule(ctx, times, buckets, p)
    total = spans[0][1] if n else 0.0
    launches = [spans[b.ready_block][1] for b in buckets]
    kept = []  # (start, dropped) of each bucket's temporary
    for k, (begin, end) in enumerate(schedule):
        dropped = min((t for t in launches[k + 1 :] if t >= end), default=math.inf)
        kept.append((begin, dropped))

    def alive(first: float, last: float) -> float:
        return sum(
            b.bytes for b, (begin, dropped) in zip(buckets, kept, strict=True) if begin < last and dropped > first
        )

    held = [alive(*spans[k]) for k in range(n)]
    launch, passing = [0.0] * n, [0.0] * n
    for b, at in zip(buckets, launches, strict=True):
        k = b.ready_block
        launch[k] = max(launch[k], b.bytes + alive(at, at))
        passing[k] = elements(ctx.table.blocks[k].input_shape) * FP32 * ctx.setting.batch_size
    after = sum(
        b.bytes for b, (begin, dropped) in zip(buckets, kept, strict=True) if begin <= total and dropped > total
    )
    # after the update: the shards' gradients (1/p) and their clones for the all-gathers (1/p), and an
    # all-gather's temporary of the whole bucket. Not every one of those is kept to the last wait, as the
    # reduce-scatters' are: four 25 MiB buckets all-gathered at once, waited at the end, held 2 (one rank) and
    # 3 (two ranks) temporaries at their most, four reduce-scattered all 4; the largest bucket's is counted
    bucketed = float(sum(b.bytes for b in buckets))
    largest = float(max((b.bytes for b in buckets), default=0))
    return BucketMoments(
        held=held, launch=launch, passing=passing, after_walk=float(after), after_update=bucketed * 2 / p + largest
    )


def copy_pass_s(ctx: Context, elements: float) -> float:
    """Seconds to copy `elements` fp32 values into another tensor: the operator fits' elementwise pass, and
    at least the bytes read and written over the memory bandwidth (a pass over more than the caches; the
    fits are timed on shapes that mostly fit in them). DDP's reducer on a 2-core host (gpt_medium, 1.21 GB
    of gradients, one rank, 2026-12-02): its backward took 0.47-0.58 s more than the plain model's, its
    three passes (into the buckets, gloo's one-rank all-reduce, back) 0.56 s by bandwidth, 0.23 s by the fit.
    The layer-by-layer strategies' copies (ddlbench.analysis.analytic.layer_splits.Lane.copy: windows, cats,
    the flat gradient of a region) cost the same way."""
    s = ctx.setting
    fitted = elementwise_s(ctx.machine, elements, precision=s.precision, threads=s.threads, sharing=ctx.sharing)
    bandwidth = ctx.machine.memory_bandwidth_bytes_per_s
    return max(fitted, 2 * FP32 * elements / bandwidth) if bandwidth else fitted


def zero2_buffers_s(ctx: Context, params: int, p: int) -> float:
    """What zero2's own buffers cost a rank each step beyond its collectives' fits (ddlbench.train.strategies.
    sharded.ZeroStage2Trainer), as elementwise passes over `params` elements and first touches of memory
    mapped anew: per bucket a zero-filled buffer of its gradients (a new allocation, written), the gradients
    copied into it and divided by the ranks (two passes), its shard (1/p, new), the reduce-scatter's
    temporary (the whole bucket: gloo flattens its input, gloo_bucket_moments); after the update each shard
    cloned for the all-gather (1/p, new, a pass) and the all-gather's temporary (the whole bucket). On one rank
    gloo's reduce-scatter and all-gather copy too (no peer; the collectives' fits cost a group of one
    nothing): where the calibration timed them on a group of one (zero2_collective_s), they are priced there,
    their temporaries' first touches included; else as an elementwise pass each. Counted with the update,
    after backward, where the copies into the buckets really run inside it.

    Only allocations of MAPPED_ANEW_BYTES or more are mapped anew each step; smaller ones reuse the heap
    (compute.mapped_anew_bytes). A bucket is at most bucket_cap_mb (25 MB) unless one parameter is larger
    and has one of its own, so only such a parameter's buffers pay first touches: 3 + 2/p times its bytes
    (1 + 3/p until the collectives' temporaries were measured whole, 2026-12-04).
    Priced per parameter before (every byte 1 + 2/p times), zero2 − ddp on one rank came out 650 ms for
    gpt_small (its largest weight 9.4 MB) against 160 measured, 132 for resnet34 against 5, and 979 for
    vgg11 (120 M of its 133 M parameters in two layers of 411 and 67 MB) against 1,228 (the tenth and
    eleventh scoring sets, seen since)."""
    s = ctx.setting
    one_pass = elementwise_s(ctx.machine, params, precision=s.precision, threads=s.threads, sharing=ctx.sharing)
    measured = alone_measured(ctx)
    passes = 3 + 1 / p + (2 if p == 1 and not measured else 0)
    touches = 3 + 2 / p - (2 if measured else 0)  # the two temporaries' first touches, timed within the calls
    touched = mapped_anew_bytes(ctx.table.layers) * touches * (ctx.machine.first_touch_s_per_byte or 0.0)
    return one_pass * passes + touched


def alone_measured(ctx: Context) -> bool:
    """Whether zero2's collectives run on a group of one and the machine file timed them there."""
    return ctx.setting.world_size == 1 and bool(ctx.machine.alone_collectives)


def zero2_collective_s(ctx: Context, op: str, nbytes: float) -> float:
    """Seconds of one zero2 reduce-scatter or all-gather of a bucket of `nbytes`: the collectives' fit over the
    ranks; on one rank, the calibration's calls on a group of one (MachineModel.alone_collective_s): gloo with
    no peer flattens the input into a temporary and copies the result out, 0.29-0.36 ms a MB for the
    reduce-scatter and 0.32-0.67 for the all-gather of 10-151 MB buckets on one 2-core rank (alexnet,
    wide_resnet50_2 on `stl10`, 2026-12-06), and up to 2.6 ms a MB for vgg16's 411 MB bucket. Without that
    figure (a GPU, an older machine file) nothing here: zero2_buffers_s prices them as passes."""
    if ctx.setting.world_size > 1:
        return ctx.collective_s(op, nbytes, list(range(ctx.setting.world_size)))
    return ctx.machine.alone_collective_s(op, nbytes) or 0.0


def model_fsdp(ctx: Context, times: BlockTimes) -> StrategyRun:
    s, table = ctx.setting, ctx.table
    p = s.world_size
    world = list(range(p))
    program = Program()
    n = len(table.blocks)
    params = block_params(table)
    tensors = block_tensors(table)
    host = _fsdp_host_costs(ctx, params, tensors)  # None: not calibrated
    # the host's part of FSDP2 (hooks, copies, waits) runs on the rank's thread: on a CPU it holds up the
    # compute; on a GPU the host issues ahead of the kernels, so it is set beside them
    lane = program.compute if ctx.machine.device_kind == "cpu" else program.comm
    gather_f: dict[int, int] = {}
    forward: dict[int, int] = {}
    previous = None
    for i in range(n):
        if params[i]:
            gather_f[i] = program.comm(
                0,
                ctx.collective_s("all_gather", params[i] * FP32, world),
                deps=(previous,) if previous is not None else (),
                label=f"all_gather F{i}",
                collective="all_gather",
            )
            if host:
                gather_f[i] = lane(0, host.blocks[i][0], deps=(gather_f[i],), label=f"FSDP2 host F{i}")
        forward[i] = program.compute(0, times.forward_s[i], deps=(gather_f[i],) if i in gather_f else (), label=f"F{i}")
        previous = forward[i]
    program.compute(0, times.loss_s, label="loss")
    # backward: block i's all-gather is prefetched while block i+1's backward runs (FSDP2's implicit
    # backward prefetch); the last block kept its parameters from the forward (the root reshards it after)
    backward: dict[int, int] = {}
    scatters = []
    for i in reversed(range(n)):
        deps = []
        if params[i] and i < n - 1:
            after = backward.get(i + 2)
            gather = program.comm(
                0,
                ctx.collective_s("all_gather", params[i] * FP32, world),
                deps=(after,) if after is not None else (),
                label=f"all_gather B{i}",
                collective="all_gather",
            )
            deps.append(gather)
        backward[i] = program.compute(0, times.backward_s[i], deps=deps, label=f"B{i}")
        if params[i]:
            scatters.append(
                program.comm(
                    0,
                    ctx.collective_s("reduce_scatter", params[i] * FP32, world),
                    deps=(backward[i],),
                    label=f"reduce_scatter {i}",
                    collective="reduce_scatter",
                )
            )
            if host:
                scatters.append(lane(0, host.blocks[i][1], deps=(backward[i],), label=f"FSDP2 host B{i}"))
    update_s = times.update_per_param_s * table.params / p + (host.update_s if host else 0.0)
    program.compute(0, update_s, deps=[*scatters, backward[0]], label="update")
    saved, grads, flowing = activation_terms(ctx, s.batch_size)
    largest = max(params, default=0) * FP32
    memory = rank_memory(
        params=table.param_bytes / p + table.buffer_bytes,
        grads=table.param_bytes / p,
        optimizer=MOMENTUM_STATES * table.param_bytes / p,
        buffers=0,
        saved=saved,
        grad_per_block=[g / p for g in grads],
        flowing=flowing,
        extra_peak=2 * largest + largest,  # two blocks unsharded (current + prefetched) and one full gradient
        detail="parameters, gradients and optimizer state sharded 1/p; blocks unsharded one or two at a time",
    )
    what = f"{2 * sum(1 for x in params if x) - 1} block all-gathers and "
    what += f"{sum(1 for x in params if x)} reduce-scatters per step"
    return StrategyRun(timeline=ctx.simulate(program), memory=memory, comm=what)


@dataclass(frozen=True)
class FsdpHost:
    """FSDP2's cost beyond its collectives' fits: (forward s, backward s) per block with parameters, and the
    update's DTensor dispatch over every parameter tensor (s)."""

    blocks: dict[int, tuple[float, float]]
    update_s: float


def _fsdp_host_costs(ctx: Context, params: list[int], tensors: list[int]) -> FsdpHost | None:
    """What FSDP2 adds per unit beyond its collectives' fits, from the machine's fsdp_units (a toy timed
    sharded and unsharded, ddlbench.analysis.machine.fsdp_units): per block with parameters (forward s,
    backward s), and "update_s", the optimizer's DTensor dispatch over every parameter tensor. A unit's
    calibrated cost includes the collectives the toy's group paid, so those fits, at the toy's group, are
    taken off; the point's own collectives are costed beside. None where the machine has no fsdp_units."""
    p = ctx.setting.world_size
    nodes = ctx.nodes_spanned(list(range(p)))
    units = ctx.machine.fsdp_units_for(ranks=p, nodes=nodes)
    if units is None:
        _note(ctx, "FSDP2's own cost per unit not calibrated (a suite with fsdp_units: true measures it): left out")
        return None
    _note(
        ctx,
        f"FSDP2's cost per unit from {units.point_id or 'the machine file'} (p={units.ranks} n={units.nodes}), "
        "its collectives' fits there taken off",
    )
    last = len(params) - 1
    # the collectives' fits at the toy's group (a one-rank mesh calls no peer: nothing to take off)
    toy = {
        op: ctx.machine.collective(op, ranks=units.ranks, nodes=units.nodes) if units.ranks > 1 else None
        for op in ("all_gather", "reduce_scatter")
    }

    def toy_s(op: str, nbytes: float) -> float:
        return toy[op].time_s(nbytes) if toy[op] is not None else 0.0

    blocks: dict[int, tuple[float, float]] = {}
    for i, count in enumerate(params):
        if not count:
            continue
        nbytes = count * FP32
        gather = toy_s("all_gather", nbytes)
        regathered = gather if i < last else 0.0
        blocks[i] = (
            max(0.0, units.forward_s(tensors[i], nbytes) - gather),
            max(0.0, units.backward_s(tensors[i], nbytes) - regathered - toy_s("reduce_scatter", nbytes)),
        )
    return FsdpHost(blocks=blocks, update_s=units.update_per_tensor_s * sum(tensors))


def _note(ctx: Context, note: str) -> None:
    if note not in ctx.notes:
        ctx.notes.append(note)
