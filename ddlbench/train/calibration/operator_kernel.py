"""Operators timed one by one on a rank, forward and backward (imported by the worker only: it needs torch).

For each shape of the point (ddlbench.train.calibration.operator_shapes draws them), the operator is built as a
model holds it (nn.Conv2d without bias, nn.BatchNorm2d in training mode, nn.ReLU, nn.MaxPool2d(2), nn.Linear with
bias, a residual add of two tensors; nn.Conv3d without bias and nn.MaxPool3d(2) over volumes) on a random input that
requires a gradient (a 3-channel conv2d's or 4-channel conv3d's input does not: it stands for a model's first layer,
whose backward computes no input gradient), all on the rank's device (CUDA where the rank has a GPU:
ddlbench.launch.devices), with torch's TF32 switches as a training point of the precision sets them (fp32 strict;
cuDNN's own default would run fp32 convolutions in TF32). The ranks time the same shapes at once, after a barrier
per shape, so the operators share the node's cores and memory bandwidth as a training point's ranks do; each shape
is timed by every count k of the point's `operator_at_once` in turn (ranks 0..k−1 time it, the others wait at the
next barrier, idle: a gloo barrier blocks without spinning), so one rank alone and all ranks at once are timed
seconds apart, under the same load on the host. Entries carry `at_once` = k. Per shape and count, in each of ROUNDS
passes over all shapes, `warmup` untimed then iterations / ROUNDS timed repetitions of:
- forward: y = op(x) with autograd recording, as in training, the last RING_BYTES of outputs kept (outputs_held);
and spatial parallelism's slab batch norm (ddlbench.train.strategies.halo.SlabBatchNorm, its statistics
shared over a group of this rank alone: its arithmetic without a peer to wait for), and tensor parallelism's
Linears (torch's ColwiseParallel and RowwiseParallel on a device mesh of this rank alone, the second
dimension of a world × 1 mesh: DTensor's dispatch on every call, no peer):
- backward: y.backward(g) after an untimed forward, the weights' gradients set to None first (as
  zero_grad(set_to_none=True) leaves them), so it includes their allocation and accumulation.
The optimizer's step over UPDATE_ELEMENTS parameters is timed by each count's turn too (`update` entries), before
the shapes and at each of the turn's probes among them. The autograd engine's own cost of one backward() call is
timed the same way, through chains of one and of five one-element nodes, and recorded once (`autograd_call`): a
model pays it once per step, not once per layer, so the fit takes it out of each operator's backward.

Every entry carries the wall-clock `time` it ended at, and every PROBE_EVERY shapes of a pass the ranks of
the turn probe the host (ddlbench.train.host_probe, `when` during): the shapes of one kind are timed
together and a pass takes minutes, so a host whose speed drifts within the point (twice as fast at its end
as at its start, on the development machine's calibration of the fourteenth scoring set) would cost one kind
at one speed and the next at another. ddlbench.analysis.machine.operator_timings sets each entry against the
probes around it. Where the host's speed flickers faster than the probes come (the fifteenth set's
calibration: 3.2-3.7 ms or 5-7.5 ms from one probe to the next), that brings every entry to the probes'
median instead (docs/analytic.md, "The operators point at one host speed").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddlbench.train.calibration.kernels import DTYPES, Timer, _precision_switch, update_probe
from ddlbench.train.calibration.operator_shapes import (
    CONV_KINDS,
    FIRST_LAYER_CHANNELS,
    POOL_KINDS,
    TENSOR_PARALLEL_KINDS,
    TOKEN_KINDS,
    VOLUME_KINDS,
    WIDE_LINEAR_LEAST_WEIGHTS,
    OperatorShape,
    largest_elements,
    sample_shapes,
)
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.host_probe import probe_host

SEED = 0
ROUNDS = 2  # passes over every shape (run_operators)
# a host probe (about 0.2 s on a CPU core) every this many shapes of a pass, in each turn: 62 a turn over the
# default suite's two passes (124 for rank 0, 62 for rank 1 on the fifteenth set's calibration, whose operators
# point took 12.1 min against 11.3-13 before)
PROBE_EVERY = 24
LARGE_ITERATIONS_SHARE = 0.4
# a Linear of this many weights or more is timed with the caches emptied before each call: a step reads such
# weights from memory (between a layer's calls the rest of the pass and the update move hundreds of MB), where a
# shape timed over and over keeps them in this host's 300 MiB last-level cache (a 4,096² weight at 8 rows:
# forward 10 ms repeated, 18 ms after other work, as alexnet's classifier runs in its step)
COLD_LINEAR_WEIGHTS = WIDE_LINEAR_LEAST_WEIGHTS
EVICT_BYTES = 1 << 29  # written before a cold call: past this host's last-level cache (300 MiB) 1.7 times
_evict: list[Tensor] = []


def evict_caches(device: torch.device) -> None:
    """Write EVICT_BYTES of a host buffer kept for it, pushing everything else out of the CPU's caches (on a
    GPU the operators' weights are in device memory: nothing to do)."""
    if device.type != "cpu":
        return
    if not _evict:
        _evict.append(torch.empty(EVICT_BYTES // 4))
    _evict[0].fill_(0.0)


# a forward's outputs are kept, as a network's are (autograd saves them for the backward): each call's output
# lands in memory other outputs were written to RING_BYTES before, out of the core's own caches, as a layer's
# output lands in memory a step's other tensors went through. Kept one at a time, an output lands in the block freed
# two calls before, still in them. In a step of mobilenet_v2 (`stl10`, batch 4; one 2-core rank, torch 2.13, glibc
# told to retain, 2026-12-06) the forwards of its batch norms, convolutions and ReLU6s took 1.4×, 1.4× and 1.9×
# what timings of one output at a time fitted; alone with 32 MiB of outputs kept, a batch norm on its shapes took
# 1.14-1.31× as long as with one, a ReLU6 1.3-2.2×, a 1×1 convolution 1.0-1.26× (more kept, 128 MiB: 5 % more).
# Fitted from timings with the outputs kept, the step's forwards came to 1.3× instead of 1.45× (docs/analytic.md).
RING_BYTES = 32 << 20
RING_MOST = 64  # outputs at most (a tiny one's graph is mostly its call's)


def outputs_held(output: Tensor, device: torch.device) -> int:
    """How many forward outputs the timing keeps at once: RING_BYTES of them on a CPU (at least one, at most
    RING_MOST); one on a GPU, whose caching allocator and device memory this does not model."""
    if device.type != "cpu":
        return 1
    nbytes = max(1, output.numel() * output.element_size())
    return max(1, min(RING_MOST, -(-RING_BYTES // nbytes)))


def cold_call(shape: OperatorShape) -> bool:
    """Whether `shape` is timed with the caches emptied before each call (COLD_LINEAR_WEIGHTS)."""
    return shape.linear_weights >= COLD_LINEAR_WEIGHTS


def build_operator(
    shape: OperatorShape,
    own_group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    own_mesh: DeviceMesh | None = None,
) -> tuple[Callable[[Tensor, Tensor | None], Tensor], list[nn.Parameter]]:
    """The operator as a function of its input(s), and its parameters, on `device` (parameters and buffers:
    a batch norm's running statistics too). `own_group`: a process group of this rank alone, over which a
    slab batch norm shares its statistics (its arithmetic, no peer); `own_mesh`: a device mesh of this rank
    alone, over which a tensor-parallel Linear is sharded (DTensor's dispatch, no peer)."""
    if shape.kind in TENSOR_PARALLEL_KINDS:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        if own_mesh is None:
            raise RuntimeError("a tensor-parallel Linear needs a device mesh (a point with a process group)")
        linear = nn.Linear(shape.in_channels, shape.out_channels)
        if device is not None:
            linear.to(device)
        style = ColwiseParallel() if shape.kind == "tp_colwise_linear" else RowwiseParallel()
        module = parallelize_module(linear, own_mesh, style)
        module.train()
        return (lambda x, _other: module(x)), list(module.parameters())
    if shape.kind in CONV_KINDS:
        depthwise = shape.kind == "depthwise_conv2d"  # one filter per channel: out_channels = in_channels
        module: nn.Module = (nn.Conv3d if shape.kind in VOLUME_KINDS else nn.Conv2d)(
            shape.in_channels,
            shape.out_channels,
            shape.kernel,
            stride=shape.stride,
            padding=shape.kernel // 2,
            groups=shape.in_channels if depthwise else 1,
            bias=False,
        )
    elif shape.kind == "layer_norm":
        module = nn.LayerNorm(shape.in_channels)
    elif shape.kind == "gelu":
        module = nn.GELU()
    elif shape.kind == "embedding":
        module = nn.Embedding(shape.out_channels, shape.in_channels)
    elif shape.kind == "attention":
        heads = shape.out_channels

        def attention(x: Tensor, _other: Tensor | None) -> Tensor:  # CausalSelfAttention between its projections
            n, t, d = x.shape
            q = x.view(n, t, heads, d // heads).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            return y.transpose(1, 2).reshape(n, t, d)

        return attention, []
    elif shape.kind == "batch_norm2d":
        module = nn.BatchNorm2d(shape.in_channels)
    elif shape.kind == "relu":
        module = nn.ReLU()
    elif shape.kind in POOL_KINDS:
        module = (nn.MaxPool3d if shape.kind in VOLUME_KINDS else nn.MaxPool2d)(2, stride=2)
    elif shape.kind == "linear":
        module = nn.Linear(shape.in_channels, shape.out_channels)
    elif shape.kind == "add":
        return (lambda x, other: x + other), []
    elif shape.kind == "slab_batch_norm2d":
        from ddlbench.train.strategies.halo import SlabBatchNorm  # the strategy's own layer

        module = SlabBatchNorm(nn.BatchNorm2d(shape.in_channels), own_group, 1, 0)
    else:
        raise ValueError(f"operator kind {shape.kind!r} unknown")
    module.train()
    if device is not None:
        module.to(device)
    return (lambda x, _other: module(x)), list(module.parameters())


def _input(shape: OperatorShape, generator: torch.Generator, device: torch.device) -> Tensor:
    if shape.kind == "embedding":  # token ids: no gradient
        return torch.randint(0, shape.out_channels, (shape.batch, shape.height), generator=generator).to(device)
    if shape.kind in TOKEN_KINDS or shape.kind in TENSOR_PARALLEL_KINDS:
        x = torch.randn(shape.batch, shape.height, shape.in_channels, generator=generator)
        return x.to(device).requires_grad_()
    if shape.kind == "linear":  # a head's (batch, features), or a transformer's (batch, tokens, features)
        size = (shape.batch, shape.in_channels) if shape.height == 1 else (shape.batch, shape.height, shape.in_channels)
    elif shape.kind in VOLUME_KINDS:
        size = (shape.batch, shape.in_channels, shape.depth, shape.height, shape.width)
    else:
        size = (shape.batch, shape.in_channels, shape.height, shape.width)
    x = torch.randn(*size, generator=generator).to(device)
    first_layer = shape.in_channels == FIRST_LAYER_CHANNELS.get(shape.kind)
    return x.requires_grad_(not first_layer)


def time_operator(
    shape: OperatorShape,
    device: torch.device,
    timer: Timer,
    *,
    warmup: int,
    iterations: int,
    autocast,
    own_group: dist.ProcessGroup | None = None,
    own_mesh: DeviceMesh | None = None,
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(SEED)
    op, params = build_operator(shape, own_group, device, own_mesh)
    x = _input(shape, generator, device)
    other = torch.randn(x.shape, generator=generator).to(device).requires_grad_() if shape.kind == "add" else None
    with autocast():
        y = op(x, other)
    grad = torch.randn(y.shape, generator=generator).to(device=device, dtype=y.dtype)
    held: list[Tensor] = []
    ring = outputs_held(y, device)

    def forward() -> None:
        with autocast():
            held.append(op(x, other))
        if len(held) > ring:
            del held[0]

    def clear() -> None:
        for tensor in (x, other, *params):
            if tensor is not None:
                tensor.grad = None
        forward()

    def backward() -> None:
        held[-1].backward(grad)

    cold = cold_call(shape)

    def evict() -> None:
        evict_caches(device)

    def cleared() -> None:
        clear()
        evict_caches(device)

    forward_s = timer.times(forward, warmup=warmup, iterations=iterations, before=evict if cold else None)
    backward_s = timer.times(backward, warmup=warmup, iterations=iterations, before=cleared if cold else clear)
    entry = {"kind": "operator", "shape": shape.to_dict(), "forward_s": forward_s, "backward_s": backward_s}
    return entry | ({"outputs_held": ring} if ring > 1 else {})


def time_autograd_call(device: torch.device, timer: Timer, *, warmup: int, iterations: int) -> dict[str, list[float]]:
    """backward() through a chain of 1 and of 5 one-element multiplications: the engine's fixed cost per
    call is what the first takes beyond one node, t1 − (t5 − t1)/4 (ddlbench.analysis.machine.operator_timings)."""
    out = {}
    for nodes in (1, 5):
        leaf = torch.ones(1, device=device, requires_grad=True)
        held: list[Tensor] = []

        def before(leaf=leaf, nodes=nodes, held=held) -> None:
            leaf.grad = None
            y = leaf
            for _ in range(nodes):
                y = y * 2.0
            held[:] = [y]

        out[f"chain{nodes}_s"] = timer.times(
            lambda held=held: held[0].backward(), warmup=warmup, iterations=iterations, before=before
        )
    return out


def run_operators(
    point: CalibrationPoint, device: torch.device, probes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every shape's forward and backward times, per precision; one `autograd_call` entry per precision. The
    host probes taken between shapes (module docstring) go into `probes`."""
    probes = [] if probes is None else probes
    world = dist.get_world_size() if dist.is_initialized() else 1
    timer = Timer(device)
    shapes = sample_shapes(
        seed=point.operator_seed,
        per_kind=point.operator_samples,
        max_flop=point.operator_max_flop,
        max_elements=point.operator_max_elements,
    )
    out: list[dict[str, Any]] = []
    counts = _turn_counts(point)
    own_group = own_mesh = None
    if dist.is_initialized():  # every rank creates every group, in the same order
        groups = [dist.new_group([rank]) for rank in range(dist.get_world_size())]
        own_group = groups[dist.get_rank()]
        if any(shape.kind in TENSOR_PARALLEL_KINDS for shape in shapes):
            # each rank its own one-rank mesh: the second dimension of a world × 1 mesh (fsdp_unit_kernel's)
            own_mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("replica", "tp"))["tp"]
    # the optimizer's step by the same turns (ranks at once share the memory bandwidth), before the shapes and
    # again wherever a turn probes the host among them: its samples spread over the point's minutes, as the shapes'
    updater = update_probe(UPDATE_ELEMENTS, device)
    for at_once in counts:
        if _my_turn(at_once):
            out.append(time_update(updater, timer, point.iterations) | {"at_once": at_once, "time": time.time()})
    for precision in point.precisions:
        dtype = DTYPES[precision]

        def autocast(dtype=dtype):
            if dtype == torch.float32:
                return contextlib.nullcontext()
            return torch.autocast(device_type=device.type, dtype=dtype)

        _precision_switch(precision)  # fp32 strict on CUDA, as a training point of that precision runs
        for at_once in counts:
            if _my_turn(at_once):
                chains = time_autograd_call(device, timer, warmup=point.warmup, iterations=point.iterations)
                entry = {"kind": "autograd_call", "precision": precision, "at_once": at_once, **chains}
                out.append(entry | {"time": time.time()})
        # every shape in ROUNDS passes over all of them, a share of the iterations each: a shape's times
        # then come from moments a minute apart, so a spell of load on a shared host weighs on all shapes
        # alike rather than on the few it fell on
        per_round = max(1, -(-point.iterations // ROUNDS))
        for _ in range(ROUNDS):
            for index, shape in enumerate(shapes):
                # a shape past max_elements (operator_shapes.LARGE_KINDS; a classifier Linear's weights) takes
                # 0.05-0.5 s a call: one untimed call and LARGE_ITERATIONS_SHARE of the timed ones (its calls vary
                # by a few % at that length)
                large = max(largest_elements(shape), shape.linear_weights) > point.operator_max_elements
                for at_once in counts:
                    if not _my_turn(at_once):
                        continue
                    if index % PROBE_EVERY == PROBE_EVERY // 2:
                        turn = "alone" if at_once == 1 and world > 1 else "all" if at_once == world else "some"
                        probe = probe_host(device, all_reduce=False)
                        probes.append(probe | {"when": "during", "turn": turn, "at_once": at_once})
                        if precision == point.precisions[0]:
                            entry = time_update(updater, timer, UPDATES_AMONG_SHAPES)
                            out.append(entry | {"at_once": at_once, "time": time.time()})
                    try:
                        entry = time_operator(
                            shape,
                            device,
                            timer,
                            warmup=min(1, point.warmup) if large else point.warmup,
                            iterations=max(1, round(per_round * LARGE_ITERATIONS_SHARE)) if large else per_round,
                            autocast=autocast,
                            own_group=own_group,
                            own_mesh=own_mesh,
                        )
                    except (RuntimeError, NotImplementedError) as exc:  # a dtype the device's kernels refuse
                        entry = {"kind": "operator", "shape": shape.to_dict(), "error": str(exc).splitlines()[0][:300]}
                    out.append(entry | {"precision": precision, "at_once": at_once, "time": time.time()})
    if dist.is_initialized():
        dist.barrier()  # the last turn's idle ranks wait for it
    return out


# the parameters the optimizer's step is timed over in each turn: the compute point's 64 MiB of float32
# (benchmarks/analytic/calibration.yaml's memory_bytes), past the last-level cache of the hosts measured
UPDATE_ELEMENTS = 16 * 2**20
UPDATES_AMONG_SHAPES = 2  # timed steps at each of a turn's probes among the shapes (about 40 a pass of 977)


def time_update(updater: tuple[torch.optim.Optimizer, int], timer: Timer, iterations: int) -> dict[str, Any]:
    """`iterations` of the optimizer's step as training runs it (kernels.update_probe, `updater`) over
    UPDATE_ELEMENTS parameters, timed by the ranks of one turn at once: its step streams every parameter, gradient
    and momentum value through memory, so ranks updating at once share the node's bandwidth
    (ddlbench.analysis.analytic.compute.update_per_param_s prices two ranks' update by the ratio of the turns)."""
    optimizer, tensors = updater
    times = timer.times(optimizer.step, warmup=0, iterations=iterations)
    return {"kind": "update", "elements": UPDATE_ELEMENTS, "tensors": tensors, "times_s": times}


def _turn_counts(point: CalibrationPoint) -> tuple[int, ...]:
    """The rank counts that time each shape in turn: the point's `operator_at_once` (each at most its
    ranks), or all its ranks at once."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return tuple(k for k in point.operator_at_once if k <= world) or (world,)


def _my_turn(at_once: int) -> bool:
    """After a barrier of all ranks (the ranks start each turn together): whether this rank times in a
    turn of `at_once` ranks (ranks 0..at_once−1); the others go on to the next barrier and wait there."""
    if not dist.is_initialized():
        return True
    dist.barrier()
    return dist.get_rank() < at_once
