"""Compute time of each block of a model on one rank: from measured layer timings, from per-operator fits
over shapes, or from the model table and the machine's calibrated rates.

**Layer timings** (the machine file's `layer_timings`, measured by `ddlbench calibrate` with this model,
precision and threads, every rank of a node timing it at once): a block's forward or backward time at a
micro-batch b is its fitted line α + β·b. ParaDL's "profall" mode did the same with per-sample times.

**From operator fits** (the machine file's `operator_timings`: generic convolutions, norms, activations,
pools and linear layers timed over drawn shapes by the calibration, ddlbench.analysis.analytic.operators):
per layer its operator's fitted forward and backward time at its shape and the micro-batch, times its
calls; a residual block (one holding a `shortcut` layer) adds a sum of its output forward and backward.
The fits taken are those timed with as many ranks at once as the point computes on a node (`sharing`).
A layer of a kind the fits do not cover (grouped convolutions, volumes, sequences) falls back to the
roofline below. A strategy that changes a layer's shape on a rank (a filter split's 1/p of the output
channels, a spatial slab's rows) passes the layers as that rank runs them (`layers`), so each is costed
at its real shape: a layer's time does not shrink with its FLOPs when its shape shrinks.

**From rates** (a datasheet machine, or one calibrated without operators): per layer a roofline,
t = max(FLOPs / rate, bytes / memory bandwidth), with
- FLOPs = the table's forward (or backward) FLOPs per sample × b, at the conv rate for convolutions and
  the matmul rate otherwise (ddlbench.analysis.analytic.machine_model.MachineModel.flop_rate);
- bytes = the layer's input and output per sample × b × 4 (fp32; the backward reads and writes twice
  that) + its weights once (forward) or twice (backward: read, and the gradient written).
Layers without FLOPs (activations, norms, pools) are pure memory traffic. Rates were measured with the
machine's threads per rank; a point with other threads scales them linearly (a note says so).
- loss: the last block's output × b read and written about 3 times, forward and backward (bytes / bw;
  with operator fits: two elementwise passes over the logits forward and two backward);
- update: SGD with momentum, `torch.optim.SGD(momentum=0.9)` as ddlbench trains, per parameter element:
  the calibration's own time of that step (the machine file's `update_s_per_param`: the step timed over
  64 MiB of parameters in 16 tensors, ddlbench.train.calibration.kernels), and where a machine file lacks
  it (a datasheet, a file from before it), the momentum buffer read, scaled, added to the gradient and
  written, then the parameter read and written: 6 × 4 B = 24 B per element at the memory bandwidth. That
  rule is off by the step's own passes and the copy probe's spread: on this 2-core host the probe read
  6.4 and 11.8 GB/s an hour apart (2.0-3.8 ns per element at 24 B), and the step itself ran at
  1.5-1.75 ns per element over 67-268 M parameters in 16-400 tensors (2026-12-05).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.operators import FREE_TYPES, OperatorModel, elementwise_call, layer_call
from ddlbench.catalog.model_table import LayerRow, ModelTable

UPDATE_BYTES_PER_PARAM = 24  # SGD with momentum, fp32: see the module docstring
LOSS_PASSES = 6  # the loss's forward and backward each read and write the logits about 3 times
FP32 = 4


@dataclass(frozen=True, kw_only=True)
class BlockTimes:
    """One rank's compute at one micro-batch: seconds per block, forward and backward, in model order."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    loss_s: float  # forward + backward of the loss on the last block's output
    update_per_param_s: float  # optimizer step, per parameter element
    source: str  # "layer_timings", "operators" or "rates (…)"
    notes: tuple[str, ...] = ()

    def forward_of(self, blocks: range | Sequence[int]) -> float:
        return sum(self.forward_s[i] for i in blocks)

    def backward_of(self, blocks: range | Sequence[int]) -> float:
        return sum(self.backward_s[i] for i in blocks)


