"""What the analytical model knows of a machine: compute rates, collective costs, layer timings, memory.

Read from a machine file (ddlbench.analysis.machine.machine_file: measured by `ddlbench calibrate`, or written by
hand from datasheets for hardware the user does not own yet). Every figure the model takes from it is
named with where it came from, so a prediction can say what it rests on.

**Collectives.** A collective of S bytes (the calibration's convention: the vector all-reduced or
broadcast, the gathered or scattered whole, the message sent) over p ranks on n nodes costs, in order
of preference:
1. the machine's own α–β fit of that operation at p ranks on n nodes: t = α + β·S; where the calibration
   timed it in busy mode (each call after the rank's own compute, no barrier: what a call costs inside a
   step, a late peer included, as a mean), that fit, t = α + β·S + κ·X with X the rank's compute since
   its previous call — on a shared CPU gloo's calls after a barrier take 0.05–0.2 ms or 2–4 ms, in
   proportions that drift with the load, so their median says little of what a step pays (2 ranks here,
   busy: about 1.5 ms an all-reduce, 0.7 ms an all-gather, as a filter step's recorded calls);
2. a fit of the operation at another rank count p0 (same side of the node boundary), moved to p by
   the ring algorithm (Thakur, Rabenseifner and Gropp, IJHPCA 2005): a ring all-reduce is 2(p−1) steps
   of S/p bytes, an all-gather or reduce-scatter (p−1) steps of S/p, so per step α_step = α/steps(p0)
   and the per-byte cost β_bus = β/bus(p0) with bus(p) = 2(p−1)/p resp. (p−1)/p; then
   t = steps(p)·α_step + bus(p)·S·β_bus. Broadcast is taken as a binomial tree, ⌈log2 p⌉ steps of S;
3. the link's point-to-point α–β (send_recv) with the same ring formulas.
A datasheet gives no latency (alpha_s null): it is taken as 0 and the prediction says so. A fit whose
slope came out negative and was set to 0 (`clamped: beta`, ddlbench.analysis.machine.fit) resolved no bandwidth:
any other fit of the same rank is preferred to it, and a prediction that still rests on it says so.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlbench.analysis.analytic.memory import CudaMemoryTerms
from ddlbench.analysis.analytic.operators import OperatorModel, fit_operator_model
from ddlbench.analysis.machine.machine_file import read_machine
from ddlbench.errors import DdlbenchError

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")
# torch layer types whose FLOPs run at the convolution rate; every other FLOP runs at the matmul rate
CONV_TYPES = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d", "ConvTranspose3d")


def ring_steps(op: str, ranks: int) -> int:
    """Messages each rank sends in a ring (all-reduce, all-gather, reduce-scatter) or a binomial tree
    (broadcast); send_recv is one message."""
    if ranks <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (ranks - 1)
    if op in ("all_gather", "reduce_scatter"):
        return ranks - 1
    if op == "broadcast":
        return math.ceil(math.log2(ranks))
    return 1


def bus_share(op: str, ranks: int) -> float:
    """Bytes each rank sends, as a multiple of S: 2(p−1)/p for a ring all-reduce, (p−1)/p for all-gather
    and reduce-scatter, ⌈log2 p⌉ for a tree broadcast (the root's S each step), 1 for send_recv."""
    if ranks <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    if op == "broadcast":
        return float(math.ceil(math.log2(ranks)))
    return 1.0


@dataclass(frozen=True, kw_only=True)
class CollectiveCost:
    """The cost of one collective at a group size: t(S) = steps·α_step + share·S·β (seconds)."""

    op: str
    ranks: int
    alpha_s: float  # the whole collective's latency at this size of group (s)
    beta_s_per_byte: float  # per byte of S (s/B)
    source: str  # "measured <op> p=…", "ring from <op> p=…", "ring from link <name>"
    wait_per_compute_s: float = 0.0  # busy fits: seconds waited per second the rank computed before the call
    # the longest compute before a call that the busy fit saw (the calibration's bursts, nominally 0.5 and 4 ms,
    # measured 0.3-3.2 ms); the wait is κ·min(X, this): what the fit measured, not a line drawn on to a layer's
    # backward 100 times as long
    wait_burst_max_s: float = math.inf

    def time_s(self, nbytes: float, *, after_s: float = 0.0) -> float:
        """Seconds of one call on S = `nbytes`, `after_s` seconds of the rank's compute after its last one:
        α + β·S + κ·min(after_s, the longest burst the busy fit saw). The wait is not drawn on past the bursts
        timed (about 3 ms): a peer's lateness after equal work does not grow without bound with the work (vgg11's
        spatial halves on 3×512² at batch 2, 16 exchanges after 10-270 ms of compute each, waited 20-73 ms in
        all where κ·X drawn on gave 550 ms: docs/analytic.md, "A peer's lateness, drawn on")."""
        if self.ranks <= 1 or nbytes <= 0:
            return 0.0
        wait = self.wait_per_compute_s * min(after_s, self.wait_burst_max_s)
        return self.alpha_s + self.beta_s_per_byte * nbytes + wait


@dataclass(frozen=True, kw_only=True)
class BlockFit:
    """A timed block's time against the batch: between timed batch sizes, the straight line through
    the two nearest medians (exact at a timed size: the CPU's efficiency changes with the batch, and a
    single line missed by up to 16 %); outside them, the fitted line t(b) = alpha_s + beta_s_per_sample·b."""

    alpha_s: float
    beta_s_per_sample: float
    points: tuple[tuple[float, float], ...] = ()  # (batch size, median seconds), ascending

    def at(self, batch: float) -> float:
        pts = self.points
        if len(pts) >= 2 and pts[0][0] <= batch <= pts[-1][0]:
            for (b0, t0), (b1, t1) in itertools.pairwise(pts):
                if b0 <= batch <= b1:
                    return t0 + (t1 - t0) * (batch - b0) / (b1 - b0) if b1 > b0 else t0
        return max(0.0, self.alpha_s + self.beta_s_per_sample * batch)


@dataclass(frozen=True, kw_only=True)
class LayerTimings:
    """Measured forward/backward time of each block of one model, at the threads and ranks it ran with."""

    model: str
    dataset: str
    options: tuple[tuple[str, str], ...]
    precision: str
    threads: int
    ranks_per_node: int
    forward: tuple[BlockFit, ...]
    backward: tuple[BlockFit, ...]
    loss: BlockFit
    update_s: float


def _fit(node: Mapping[str, Any] | None, batch_sizes: list[float] = (), figures: list[Any] | None = None) -> BlockFit:
    node = node or {}
    values = [f.get("value") if isinstance(f, Mapping) else None for f in (figures or [])]
    points = tuple(sorted((float(b), float(v)) for b, v in zip(batch_sizes, values, strict=False) if v is not None))
    return BlockFit(
        alpha_s=float(node.get("alpha_s") or 0.0),
        beta_s_per_sample=float(node.get("beta_s_per_sample") or 0.0),
        points=points,
    )


def _layer_timings(entry: Mapping[str, Any]) -> LayerTimings:
    blocks = entry.get("blocks") or []
    update = entry.get("update_s") or {}
    sizes = [float(b) for b in entry.get("batch_sizes") or ()]
    return LayerTimings(
        model=str(entry["model"]),
        dataset=str(entry["dataset"]),
        options=tuple(sorted((str(k), str(v)) for k, v in (entry.get("options") or {}).items())),
        precision=str(entry.get("precision", "fp32")),
        threads=int(entry.get("threads", 1)),
        ranks_per_node=int(entry.get("ranks_per_node", 1)),
        forward=tuple(_fit(block.get("forward_fit"), sizes, block.get("forward_s")) for block in blocks),
        backward=tuple(_fit(block.get("backward_fit"), sizes, block.get("backward_s")) for block in blocks),
        loss=_fit(entry.get("loss_fit"), sizes, entry.get("loss_s")),
        update_s=float(update.get("value") or 0.0),
    )


def _busy_or_barrier(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """A collective's figures as a step pays them: its busy-mode fit where the calibration made one (calls
    after each rank's own compute, peers' lateness included: ddlbench.train.calibration.kernels), else its fit
    after a barrier."""
    busy = entry.get("busy")
    if not busy or busy.get("alpha_s") is None:
        return entry
    return {
        **entry,
        "alpha_s": busy["alpha_s"],
        "beta_s_per_byte": busy["beta_s_per_byte"],
        "wait_per_compute_s": busy.get("wait_per_compute_s", 0.0),
        "wait_burst_max_s": max((float(row["burst_s"]) for row in busy.get("curve") or ()), default=None),
        "clamped": None,
        "mode": " (busy)",
    }


def _burst_max(fit: Mapping[str, Any]) -> float:
    """The longest compute before a call that a busy fit saw (its curve's bursts); unbounded for a fit after a
    barrier, whose κ is 0."""
    value = fit.get("wait_burst_max_s")
    return float(value) if value is not None else math.inf


def _pooled_on_one_host(fits: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A calibration on one host ran its "nodes" there too: fits of the same library, operation and ranks
    measured the same link under different layouts, so each is replaced by their mean (α, β, κ), which
    halves the noise of gloo's bimodal call times (0.2 ms or 3.5 ms a call, in proportions that drift)."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for c in fits:
        groups.setdefault((str(c.get("library", "")).split()[0], int(c.get("ranks", 0))), []).append(c)
    out = []
    for c in fits:
        same = groups[(str(c.get("library", "")).split()[0], int(c.get("ranks", 0)))]
        if len(same) == 1 or c.get("clamped") == "beta":
            out.append(c)
            continue
        mean = {
            key: sum(float(other.get(key) or 0.0) for other in same) / len(same)
            for key in ("alpha_s", "beta_s_per_byte", "wait_per_compute_s")
        }
        bursts = [float(other["wait_burst_max_s"]) for other in same if other.get("wait_burst_max_s") is not None]
        if bursts:
            mean["wait_burst_max_s"] = max(bursts)
        out.append({**c, **mean, "mode": f"{c.get('mode', '')} (mean of {len(same)} layouts on one host)"})
    return out


_FITTED: dict[int, tuple[Mapping[str, Any], OperatorModel]] = {}
_FITTED_KEPT = 64  # entries whose fits are kept (a process reads a few machine files, each a few entries)


def _fitted(entry: Mapping[str, Any]) -> OperatorModel:
    """`entry`'s operator fits, fitted once per entry object: copies of a machine model (dataclasses.replace,
    as the GPU host floor's grid makes one per value tried) share their entries, and so their fits. Each fit
    times every shape left out in turn, so fitting anew per copy cost seconds per prediction."""
    held = _FITTED.get(id(entry))
    if held is None or held[0] is not entry:  # the entry is held beside its fits, so its id is not reused
        if len(_FITTED) >= _FITTED_KEPT:
            _FITTED.pop(next(iter(_FITTED)))
        held = _FITTED[id(entry)] = (entry, fit_operator_model(entry))
    return held[1]


class _LazyFits(dict):
    """Operator fits by entry index, each fitted the first time it is asked for."""

    def __init__(self, entries: tuple[Mapping[str, Any], ...]) -> None:
        super().__init__()
        self.entries = entries

    def __missing__(self, index: int) -> OperatorModel:
        model = self[index] = _fitted(self.entries[index])
        return model


@dataclass(frozen=True, kw_only=True)
class FsdpUnitCosts:
    """A machine file's `fsdp_units` entry (ddlbench.analysis.machine.fsdp_units): what FSDP2 adds to a
    step per unit it shards, its collectives included, as timed on a toy at `ranks` ranks on `nodes` nodes.
    Each phase: seconds = per_unit_s + per_tensor_s · tensors + per_byte_s · bytes (the unit's unsharded
    parameters); the update: per_tensor_s per parameter tensor of the model."""

    ranks: int
    nodes: int
    forward: tuple[float, float, float]  # per_unit_s, per_tensor_s, per_byte_s
    backward: tuple[float, float, float]
    update_per_tensor_s: float
    point_id: str = ""

    def forward_s(self, tensors: int, nbytes: float) -> float:
        return _unit_cost(self.forward, tensors, nbytes)

    def backward_s(self, tensors: int, nbytes: float) -> float:
        return _unit_cost(self.backward, tensors, nbytes)

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> FsdpUnitCosts:
        def terms(phase: str) -> tuple[float, float, float]:
            node = entry.get(phase) or {}
            return tuple(float(node.get(key) or 0.0) for key in ("per_unit_s", "per_tensor_s", "per_byte_s"))

        return cls(
            ranks=int(entry["ranks"]),
            nodes=int(entry["nodes"]),
            forward=terms("forward"),
            backward=terms("backward"),
            update_per_tensor_s=float((entry.get("update") or {}).get("per_tensor_s") or 0.0),
            point_id=str(entry.get("point_id", "")),
        )


@dataclass(frozen=True, kw_only=True)
class SpatialLayerCosts:
    """A machine file's `spatial_layers` entry (ddlbench.analysis.machine.spatial_layers): what spatial
    parallelism adds per windowed layer with a halo and the batch norm after it, beyond the plain layers on
    one slab, as timed on a toy at `ranks` ranks on `nodes` nodes, its halo exchanges, norm collectives,
    copies and waits included. Each phase: seconds = per_layer_s + per_byte_s · bytes (one rank's input
    slab of the layer, float32)."""

    ranks: int
    nodes: int
    forward: tuple[float, float]  # per_layer_s, per_byte_s
    backward: tuple[float, float]
    point_id: str = ""

    def forward_s(self, slab_bytes: float) -> float:
        return self.forward[0] + self.forward[1] * slab_bytes

    def backward_s(self, slab_bytes: float) -> float:
        return self.backward[0] + self.backward[1] * slab_bytes

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> SpatialLayerCosts:
        def terms(phase: str) -> tuple[float, float]:
            node = entry.get(phase) or {}
            return float(node.get("per_layer_s") or 0.0), float(node.get("per_byte_s") or 0.0)

        return cls(
            ranks=int(entry["ranks"]),
            nodes=int(entry["nodes"]),
            forward=terms("forward"),
            backward=terms("backward"),
            point_id=str(entry.get("point_id", "")),
        )


def _unit_cost(terms: tuple[float, float, float], tensors: int, nbytes: float) -> float:
    per_unit, per_tensor, per_byte = terms
    return per_unit + per_tensor * tensors + per_byte * nbytes


@dataclass(frozen=True, kw_only=True)
class CudaHostTerms:
    """A machine file's `cuda_host`: the host's share of an eager CUDA step. The rank's thread issues every
    layer's kernels one after the other; where that takes longer than the GPU runs them, the GPU waits,
    and a block's time is the issue time, not its kernels' (ddlbench.analysis.analytic.compute.host_floor)."""

    per_layer_s: float  # host seconds to issue one layer's forward (its backward: BACKWARD_ISSUES times as many)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CudaHostTerms | None:
        if not data or not data.get("per_layer_s"):
            return None
        return cls(per_layer_s=float(data["per_layer_s"]))


def _beside(collectives: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [
        float(c["beside"][key]["value"])
        for c in collectives
        if isinstance(c.get("beside"), Mapping) and (c["beside"].get(key) or {}).get("value") is not None
    ]


def _comm_share(collectives: Iterable[Mapping[str, Any]]) -> float | None:
    """The machine's share of a rank's compute speed that a collective in flight takes: the median of the
    collectives' `beside` figures (one per collective and layout), kept within [0, 1] (a negative share is a
    chain that ran faster beside the collective, noise; above 1 the collective slowed the chain more than its
    own length, which the simulation cannot give: it stops a rank's compute at most). Where the calibration timed
    the collectives beside the compute too, their `in_flight_share` (the chain's loss ÷ the time the collective
    ran under it, which _comm_stretch lengthens), else their `share` (÷ the collective alone: a collective as
    long beside compute as alone). None without any."""
    shares = _beside(collectives, "in_flight_share") or _beside(collectives, "share")
    return min(1.0, max(0.0, statistics.median(shares))) if shares else None


def _comm_beside(collectives: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, float | None]]:
    """Per collective (all_reduce, reduce_scatter, all_gather) its own (share, stretch): _comm_share and
    _comm_stretch over that collective's entries alone (its layouts). On the 2-core host gloo's all-gather beside
    compute took 0.43-0.53 of the compute's speed and ran 1.5-1.8× its time alone, its all-reduce 0.33-0.36 and
    1.9-2.3×, its reduce-scatter 0.28-0.32 and 1.7× (2026-12-07; the reduce-scatter's read 0.12-0.21 and 3.5-4.3×
    while the calibration polled its Work, which reports no end before its wait: kernels._waited)."""
    out: dict[str, tuple[float, float | None]] = {}
    entries = [c for c in collectives if isinstance(c.get("beside"), Mapping)]
    for op in sorted({str(c.get("op")) for c in entries}):
        mine = [c for c in entries if str(c.get("op")) == op]
        share = _comm_share(mine)
        if share is not None:
            out[op] = (share, _comm_stretch(mine))
    return out


def _comm_stretch(collectives: Iterable[Mapping[str, Any]]) -> float | None:
    """How much longer a collective takes beside a rank's compute than alone (its threads share the rank's cores):
    the median of the collectives' `beside` stretches, at least 1. None where the calibration did not time it
    (before 2026-12-07): the collective then keeps its alone price beside compute."""
    stretches = _beside(collectives, "stretch")  # written with in_flight_share, from the same iterations
    return max(1.0, statistics.median(stretches)) if stretches else None


@dataclass(frozen=True, kw_only=True)
class MachineModel:
    """A machine file read for prediction."""

    name: str
    source: str  # measured | datasheet
    device_kind: str  # cpu | cuda
    per_node: int  # devices (GPUs, or CPU cores for a CPU machine) per node
    memory_bytes: int | None  # memory of one device (a CPU machine: the host's)
    threads_per_rank: int  # threads the compute figures were measured with (CPU)
    matmul_flop_per_s: Mapping[str, float]
    conv_flop_per_s: Mapping[str, float]
    memory_bandwidth_bytes_per_s: float | None
    links: Mapping[str, Mapping[str, Any]]
    collectives: tuple[Mapping[str, Any], ...]
    layer_timings: tuple[LayerTimings, ...] = ()
    operator_timings: tuple[Mapping[str, Any], ...] = ()  # ddlbench.analysis.machine.operator_timings, fitted on use
    fsdp_units: tuple[FsdpUnitCosts, ...] = ()  # FSDP2's cost per unit, by ranks and nodes
    spatial_layers: tuple[SpatialLayerCosts, ...] = ()  # spatial parallelism's cost per slab layer, by ranks
    hosts: int = 1  # hosts the calibration ran on (1: every "node" of a local run is this host)
    notes: tuple[str, ...] = field(default=())
    # what CUDA's caching allocator counts beyond the tensors (ddlbench.analysis.analytic.memory, "On CUDA"),
    # fitted by a GPU calibration; applied to predictions only when device_kind is cuda
    cuda_memory: CudaMemoryTerms | None = None
    # the host's time to issue a layer's kernels, fitted by a GPU calibration; cuda only, as cuda_memory
    cuda_host: CudaHostTerms | None = None
    # CPU: seconds per byte of memory the host maps and zeroes on first use (ddlbench.train.calibration.kernels,
    # _first_touch); None where not measured (a GPU, a datasheet, an older machine file): no such term
    first_touch_s_per_byte: float | None = None
    # seconds per parameter element of the optimizer's step as training runs it (ddlbench.train.calibration.kernels,
    # `update`); None where not measured (a datasheet, an older machine file): the model's 24 B ÷ bandwidth then
    update_s_per_param: float | None = None
    # the ranks' host allocator the calibration ran with (its suite's `host_allocator`: retain, system, mixed);
    # None for a file from before the key (its ranks had the environment's allocator, glibc's defaults unless set)
    host_allocator: str | None = None
    # CPU: zero2's reduce_scatter and all_gather on a group of one rank, per op its (bytes, seconds a call) by size
    # (ddlbench.train.calibration.kernels, `alone_collective`); empty where not measured (a GPU, an older file)
    alone_collectives: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    # CPU: the share of a rank's compute speed a collective in flight takes from it (the calibration's `beside`
    # figures: the median over its collectives and layouts, kept within [0, 1]); None where not measured
    # (a GPU, a datasheet, an older machine file): communication is then hidden or not by Context.overlap's rule
    comm_share: float | None = None
    # CPU: how much longer a collective runs beside the rank's compute than alone (the calibration's `beside`
    # stretch, median, at least 1); None where not measured: it keeps its alone price
    comm_stretch: float | None = None
    # CPU: each collective's own (share, stretch) where the calibration ran it beside compute; the two medians
    # above price the others (a broadcast, a send)
    comm_beside: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)
    # the optimizer's step a parameter by how many ranks of a node ran it at once (the operators point's turns,
    # fp32 at one thread); empty where not measured (an older file): update_s_per_param for any count
    update_at_once: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def from_file(cls, path: Path) -> MachineModel:
        return cls.from_dict(read_machine(Path(path)), where=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "machine file") -> MachineModel:
        device = data.get("device") or {}
        compute = data.get("compute") or {}

        def rates(key: str) -> dict[str, float]:
            return {p: float(f["value"]) for p, f in (compute.get(key) or {}).items() if f and f.get("value")}

        return cls(
            name=str(data.get("name", "?")),
            source=str(data.get("source", "?")),
            device_kind=str(device.get("kind", "cpu")),
            per_node=int(device.get("per_node") or 1),
            memory_bytes=int(device["memory_bytes"]) if device.get("memory_bytes") else None,
            threads_per_rank=int(device.get("threads_per_rank") or 1),
            matmul_flop_per_s=rates("matmul_flop_per_s"),
            conv_flop_per_s=rates("conv_flop_per_s"),
            memory_bandwidth_bytes_per_s=_figure(compute.get("memory_bandwidth_bytes_per_s")) or None,
            links=dict(data.get("links") or {}),
            collectives=tuple(data.get("collectives") or ()),
            layer_timings=tuple(_layer_timings(entry) for entry in data.get("layer_timings") or ()),
            operator_timings=tuple(data.get("operator_timings") or ()),
            fsdp_units=tuple(FsdpUnitCosts.from_dict(entry) for entry in data.get("fsdp_units") or ()),
            spatial_layers=tuple(SpatialLayerCosts.from_dict(entry) for entry in data.get("spatial_layers") or ()),
            hosts=max(1, len(data.get("hosts") or ())),
            cuda_memory=CudaMemoryTerms.from_dict(data.get("cuda_memory")),
            cuda_host=CudaHostTerms.from_dict(data.get("cuda_host")),
            first_touch_s_per_byte=_figure(compute.get("first_touch_s_per_byte")),
            update_s_per_param=_figure(compute.get("update_s_per_param")) or None,
            host_allocator=str(data["host_allocator"]) if data.get("host_allocator") else None,
            alone_collectives={
                str(op): tuple(sorted((int(f["bytes"]), float(f["value"])) for f in figures if f.get("value")))
                for op, figures in (compute.get("alone_collectives") or {}).items()
            },
            comm_share=_comm_share(data.get("collectives") or ()),
            comm_stretch=_comm_stretch(data.get("collectives") or ()),
            comm_beside=_comm_beside(data.get("collectives") or ()),
            update_at_once={
                int(entry["ranks_per_node"]): float(entry["update_s_per_param"]["value"])
                for entry in data.get("operator_timings") or ()
                if (entry.get("update_s_per_param") or {}).get("value") and int(entry.get("threads") or 1) == 1
            },
        )

    def alone_collective_s(self, op: str, nbytes: float) -> float | None:
        """Seconds of zero2's `op` on `nbytes` over a group of one rank, from the calibration's calls at a few
        sizes: the seconds a byte interpolated linearly in log(bytes) between the two sizes around `nbytes`, and
        the nearest size's beyond them (a call's cost a byte changes as its buffers leave the caches, not in
        proportion to its size); None where the machine file has no such figure."""
        sizes = self.alone_collectives.get(op)
        if not sizes or nbytes <= 0:
            return None
        rates = [(math.log(size), seconds / size) for size, seconds in sizes]
        at = math.log(nbytes)
        if at <= rates[0][0]:
            return nbytes * rates[0][1]
        for (low, low_rate), (high, high_rate) in itertools.pairwise(rates):
            if at <= high:
                return nbytes * (low_rate + (high_rate - low_rate) * (at - low) / (high - low))
        return nbytes * rates[-1][1]

    # compute ------------------------------------------------------------------------------------
    def flop_rate(self, layer_type: str, precision: str) -> tuple[float, str]:
        """FLOP/s of a layer type at a precision, and which figure it is. Convolutions use the conv
        rate where measured, else the matmul rate; a precision not measured falls back to fp32."""
        tables = [("conv", self.conv_flop_per_s)] if layer_type in CONV_TYPES else []
        tables.append(("matmul", self.matmul_flop_per_s))
        for wanted in dict.fromkeys((precision, "fp32")):
            for kind, table in tables:
                if table.get(wanted):
                    return table[wanted], f"{kind} {wanted}"
        for kind, table in tables:
            if table:
                wanted, value = next(iter(table.items()))
                return value, f"{kind} {wanted}"
        raise DdlbenchError(f"machine {self.name!r} has no matmul_flop_per_s figure: cannot predict compute")

    def layer_timings_for(
        self,
        model: str,
        dataset: str,
        options: tuple[tuple[str, str], ...],
        precision: str,
        threads: int,
        *,
        sharing: int | None = None,
    ) -> LayerTimings | None:
        """The layer timings of exactly this model build, precision and threads, if the machine has them;
        of several, those timed with `sharing` ranks at once on a node (else the nearest)."""
        wanted = tuple(sorted(options))
        found = [
            timings
            for timings in self.layer_timings
            if (timings.model, timings.dataset, timings.precision, timings.threads)
            == (model, dataset, precision, threads)
            and (not timings.options or timings.options == wanted)
        ]
        if not found:
            return None
        return min(found, key=lambda timings: abs(timings.ranks_per_node - (sharing or timings.ranks_per_node)))

    def operator_model_for(self, precision: str, threads: int, *, sharing: int | None = None) -> OperatorModel | None:
        """The operator fits (ddlbench.analysis.analytic.operators) of this precision and threads, timed by
        the number of ranks at once nearest `sharing`; None when the machine file has no such timings."""
        found = [
            (index, entry)
            for index, entry in enumerate(self.operator_timings)
            if str(entry.get("precision")) == precision and int(entry.get("threads", 1)) == threads
        ]
        if not found:
            return None
        index, _ = min(found, key=lambda item: abs(int(item[1].get("ranks_per_node", 1)) - (sharing or 1)))
        return self._operator_models[index]

    @functools.cached_property
    def _operator_models(self) -> dict[int, OperatorModel]:
        return _LazyFits(self.operator_timings)

    # communication ------------------------------------------------------------------------------
    def fsdp_units_for(self, *, ranks: int, nodes: int) -> FsdpUnitCosts | None:
        """FSDP2's per-unit costs timed at exactly `ranks` ranks on `nodes` nodes, else those on the same side
        of the node boundary at the nearest rank count (the caller moves their collectives to its group);
        None when the machine file has none. One rank takes only one rank's: other entries hold collectives."""
        exact = [c for c in self.fsdp_units if (c.ranks, c.nodes) == (ranks, nodes)]
        if exact or ranks <= 1:
            return exact[0] if exact else None
        sharded = [c for c in self.fsdp_units if c.ranks > 1]
        same_side = [c for c in sharded if (c.nodes > 1) == (nodes > 1)] or sharded
        return min(same_side, key=lambda c: abs(c.ranks - ranks), default=None)

    def spatial_layers_for(self, *, ranks: int, nodes: int) -> SpatialLayerCosts | None:
        """Spatial parallelism's per-layer costs timed at exactly `ranks` ranks on `nodes` nodes, else those on
        the same side of the node boundary at the nearest rank count; None when the machine file has none."""
        exact = [c for c in self.spatial_layers if (c.ranks, c.nodes) == (ranks, nodes)]
        if exact or ranks <= 1:
            return exact[0] if exact else None
        same_side = [c for c in self.spatial_layers if (c.nodes > 1) == (nodes > 1)] or list(self.spatial_layers)
        return min(same_side, key=lambda c: abs(c.ranks - ranks), default=None)

    def _library_rank(self, library: str) -> int:
        preferred = ("nccl",) if self.device_kind == "cuda" else ("gloo",)
        return 0 if library.split()[0] in preferred else (2 if library.startswith("mpi") else 1)

    def collective(self, op: str, *, ranks: int, nodes: int) -> CollectiveCost:
        """The cost of `op` over `ranks` ranks spread on `nodes` nodes (see the module docstring)."""
        if op not in COLLECTIVE_OPS:
            raise ValueError(f"collective {op!r} unknown; known: {', '.join(COLLECTIVE_OPS)}")
        link = "inter_node" if nodes > 1 else "intra_node"
        fits = sorted(
            (
                _busy_or_barrier(c)
                for c in self.collectives
                if c.get("op") == op and c.get("alpha_s") is not None and c.get("beta_s_per_byte") is not None
            ),
            # a fit whose slope came out negative and was set to 0 resolved no bandwidth: any other comes first
            key=lambda c: (c.get("clamped") == "beta", self._library_rank(str(c.get("library", "")))),
        )
        if self.hosts == 1:
            fits = _pooled_on_one_host(fits)
        for c in fits:
            if int(c.get("ranks", 0)) == ranks and int(c.get("nodes", 0)) == nodes:
                return CollectiveCost(
                    op=op,
                    ranks=ranks,
                    alpha_s=float(c["alpha_s"]),
                    beta_s_per_byte=float(c["beta_s_per_byte"]),
                    wait_per_compute_s=float(c.get("wait_per_compute_s") or 0.0),
                    wait_burst_max_s=_burst_max(c),
                    source=f"measured {c.get('library')} {op} p={ranks} n={nodes}{c.get('mode', '')}"
                    + (" (its fit resolved no bandwidth: size-independent)" if c.get("clamped") == "beta" else ""),
                )
        same_side = [c for c in fits if (int(c.get("nodes", 1)) > 1) == (nodes > 1) and int(c.get("ranks", 0)) > 1]
        if not same_side:
            same_side = [c for c in fits if int(c.get("ranks", 0)) > 1]
        if same_side:
            c = min(same_side, key=lambda c: abs(int(c["ranks"]) - ranks))
            p0 = int(c["ranks"])
            alpha_step = float(c["alpha_s"]) / ring_steps(op, p0)
            beta_bus = float(c["beta_s_per_byte"]) / bus_share(op, p0)
            return CollectiveCost(
                op=op,
                ranks=ranks,
                alpha_s=ring_steps(op, ranks) * alpha_step,
                beta_s_per_byte=bus_share(op, ranks) * beta_bus,
                wait_per_compute_s=float(c.get("wait_per_compute_s") or 0.0),
                wait_burst_max_s=_burst_max(c),
                source=f"ring from measured {c.get('library')} {op} p={p0} n={c.get('nodes')}{c.get('mode', '')}",
            )
        chosen = self.links.get(link) or self.links.get("intra_node") or self.links.get("inter_node")
        if not chosen:
            raise DdlbenchError(f"machine {self.name!r} has neither collectives nor links: cannot cost {op}")
        beta = chosen.get("beta_s_per_byte")
        if link == "inter_node" and chosen.get("per_gpu_bandwidth_bytes_per_s"):
            # a ring across nodes is as fast as each device's share of its node's network
            beta = 1.0 / float(chosen["per_gpu_bandwidth_bytes_per_s"])
        if beta is None and chosen.get("bandwidth_bytes_per_s"):
            beta = 1.0 / float(chosen["bandwidth_bytes_per_s"])
        alpha = float(chosen.get("alpha_s") or 0.0)
        return CollectiveCost(
            op=op,
            ranks=ranks,
            alpha_s=ring_steps(op, ranks) * alpha,
            beta_s_per_byte=bus_share(op, ranks) * float(beta or 0.0),
            source=f"ring from link {link if self.links.get(link) else 'fallback'}"
            + (" (no latency given: α = 0)" if chosen.get("alpha_s") is None else ""),
        )


def _figure(figure: Mapping[str, Any] | None) -> float | None:
    """A measured figure's value, None when absent."""
    value = (figure or {}).get("value")
    return float(value) if value is not None else None
