"""Pipeline and model parallelism as the ranks run them: gpipe, 1f1b, interleaved_1f1b, dp_pp, model_parallel.

The model's blocks are cut into stages exactly as the strategies cut them at run time: the linear-
partition optimum of per-block forward FLOPs or parameters (ddlbench.catalog.stage_cut, the `balance`
option), into `split` stages (two per rank for interleaved_1f1b, placed looped: rank r holds stages r
and r + split). Each rank runs its stages' forward and backward passes per micro-batch in the order its
torch.distributed.pipelining schedule issues them (`rank_orders`):
- GPipe (ScheduleGPipe): all m forwards, then all m backwards;
- 1F1B (Schedule1F1B): min(m, S − s) forwards, then one backward and one forward alternately, then the
  remaining backwards;
- interleaved 1F1B (ScheduleInterleaved1F1B, Narayanan et al. SC21): torch's own order
  (`_get_1f1b_rank_ops`: warmup (v−1)·m_round + 2(S−1−r) forwards, then 1F1B, stage indices chosen by
  rounds of m_round = m / max(1, m // S) micro-batches), written here anew;
- model_parallel: one pass of the whole batch down and back (no micro-batches), blocking send/recv.
A stage's activation (its last block's output, micro-batch × elements × the autocast dtype's bytes) is
received by the next stage before that one's forward, and its gradient, of the same size, before the
previous stage's backward: a transfer on the receiver's communication lane, costed as send_recv
between the two ranks. Each micro-batch's backward after a stage's first adds its weight gradients into .grad
(a read-add-write pass over the stage's parameters: for VGG-11's second stage, 9 M values, as long as a micro-
batch's backward on this CPU), and the schedule scales them once at the end. The weight gradients' allocations
are left to the operator fits, which time every backward with .grad set to None, as a stage's micro-batches
allocate theirs (a later one allocates its gradients anew before adding them in). An earlier term added every
stage's gradient bytes × `first_touch_s_per_byte` to every backward on top of the fits (glibc hands a freed
block of 32 MiB or more back to the kernel, so it faults again at the next micro-batch): the tenth and
eleventh scoring sets' gpipe points were then all over, 1.27-1.41×, and VGG-11's second stage on ImageNet (132
M parameters, one sample a micro-batch) was predicted 406 + 269 ms a backward against 437-516 measured. The
faults are real (alone on one core, its 25088 → 4096 layer's backward took 192-238 ms with glibc's defaults
and 50-59 ms with nothing handed back, MALLOC_MMAP_MAX_=0), but the linear fit, whose draws stop at 4096 ×
4096, already puts that layer's backward at 118-154 ms; drawing Linears of 32-512 MiB into the calibration
made the seen sets' predictions worse (docs/analytic.md). Stages that share a host pay the operator fits timed with
every rank computing only while another stage computes, and those timed alone otherwise: the last stage accumulating
and updating its 411 MB Linear while the first waits for its gradients (vgg11's and vgg13's pipelines, 1.19-1.30×
over when every pass was priced shared; docs/analytic.md, "Pipeline stages on one host"). The last stage's forward
includes the loss. In dp_pp
the replicas of a stage all-reduce its gradients in DDP buckets during the last micro-batch's backward, then
every rank updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from ddlbench.analysis.analytic.compute import BlockTimes, elementwise_s
from ddlbench.analysis.analytic.data_parallel import FIRST_BUCKET_BYTES, StrategyRun, activation_terms
from ddlbench.analysis.analytic.layout import Context, element_bytes, elements
from ddlbench.analysis.analytic.memory import FP32, MOMENTUM_STATES, RankMemory, backward_peak
from ddlbench.analysis.analytic.operators import CONV_TYPES
from ddlbench.analysis.analytic.simulate import Program
from ddlbench.catalog.model_table import ModelTable
from ddlbench.catalog.stage_cut import partition

SCALE_OF_ADD = 2 / 3  # values moved by an in-place scale (read, write) over those of an add (read two, write one)


@dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    stage: int
    micro: int


def single_stage_order(schedule: str, stage: int, stages: int, micro: int) -> list[Action]:
    if schedule == "gpipe":
        return [Action("F", stage, m) for m in range(micro)] + [Action("B", stage, m) for m in range(micro)]
    warmup = min(micro, stages - stage)
    order = [Action("F", stage, m) for m in range(warmup)]
    forward, backward = warmup, 0
    while backward < micro:
        order.append(Action("B", stage, backward))
        backward += 1
        if forward < micro:
            order.append(Action("F", stage, forward))
            forward += 1
    return order


def interleaved_order(rank: int, ranks: int, local_stages: int, micro: int) -> list[Action]:
    """The actions of one rank under ScheduleInterleaved1F1B (without its alignment no-ops)."""
    rounds = max(1, micro // ranks)
    per_round = micro // rounds
    warmup = min((local_stages - 1) * per_round + 2 * (ranks - 1 - rank), micro * local_stages)
    total = local_stages * micro
    fwd_bwd = total - warmup

    def forward_stage(step: int) -> int:
        return ((step // per_round) % local_stages) * ranks + rank

    def backward_stage(step: int) -> int:
        return (local_stages - 1 - ((step - warmup) // per_round) % local_stages) * ranks + rank

    next_f: dict[int, int] = {}
    next_b: dict[int, int] = {}
    order: list[Action] = []

    def take(kind: str, stage: int) -> None:
        table = next_f if kind == "F" else next_b
        order.append(Action(kind, stage, table.get(stage, 0)))
        table[stage] = table.get(stage, 0) + 1

    for step in range(warmup + fwd_bwd + (total - fwd_bwd)):
        if step < warmup:
            take("F", forward_stage(step))
        elif step < warmup + fwd_bwd:
            take("F", forward_stage(step))
            take("B", backward_stage(step))
        else:
            take("B", backward_stage(step))
    return order


def cut_stages(ctx: Context, stages: int) -> tuple[tuple[int, int], ...]:
    rule = ctx.setting.options().get("balance", "flops")
    costs = [b.forward_flops if rule == "flops" else b.params for b in ctx.table.blocks]
    return partition(costs, stages)


def boundary_bytes(ctx: Context, block: int, batch: float) -> float:
    """Bytes of block `block`'s output for `batch` samples, as sent between stages (the autocast dtype)."""
    return elements(ctx.table.blocks[block].output_shape) * element_bytes(ctx.setting.precision) * batch