def block_times(
    table: ModelTable,
    machine: MachineModel,
    *,
    batch: float,
    precision: str,
    threads: int,
    scale: Sequence[float] | None = None,
    sharing: int | None = None,
    layers: Sequence[LayerRow] | None = None,
) -> BlockTimes:
    """Seconds per block at micro-batch `batch` on one rank. `scale[i]` multiplies block i's work: the
    share a rank computes when a strategy splits the block (1 − s + s/p for a block whose FLOP share s
    is cut into p parts); default all 1. `sharing`: ranks running at once on one node, to pick the
    layer timings (or operator fits) measured under the same contention for cores and memory bandwidth.
    `layers`: the layers as this rank runs them (shapes cut by the strategy); with operator fits they are
    costed at those shapes and `scale` is not applied; without, `scale` is (layer timings or roofline)."""
    factors = list(scale) if scale is not None else [1.0] * len(table.blocks)
    timed = machine.layer_timings_for(table.model, table.dataset, table.options, precision, threads, sharing=sharing)
    operators = machine.operator_model_for(precision, threads, sharing=sharing)
    if timed is not None and len(timed.forward) == len(table.blocks):
        params = max(1, table.params)
        return host_floor(
            table,
            machine,
            BlockTimes(
                forward_s=tuple(fit.at(batch) * f for fit, f in zip(timed.forward, factors, strict=True)),
                backward_s=tuple(fit.at(batch) * f for fit, f in zip(timed.backward, factors, strict=True)),
                loss_s=timed.loss.at(batch),
                update_per_param_s=timed.update_s / params,
                source="layer_timings",
                notes=(f"layer timings: {timed.ranks_per_node} rank(s) × {timed.threads} thread(s) at once",),
            ),
        )
    if operators is not None:
        times = _from_operators(table, machine, operators, layers, batch=batch, precision=precision, threads=threads)
        if layers is None and scale is not None:  # a strategy that scales blocks rather than reshaping layers
            times = replace(
                times,
                forward_s=tuple(t * f for t, f in zip(times.forward_s, factors, strict=True)),
                backward_s=tuple(t * f for t, f in zip(times.backward_s, factors, strict=True)),
            )
        return host_floor(table, machine, times)
    return host_floor(
        table, machine, _from_rates(table, machine, batch=batch, precision=precision, threads=threads, factors=factors)
    )


BACKWARD_ISSUES = 2  # a layer's backward issues about twice its forward's kernels (input and weight gradients)


def host_floor(table: ModelTable, machine: MachineModel, times: BlockTimes) -> BlockTimes:
    """On a CUDA machine whose file has `cuda_host`: each block's forward at least n × h and its backward at
    least BACKWARD_ISSUES × n × h seconds, n the block's layers (FREE_TYPES left out) and h the host's time
    to issue one layer's forward. An eager step issues its kernels from one host thread; a small model on a
    fast GPU waits on that thread (resnet20 on an H200 took 11-13 ms a step at batch 32 to 128). The floor
    is not scaled by a strategy's share of a block: a rank issues every layer of its blocks whatever their
    width. Other machines: `times` as they are."""
    host = machine.cuda_host
    if machine.device_kind != "cuda" or host is None or len(times.forward_s) != len(table.blocks):
        return times
    layers = [0] * len(table.blocks)
    for layer in table.layers:
        if layer.type not in FREE_TYPES:
            layers[layer.block] += 1
    forward = tuple(max(t, n * host.per_layer_s) for t, n in zip(times.forward_s, layers, strict=True))
    backward = tuple(
        max(t, n * BACKWARD_ISSUES * host.per_layer_s) for t, n in zip(times.backward_s, layers, strict=True)
    )
    bound = sum(f > t for f, t in zip(forward, times.forward_s, strict=True))
    bound += sum(b > t for b, t in zip(backward, times.backward_s, strict=True))
    note = f"host floor {host.per_layer_s * 1e6:.1f} µs per layer issued: {bound} of {2 * len(layers)} block passes"
    return replace(times, forward_s=forward, backward_s=backward, notes=(*times.notes, note))


def layer_times(
    table: ModelTable, machine: MachineModel, *, batch: float, precision: str, threads: int
) -> tuple[list[tuple[float, float]], set[str], list[str]]:
    """Each layer's roofline (forward, backward) seconds at `batch`, the rates used, and notes."""
    notes = []
    speedup = 1.0
    if machine.device_kind == "cpu" and threads != machine.threads_per_rank:
        speedup = threads / machine.threads_per_rank
        notes.append(f"rates measured with {machine.threads_per_rank} thread(s), scaled ×{speedup:g} to {threads}")
    bandwidth = machine.memory_bandwidth_bytes_per_s
    if not bandwidth:
        bandwidth = math.inf
        notes.append("no memory bandwidth in the machine file: memory-bound layers cost nothing")
    times = []
    used: set[str] = set()
    for layer in table.layers:
        rate, which = machine.flop_rate(layer.type, precision)
        used.add(which)
        rate *= speedup
        activations = (math.prod(layer.input_shape) + math.prod(layer.output_shape)) * FP32 * batch
        weights = layer.params * FP32
        forward = max(layer.forward_flops * batch / rate, (activations + weights) / bandwidth)
        backward = max(layer.backward_flops * batch / rate, (2 * activations + 2 * weights) / bandwidth)
        times.append((forward, backward))
    return times, used, notes


def split_time_shares(
    table: ModelTable, machine: MachineModel, names: set[str], *, batch: float, precision: str, threads: int
) -> list[float]:
    """Per block, the share of its (roofline) time spent in the layers `names`: what a strategy that
    splits those layers divides. Not their share of FLOPs: norms and activations have next to no FLOPs
    but move as many bytes as a convolution's output, and they stay whole on every rank."""
    times, _, _ = layer_times(table, machine, batch=batch, precision=precision, threads=threads)
    total = [0.0] * len(table.blocks)
    split = [0.0] * len(table.blocks)
    for layer, (forward, backward) in zip(table.layers, times, strict=True):
        total[layer.block] += forward + backward
        if layer.name in names:
            split[layer.block] += forward + backward
    return [s / t if t > 0 else 0.0 for s, t in zip(split, total, strict=True)]


def _from_rates(
    table: ModelTable, machine: MachineModel, *, batch: float, precision: str, threads: int, factors: list[float]
) -> BlockTimes:
    times, used, notes = layer_times(table, machine, batch=batch, precision=precision, threads=threads)
    forward = [0.0] * len(table.blocks)
    backward = [0.0] * len(table.blocks)
    for layer, (f, b) in zip(table.layers, times, strict=True):
        forward[layer.block] += f
        backward[layer.block] += b
    bandwidth = machine.memory_bandwidth_bytes_per_s or math.inf
    last = table.blocks[-1]
    loss = LOSS_PASSES * math.prod(last.output_shape) * FP32 * batch / bandwidth
    return BlockTimes(
        forward_s=tuple(t * f for t, f in zip(forward, factors, strict=True)),
        backward_s=tuple(t * f for t, f in zip(backward, factors, strict=True)),
        loss_s=loss,
        update_per_param_s=update_per_param_s(machine),
        source=f"rates ({', '.join(sorted(used))}, memory bandwidth)",
        notes=tuple(notes),
    )