def model_pipeline(
    ctx: Context,
    times: BlockTimes,
    *,
    schedule: str,
    stages_per_rank: int = 1,
    micro: int | None = None,
    alone: BlockTimes | None = None,
) -> StrategyRun:
    """A pipeline of `split` ranks (replicas in dp_pp run alike; rank 0's replica stands for all). With
    `alone` (the blocks timed with one rank on the host), ranks sharing a host pay `times` only while
    another of them computes (ddlbench.analysis.analytic.simulate)."""
    s, table = ctx.setting, ctx.table
    ranks = s.split  # the Setting's split is Point's: the world size for a model cut over every rank
    micro = micro or s.micro_batches
    stages = ranks * stages_per_rank
    bounds = cut_stages(ctx, stages)
    batch = s.batch_size / micro
    rank_of = {k: k % ranks for k in range(stages)}
    stage_params = [sum(table.blocks[i].params for i in range(*bounds[k])) for k in range(stages)]

    def prices(times: BlockTimes, sharing: int) -> tuple[list[float], list[float], list[float], float]:
        """Each stage's forward (the last with the loss), backward and gradient accumulation, and the update's
        seconds a parameter. The second and later micro-batches' backward add their weight gradients into
        .grad (the first sets it): one read-add-write pass over the stage's parameters each."""
        forward = [times.forward_of(range(*bounds[k])) for k in range(stages)]
        forward[-1] += times.loss_s
        backward = [times.backward_of(range(*bounds[k])) for k in range(stages)]
        add = [
            elementwise_s(ctx.machine, n, precision=s.precision, threads=s.threads, sharing=sharing) if n else 0.0
            for n in stage_params
        ]
        return forward, backward, add, times.update_per_param_s

    stage_f, stage_b, accumulate, update_per_param = prices(times, ctx.sharing)
    alone_f, alone_b, alone_accumulate, alone_update = prices(alone, 1) if alone is not None else (None,) * 4
    program = Program(hosts={r: r // ctx.sharing for r in range(ranks)} if alone is not None else {})

    def alone_of(values: list[float] | None, stage: int) -> float | None:
        return None if values is None else values[stage]

    if schedule == "interleaved":
        orders = {r: interleaved_order(r, ranks, stages_per_rank, micro) for r in range(ranks)}
    elif schedule == "model_parallel":
        orders = {r: [Action("F", r, 0), Action("B", r, 0)] for r in range(ranks)}
    else:
        orders = {r: single_stage_order(schedule, r, stages, micro) for r in range(ranks)}
    op_of: dict[Action, int] = {}
    recv_of: dict[Action, int] = {}
    last_of: dict[int, int] = {}
    for r, order in orders.items():
        for action in order:
            deps = []
            needs_recv = action.stage > 0 if action.kind == "F" else action.stage < stages - 1
            if needs_recv:
                peer = action.stage - 1 if action.kind == "F" else action.stage
                nbytes = boundary_bytes(ctx, bounds[peer][1] - 1, batch)
                src = rank_of[action.stage - 1] if action.kind == "F" else rank_of[action.stage + 1]
                duration = 0.0 if src == r else ctx.send_s(nbytes, src, r)
                recv_of[action] = program.comm(r, duration, label=f"recv {action.kind}{action.micro} s{action.stage}")
                deps.append(recv_of[action])
            if action.kind == "B" and action.stage == stages - 1:
                deps.append(None)  # filled below: the same micro-batch's forward on this stage
            if action.kind == "F":
                duration, solo = stage_f[action.stage], alone_of(alone_f, action.stage)
            else:
                duration, solo = stage_b[action.stage], alone_of(alone_b, action.stage)
                if action.micro > 0:
                    duration += accumulate[action.stage]
                    solo = None if solo is None else solo + alone_accumulate[action.stage]
            op_of[action] = program.compute(
                r, duration, label=f"{action.kind}{action.micro} s{action.stage}", alone_s=solo
            )
            program.ops[op_of[action]].deps = tuple(d for d in deps if d is not None)
            last_of[r] = op_of[action]
    # a transfer completes once the sender has computed it and the receiver has posted its recv, which the
    # schedule does when the receiver's action before it has run (gloo's and NCCL's send wait for the peer's
    # recv); the sender waits for its sends before step() returns (torch's schedules wait on them at the end)
    before: dict[Action, int] = {}
    for order in orders.values():
        for previous, action in pairwise(order):
            before[action] = op_of[previous]
    sends_of: dict[int, list[int]] = {r: [] for r in range(ranks)}
    for action, recv in recv_of.items():
        source = (
            Action("F", action.stage - 1, action.micro)
            if action.kind == "F"
            else Action("B", action.stage + 1, action.micro)
        )
        program.ops[recv].deps = (op_of[source], *((before[action],) if action in before else ()))
        sender = rank_of[source.stage]
        if sender != rank_of[action.stage]:
            sends_of[sender].append(
                program.comm(sender, 0.0, deps=(recv,), label=f"sent {source.kind}{source.micro} s{source.stage}")
            )
    for action, op in op_of.items():
        if action.kind == "B" and action.stage == stages - 1:
            program.ops[op].deps = (*program.ops[op].deps, op_of[Action("F", action.stage, action.micro)])
    params_of = {
        r: sum(table.blocks[i].params for k in range(stages) if rank_of[k] == r for i in range(*bounds[k]))
        for r in range(ranks)
    }
    replicas = s.replicas
    for r in range(ranks):
        deps = [last_of[r], *sends_of[r]]
        if replicas > 1:
            group = ctx.outer_group(replicas, ranks)
            group = [g + r for g in group]
            for k, nbytes in enumerate(_buckets(params_of[r] * FP32)):
                deps.append(
                    program.comm(
                        r,
                        ctx.collective_s("all_reduce", nbytes, group),
                        deps=(last_of[r],),
                        label=f"dp all_reduce {k} r{r}",
                        collective="all_reduce",
                    )
                )
        # at the end the schedule divides the gradients by the number of micro-batches (scale_grads): an
        # in-place pass over them that reads and writes each value once, 2/3 of an accumulation's three (here
        # alone on one core, 128 Mi values: div_ 53 ms, add_ 82 ms)
        mine = [k for k in range(stages) if rank_of[k] == r]
        scaling = SCALE_OF_ADD * sum(accumulate[k] for k in mine) if micro > 1 else 0.0
        solo = None
        if alone is not None:
            solo = SCALE_OF_ADD * sum(alone_accumulate[k] for k in mine) if micro > 1 else 0.0
            solo += alone_update * params_of[r]
        program.compute(r, scaling + update_per_param * params_of[r], deps=deps, label=f"update r{r}", alone_s=solo)
    timeline = ctx.simulate(program)
    memory = max(
        (_stage_memory(ctx, r, orders[r], bounds, rank_of, batch, replicas) for r in range(ranks)),
        key=lambda m: m.peak_bytes,
    )
    sends = sum(1 for a in recv_of)
    what = f"{stages} stages over {ranks} ranks, {micro} micro-batch(es) of {batch:g}: "
    what += f"{sends} activation/gradient transfers"
    if replicas > 1:
        what += f"; each stage's gradients all-reduced over {replicas} replicas"
    ctx.notes.append("stages (blocks): " + ", ".join(f"[{lo},{hi})" for lo, hi in bounds))
    return StrategyRun(timeline=timeline, memory=memory, comm=what)


def _buckets(nbytes: float, cap: float = 25 * 2**20) -> list[float]:
    if nbytes <= 0:
        return []
    out = [min(nbytes, FIRST_BUCKET_BYTES)]
    rest = nbytes - out[0]
    while rest > 0:
        out.append(min(rest, cap))
        rest -= out[-1]
    return out


def in_flight(order: list[Action], stage: int) -> int:
    """The most micro-batches of `stage` whose forward ran and whose backward has not (saved activations)."""
    live = peak = 0
    for action in order:
        if action.stage == stage:
            live += 1 if action.kind == "F" else -1
            peak = max(peak, live)
    return peak


def _stage_memory(
    ctx: Context, rank: int, order: list[Action], bounds, rank_of, batch: float, replicas: int
) -> RankMemory:
    table = ctx.table
    mine = [k for k in range(len(bounds)) if rank_of[k] == rank]
    params = sum(table.blocks[i].params for k in mine for i in range(*bounds[k])) * FP32
    buffers = sum(table.blocks[i].buffer_bytes for k in mine for i in range(*bounds[k]))
    peak_extra = 0.0
    activations = 0.0
    for k in mine:
        blocks = range(*bounds[k])
        saved, grads, flowing = activation_terms(ctx, batch, blocks)
        if blocks and blocks[-1] == len(table.blocks) - 1:
            # the last stage's output, the logits, stays referenced by the stage's forward cache until that
            # micro-batch's backward (PipelineStage.fwd_cache; detached only then), beside the log-softmax the
            # loss keeps (activation_terms); data parallelism frees it once the loss has that. Negligible for a
            # classifier's few outputs; 206 MB a sample for GPT-2's 50,257 words over 1,024 tokens, where the
            # seventeenth set's gpt_tiny gpipe measured 1,262 MB against 877 predicted without it
            saved[-1] += elements(table.blocks[-1].output_shape) * FP32 * batch
        step_peak, kept = backward_peak(saved, grads, flowing, in_flight=max(1, in_flight(order, k)))
        peak_extra += step_peak
        activations += kept
    ddp = params if replicas > 1 else 0
    # a later micro-batch's backward adds each new weight gradient into .grad, which already holds them all:
    # for a moment the new gradient of one tensor lives beside it, and a convolution's own weight-gradient
    # buffer before that (oneDNN fills its blocked layout, then reorders), a Linear's not: twice the stage's
    # largest convolution weight, once its largest Linear weight, whichever is more, on top of the walk's peak
    # (`accumulation_bytes`). Measured with the rank's probe on vgg11's second stage (8.8 M parameters, largest
    # tensor a 9.4 MB convolution weight) at micro-batch 4: 19.6 MB above the resident state at 2 and 4
    # micro-batches, 5.2 MB at 1; on the development sweep's vgg11 1F1B the model was 19 MB under without this
    # term. The classifier stages of the linear development set (2026-12-04): 160 MB above the resident state
    # for alexnet's (its 151 MB Linear weight), 437 MB for vgg16's (411 MB), where twice the weight had been
    # predicted: 1,048 against 892 MB and 2,510 against 2,090 MB
    micro_batches = max((a.micro for a in order), default=0) + 1
    if micro_batches > 1:
        peak_extra += max((accumulation_bytes(table, range(*bounds[k])) for k in mine), default=0)
    # PipelineStage allocates, once, a receive buffer per micro-batch: the input of every stage but the
    # first, the output's gradient of every stage but the last
    element = element_bytes(ctx.setting.precision)
    for k in mine:
        lo, hi = bounds[k]
        if lo > 0:
            buffers += micro_batches * elements(table.blocks[lo - 1].output_shape) * element * batch
        if hi < len(table.blocks) and len(bounds) > 1:
            buffers += micro_batches * elements(table.blocks[hi - 1].output_shape) * element * batch
    return RankMemory(
        params_bytes=int(params + buffers),
        grads_bytes=int(params),
        optimizer_bytes=int(MOMENTUM_STATES * params),
        buffers_bytes=int(ddp),
        activations_bytes=int(activations),
        peak_bytes=int(params + buffers + MOMENTUM_STATES * params + ddp + peak_extra),
        detail=f"rank {rank}: stages {mine}, up to {max(in_flight(order, k) for k in mine)} micro-batch(es) in flight",
    )


def accumulation_bytes(table: ModelTable, blocks: range) -> float:
    """Bytes a later micro-batch's backward holds beside the stage's .grad while it adds a new weight gradient
    in: a convolution's weight twice (the gradient and oneDNN's blocked buffer it is reordered from), any other
    weight once (the new gradient); the most over the layers of `blocks`."""
    wanted = set(blocks)
    return max(
        (
            (2 if layer.type in CONV_TYPES else 1) * FP32 * elements(layer.weight_shape)
            for layer in table.layers
            if layer.block in wanted and layer.weight_shape
        ),
        default=0,
    )