def residual_sums(layers: Sequence[LayerRow]) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The residual blocks among `layers`: a module holding a `shortcut` child adds it to its main path,
    an operation no layer row counts. Per such module path, its block and the shortcut's output shape
    (the shape of the sum)."""
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    for layer in layers:
        parts = layer.name.split(".")
        if "shortcut" in parts:
            owner = ".".join(parts[: parts.index("shortcut")])
            out[owner] = (layer.block, layer.output_shape)  # the last row of the shortcut: its output
    return out


def operator_layer_s(operators: OperatorModel, layer: LayerRow, batch: float) -> tuple[float, float] | None:
    """A layer's (forward, backward) seconds at `batch` from the operator fits; None when its type has no
    fitted kind (the roofline costs it); (0, 0) for views and no-ops."""
    if layer.type in FREE_TYPES:
        return 0.0, 0.0
    # a layer whose backward computes no input gradient (a model's first) counts its weights' FLOPs only
    input_grad = layer.backward_flops >= 1.5 * layer.forward_flops if layer.forward_flops else True
    call = layer_call(
        layer.type,
        layer.input_shape,
        layer.output_shape,
        layer.weight_shape,
        input_grad=input_grad,
        head_features=layer.head_features,
    )
    if call is None:
        return None
    times = operators.seconds(call, batch)
    if times is None:
        return None
    return times[0] * layer.calls, times[1] * layer.calls


# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): an allocation at least this large is
# always mapped anew and handed back to the kernel when freed, so its pages fault on every first touch; smaller
# ones come from the heap, which keeps what a step frees for the next (the threshold rises to the largest block
# freed so far, up to this size)
MAPPED_ANEW_BYTES = 32 * 2**20


def mapped_anew_bytes(layers: Sequence[LayerRow]) -> float:
    """The fp32 bytes of the layers' parameters whose gradients (and the buffers a strategy sizes to one
    parameter) are allocations mapped anew every time (MAPPED_ANEW_BYTES): a layer's weight at or above it.
    VGG-11's 25088 → 4096 and 4096 → 4096 layers (411 and 67 MB); no layer of a ResNet or GPT-2 small
    (9.4 MB at most)."""
    return float(sum(layer.params * FP32 for layer in layers if layer.params * FP32 >= MAPPED_ANEW_BYTES))


def elementwise_s(
    machine: MachineModel, elements: float, *, precision: str, threads: int, sharing: int | None
) -> float:
    """Seconds of one pass over `elements` values that reads and writes them (a copy, a cat, a zero fill,
    an add) in memory already held: the operator fits' residual add where the machine has them, without its
    page term (the calibration's add allocates its output; a caller whose pass writes into memory mapped anew
    adds its first touch itself, at the machine's `first_touch_s_per_byte`), else bytes ÷ memory bandwidth."""
    operators = machine.operator_model_for(precision, threads, sharing=sharing)
    if operators is not None and elements > 0:
        times = operators.seconds(elementwise_call(int(elements)), 1.0, allocates=False)
        if times is not None:
            return times[0]
    bandwidth = machine.memory_bandwidth_bytes_per_s or math.inf
    return 3 * elements * FP32 / bandwidth


def _from_operators(
    table: ModelTable,
    machine: MachineModel,
    operators: OperatorModel,
    layers: Sequence[LayerRow] | None,
    *,
    batch: float,
    precision: str,
    threads: int,
) -> BlockTimes:
    rows = list(layers) if layers is not None else list(table.layers)
    fitted = [operator_layer_s(operators, layer, batch) for layer in rows]
    used: set[str] = set()
    roofline: list[tuple[float, float] | None] = [None] * len(rows)
    if any(times is None for times in fitted):  # rates only where a layer has no fit (a datasheet may lack them)
        roofline_table = table if layers is None else _with_layers(table, rows)
        roofline, used, _ = layer_times(roofline_table, machine, batch=batch, precision=precision, threads=threads)
    forward = [0.0] * len(table.blocks)
    backward = [0.0] * len(table.blocks)
    fallback = []
    for layer, times, rates in zip(rows, fitted, roofline, strict=True):
        if times is None:
            times = rates
            fallback.append(layer.type)
        forward[layer.block] += times[0]
        backward[layer.block] += times[1]
    for block, shape in residual_sums(rows).values():
        call = elementwise_call(int(math.prod(shape)), channels=shape[0] if shape else 1)
        add = operators.seconds(call, batch)
        if add is not None:
            forward[block] += add[0]
            backward[block] += add[1]
    bandwidth = machine.memory_bandwidth_bytes_per_s or math.inf
    last = table.blocks[-1]
    # cross-entropy: log-softmax and the loss forward, their two gradients backward, each a pass over the logits
    logits = operators.seconds(elementwise_call(int(math.prod(last.output_shape))), batch)
    loss = 2 * sum(logits) if logits else LOSS_PASSES * math.prod(last.output_shape) * FP32 * batch / bandwidth
    source = f"operator fits ({operators.ranks_per_node} rank(s) at once)"
    notes = [operators.describe()]
    if fallback:
        kinds = ", ".join(sorted(set(fallback)))
        source += f" + rates ({', '.join(sorted(used))}) for {kinds}"
        notes.append(f"no operator fit for {kinds}: roofline from rates")
    return BlockTimes(
        forward_s=tuple(forward),
        backward_s=tuple(backward),
        loss_s=loss,
        update_per_param_s=update_per_param_s(machine, operators.ranks_per_node),
        source=source,
        notes=tuple(notes),
    )


def update_per_param_s(machine: MachineModel, sharing: int | None = None) -> float:
    """Seconds of the optimizer's step per parameter element (the module docstring's update): the
    calibration's time of the step where the machine file has it, else 24 B at the memory bandwidth. With
    `sharing` ranks of a node updating at once, times the ratio of the operators point's step timed by that
    many ranks at once to its step timed by one alone (seconds apart, under the same load: MachineModel.
    update_at_once), where it has both: the step streams parameters, gradients and momentum through memory, and
    ranks at once share its bandwidth (vgg11's ddp on two ranks of the 2-core host measured its update at 1.7×
    one rank's, alexnet's at 1.4×: the forty-fifth set, seen)."""
    alone = machine.update_s_per_param or UPDATE_BYTES_PER_PARAM / (machine.memory_bandwidth_bytes_per_s or math.inf)
    timed = machine.update_at_once
    if sharing and sharing > 1 and timed.get(sharing) and timed.get(1):
        return alone * timed[sharing] / timed[1]
    return alone


def _with_layers(table: ModelTable, layers: Sequence[LayerRow]) -> ModelTable:
    return replace(table, layers=tuple(layers))


def layer_costs(
    table: ModelTable,
    machine: MachineModel,
    layers: Sequence[LayerRow],
    *,
    batch: float,
    precision: str,
    threads: int,
    sharing: int | None = None,
) -> list[tuple[float, float]]:
    """Per row of `layers` (a rank's layers, shapes as it runs them), its (forward, backward) seconds at
    `batch`: from the operator fits where the machine has them (a residual sum counted on the last row of
    its shortcut); else a timed block's time shared among its rows as their rooflines are; else the
    roofline. What a strategy that interleaves per-layer communication with compute costs each layer at."""
    rows = list(layers)
    operators = machine.operator_model_for(precision, threads, sharing=sharing)
    fitted = [operator_layer_s(operators, layer, batch) for layer in rows] if operators is not None else []
    if operators is None or any(times is None for times in fitted):
        roofline, _, _ = layer_times(
            _with_layers(table, rows), machine, batch=batch, precision=precision, threads=threads
        )
    else:
        roofline = [None] * len(rows)
    if operators is not None:
        costs = [times or rates for times, rates in zip(fitted, roofline, strict=True)]
        last_of = {}
        for index, layer in enumerate(rows):
            parts = layer.name.split(".")
            if "shortcut" in parts:
                last_of[".".join(parts[: parts.index("shortcut")])] = index
        for owner, (_, shape) in residual_sums(rows).items():
            add = operators.seconds(elementwise_call(int(math.prod(shape)), channels=shape[0] if shape else 1), batch)
            if add is not None:
                index = last_of[owner]
                costs[index] = (costs[index][0] + add[0], costs[index][1] + add[1])
        return costs
    timed = machine.layer_timings_for(table.model, table.dataset, table.options, precision, threads, sharing=sharing)
    if timed is not None and len(timed.forward) == len(table.blocks):
        blocks = block_times(table, machine, batch=batch, precision=precision, threads=threads, sharing=sharing)
        forward_total = [0.0] * len(table.blocks)
        backward_total = [0.0] * len(table.blocks)
        for layer, (f, b) in zip(rows, roofline, strict=True):
            forward_total[layer.block] += f
            backward_total[layer.block] += b
        # each row's share of its block's roofline, of the block's timed time at the whole shapes
        whole, _, _ = layer_times(table, machine, batch=batch, precision=precision, threads=threads)
        whole_f = [0.0] * len(table.blocks)
        whole_b = [0.0] * len(table.blocks)
        for layer, (f, b) in zip(table.layers, whole, strict=True):
            whole_f[layer.block] += f
            whole_b[layer.block] += b
        return [
            (
                blocks.forward_s[layer.block] * f / whole_f[layer.block] if whole_f[layer.block] else 0.0,
                blocks.backward_s[layer.block] * b / whole_b[layer.block] if whole_b[layer.block] else 0.0,
            )
            for layer, (f, b) in zip(rows, roofline, strict=True)
        ]
    return list(roofline)
