"""ParaDL's published oracle (Kahira et al., HPDC'21), reproduced figure for figure, without torch.

The equations are those of TruongThaoNguyen/paraDL-analysis, `parallel_analysis.py` (commit ce36803,
Python 2.7), rewritten from that code; each cites the function it comes from. ParaDL's "node" is one
GPU. Times are seconds per epoch (one pass over the dataset's D samples), compute and communication add
without overlap; memory is bytes per GPU, fp32 (4 bytes per item) and ×2 for the gradients; cost is
GPU-minutes. Their quirks are kept on purpose so that their own output (tests/data/paradl/reference.csv)
is matched; comments marked "ParaDL quirk" name them.

Strategies, by their paratype codes: o sequential, d data, f filter, c channel, s spatial, and the
hybrids ds and df (data parallel across nodes, spatial or filter within one). Their pipeline (p) is
unfinished (analysis_pipeline returns at once, and main() calls it with too few arguments), so it is not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddlbench.analysis.analytic.paradl_inputs import Net, ParadlError, Platform, layer_flops

STRATEGIES = {
    "o": "sequential, one GPU",
    "d": "data parallel",
    "f": "filter parallel",
    "c": "channel parallel",
    "s": "spatial parallel",
    "ds": "data across nodes × spatial within a node",
    "df": "data across nodes × filter within a node",
}
BYTES_PER_ITEM = 4.0  # fp32 (GlobalVal.BYTE_PER_ITEM)

# ABCI, as hard-coded above get_network_factor(). ParaDL quirk: the .plat file's BANDWIDTH and LATENCY
# are read but no equation uses them.
_NVLINK_BPS = 50e9  # bytes/s
_INTRA_SWITCH_LAT_S = 0.0
_INTRA_CABLE_LAT_S = 9e-6  # one NVLink hop
_PLX_LAT_S = 110e-9  # the PCIe switch between GPUs and the InfiniBand card
_PLX_CABLE_LAT_S = 20e-6  # GPU to PLX with GPUDirect
_PLX_CABLE_LAT_NO_GPUDIRECT_S = 3e-3  # measured without GPUDirect
_PLX_BPS = 16e9
_IB_BPS = 12.5e9  # InfiniBand EDR
_LEAF_LAT_S = _FBB_LAT_S = 90e-9  # switches, cut-through
_SPINE_LAT_S = 400e-9
_CABLE_LAT_S = 0.0  # ParaDL quirk: CABLE_LENGTH is only set locally, so CALBE_LAT stays 0


@dataclass(frozen=True, kw_only=True)
class ParadlFigures:
    """What ParaDL predicts for one strategy, GPU count and mini-batch: one row of its SUMMARY table."""

    strategy: str
    p: int  # GPUs
    B: int  # global mini-batch: samples per iteration (their column B)
    b: float  # samples one GPU holds: B/p for d, B/(p/P2) for ds and df, B otherwise
    mem_bytes: float  # per GPU
    t_comp_s: float  # per epoch
    t_comm_s: float  # per epoch
    t_total_s: float  # per epoch: t_comp_s + t_comm_s, no overlap
    cost: int  # GPU-minutes: p·⌈t_total_s/60⌉ (print_result)
    fits_memory: bool  # mem_bytes ≤ the GPU's; ParaDL drops f and c rows that do not fit, prints the rest


@dataclass(frozen=True, kw_only=True)
class _Sums:
    """The per-sample figures every strategy starts from (summary_network2, then main())."""

    x: int  # Σ|x|, items, over layers that are neither RELU nor BNORM
    y: int  # Σ|y| likewise
    w: int  # Σ|w|, items, over all layers
    comp_s: float  # Σ profiled seconds per sample
    layer_comp_s: tuple[float, ...]  # comp_s shared among the layers in proportion to their FLOPs


def _sums(net: Net, platform: Platform) -> _Sums:
    comp_s = 0.0
    for layer in net.layers:  # one at a time, as they add, so that the floats agree to the bit
        comp_s += layer.time_s if layer.time_s is not None else layer_flops(layer) / platform.gpu_flops
    flops = [layer_flops(layer) for layer in net.layers]
    kept = [layer for layer in net.layers if "RELU" not in layer.name and "BNORM" not in layer.name]
    return _Sums(
        x=sum(layer.in_items for layer in kept),
        y=sum(layer.out_items for layer in kept),
        w=sum(layer.weight_items for layer in net.layers),
        comp_s=comp_s,
        layer_comp_s=tuple(f * comp_s / sum(flops) for f in flops),  # main(), "CUSTOMIZE FOR THE CASE ..."
    )


def network_factor(p: float, *, gpudirect: bool = True) -> tuple[float, float]:
    """Bandwidth (bytes/s) and latency (s) of a ring over p GPUs of ABCI (get_network_factor)."""
    if p <= 4:  # within a node (ParaDL quirk: 4, not the .plat's GPU_PER_NODE)
        bandwidth, latency = _NVLINK_BPS, _INTRA_SWITCH_LAT_S + _INTRA_CABLE_LAT_S
    else:  # out through PLX and InfiniBand and in again: a leaf switch (≤ 68 GPUs), a rack (≤ 136), spines
        bandwidth = min(_IB_BPS, _NVLINK_BPS)
        plx = 2 * (_PLX_CABLE_LAT_S + _PLX_LAT_S)
        if p <= 68:
            hops = plx + _LEAF_LAT_S + 2 * _CABLE_LAT_S
        elif p <= 136:
            hops = plx + _FBB_LAT_S + 2 * _LEAF_LAT_S + 4 * _CABLE_LAT_S
        else:
            hops = plx + _SPINE_LAT_S + 2 * _FBB_LAT_S + 2 * _LEAF_LAT_S + 6 * _CABLE_LAT_S
        latency = max(_INTRA_SWITCH_LAT_S + _INTRA_CABLE_LAT_S, hops)
    if not gpudirect and p <= 4:  # through host memory
        bandwidth, latency = _PLX_BPS, 1 * (_PLX_CABLE_LAT_NO_GPUDIRECT_S + _PLX_LAT_S)
    elif not gpudirect and p <= 68:
        bandwidth = min(_IB_BPS, _PLX_BPS)
        plx = 4 * (_PLX_CABLE_LAT_S + _PLX_LAT_S)
        latency = max(_INTRA_SWITCH_LAT_S + 2 * _INTRA_CABLE_LAT_S, plx + _LEAF_LAT_S + 2 * _CABLE_LAT_S)
    return bandwidth, latency


def _floor_pow2(value: float) -> int:
    """The largest power of two ≤ value, for value ≥ 1 (their math.pow(2, int(math.log(value, 2))))."""
    return 2 ** (math.frexp(value)[1] - 1)


@dataclass(frozen=True, kw_only=True)
class _Case:
    """One configuration to evaluate, with the sums every strategy starts from."""

    net: Net
    platform: Platform
    sums: _Sums
    split: tuple[bool, ...]  # the .lc mask: which layers f, c, s, ds and df split
    p: int
    B: int

    @property
    def iterations(self) -> int:
        return math.ceil(self.net.samples / self.B)  # ⌈D/B⌉ per epoch

    @property
    def last_split(self) -> int:
        return max(i for i, split in enumerate(self.split) if split)

    def split_sums(self, parts: int, last: int) -> tuple[int, int, float]:
        """Σ|x|, Σ|y| (items, ReLU and BN included) and comp (s) of layers 0..last, split ones ÷ parts,
        rounded up to whole items (analysis_spatial, analysis_hybrid_ds)."""
        x_items = y_items = 0
        comp_s = 0.0
        for i, layer in enumerate(self.net.layers[: last + 1]):
            ways = parts if self.split[i] else 1
            x_items += math.ceil(layer.in_items / ways)
            y_items += math.ceil(layer.out_items / ways)
            comp_s += self.sums.layer_comp_s[i] / parts if self.split[i] else self.sums.layer_comp_s[i]
        return x_items, y_items, comp_s

    def filter_sums(self, parts: int) -> tuple[float, float, int, float]:
        """Weights one GPU holds (items) and its comp (s) when split layers are cut parts ways; how many
        layers' outputs are gathered (G) and Σ|y| of them (items) (core_analysis_filter)."""
        weight_items: float = 0
        comp_s = gathered_y = 0.0
        gathered = 0
        for i, layer in enumerate(self.net.layers):
            if self.split[i]:
                gathered += 1
                weight_items += layer.weight_items / parts
                gathered_y += layer.out_items
                comp_s += self.sums.layer_comp_s[i] / parts
            else:
                weight_items += layer.weight_items
                comp_s += self.sums.layer_comp_s[i]
        if self.split[-1]:  # the network's last output is not gathered
            gathered_y -= self.net.layers[-1].out_items
            gathered -= 1
        return weight_items, comp_s, gathered, gathered_y

    def max_samples(self, strategy: str) -> float:
        """Samples whose activations fit beside the weights in half a GPU (the other half holds gradients)."""
        items = self.platform.mem_per_gpu_bytes / BYTES_PER_ITEM
        if strategy in ("o", "d"):  # analysis_sequential(), analysis_data()
            return (items / 2 - self.sums.w) / (self.sums.x + self.sums.y)
        if strategy == "df":  # analysis_hybrid_df(): every layer's weights ÷ P2, split or not
            return (items / 2 - self.sums.w / self.platform.gpus_per_node) / (self.sums.x + self.sums.y)
        if strategy == "s":  # analysis_spatial()
            x_items, y_items, _ = self.split_sums(self.p, len(self.net.layers) - 1)
            return (items / 2 - self.sums.w) / (x_items + y_items)
        raise ParadlError(f"ParaDL picks no micro-batch from memory for {strategy!r}; it does for o, d, s and df")


_Parts = tuple[float, float, float, float]  # b (samples), memory (bytes), compute (s), communication (s)


def _sequential(case: _Case) -> _Parts:  # analysis_sequential()
    s, D = case.sums, case.net.samples
    mem = 2 * BYTES_PER_ITEM * (case.B * (s.y + s.x) + s.w)  # bytes: B samples' activations and the weights, ×2
    return case.B, mem, D * s.comp_s, 0.0  # s per epoch: D samples at comp_s each


def _data(case: _Case) -> _Parts:  # analysis_data()
    s, p, D = case.sums, case.p, case.net.samples
    b = case.B // p
    mem = 2 * (b * (s.x + s.y) + s.w) * BYTES_PER_ITEM  # bytes: b samples' activations and the weights, ×2
    bandwidth, alpha = network_factor(p)
    beta = 1 / bandwidth  # s/byte
    t_comm = 2 * case.iterations * (p - 1) * (alpha + s.w * BYTES_PER_ITEM * beta / p)  # ring all-reduce of ∇w
    return b, mem, math.ceil(D / p) * s.comp_s, t_comm


def _filter_or_channel(case: _Case, collectives: int) -> _Parts:  # core_analysis_filter(), ..._channel()
    s, p, B = case.sums, case.p, case.B
    weight_items, comp_s, gathered, gathered_y = case.filter_sums(p)
    mem = 2 * (B * (s.x + s.y) + weight_items / p) * BYTES_PER_ITEM  # ParaDL quirk: split weights ÷ p twice
    bandwidth, alpha = network_factor(p)
    beta = 1 / bandwidth
    step = alpha * gathered + (B * gathered_y * BYTES_PER_ITEM * beta) / p  # a ring step, all layers at once
    if collectives == 1:  # filter: an all-gather forward, then an all-reduce (2 of them) backward
        t_comm = case.iterations * (p - 1) * step + 2 * case.iterations * (p - 1) * step
    else:
        t_comm = collectives * case.iterations * (p - 1) * step
    return B, mem, case.iterations * B * comp_s, t_comm


def _spatial(case: _Case) -> _Parts:  # analysis_spatial()
    s, p, B, D, last = case.sums, case.p, case.B, case.net.samples, case.last_split
    x_items, y_items, comp_s = case.split_sums(p, len(case.net.layers) - 1)
    mem = 2 * (B * (x_items + y_items) + s.w) * BYTES_PER_ITEM
    bandwidth, alpha = network_factor(p, gpudirect=False)
    beta = 1 / bandwidth
    # ParaDL quirk: a halo is one row of W (|y_W|·(K−1)/2 items, no C nor H), for as many samples as
    # would fit in memory (unrounded), not for B.
    fit = case.max_samples("s")
    t_halo = 0.0
    for i, layer in enumerate(case.net.layers[: last + 1]):
        k = layer.w[2]
        if k > 1 and case.split[i]:
            t_halo += 2 * (alpha + layer.y[1] * ((k - 1) // 2) * fit * BYTES_PER_ITEM * beta)  # of y, forward
            t_halo += 2 * (alpha + layer.x[1] * ((k - 1) // 2) * fit * BYTES_PER_ITEM * beta)  # of ∂L/∂x
    t_halo *= case.iterations
    out_items = case.net.layers[last].out_items  # gathered forward, scattered backward
    t_gather = 2 * (p - 1) * (alpha + (B * out_items * BYTES_PER_ITEM * beta) / p) * case.iterations
    t_reduce = 2 * (D / B) * (p - 1) * (alpha + s.w * BYTES_PER_ITEM * beta / p)  # ParaDL quirk: D/B, no ceiling
    return B, mem, math.ceil(D) * comp_s, t_halo + t_gather + t_reduce  # each GPU: all D samples, 1/p of a layer


def _data_spatial(case: _Case) -> _Parts:  # analysis_hybrid_ds()
    s, p, B, D, last = case.sums, case.p, case.B, case.net.samples, case.last_split
    inner = case.platform.gpus_per_node  # P2, spatial
    outer = p / inner  # P1, data
    b = B / outer
    # ParaDL quirk: layers after the last split one count in neither memory nor compute.
    x_items, y_items, comp_s = case.split_sums(inner, last)
    mem = 2 * (B * (x_items + y_items) / outer + s.w) * BYTES_PER_ITEM
    bandwidth, alpha = network_factor(inner, gpudirect=False)
    beta = 1 / (bandwidth / (inner * 2))  # the inner flows share the PCIe links, both ways
    t_halo = 0.0
    for i, layer in enumerate(case.net.layers[: last + 1]):
        k = layer.w[2]
        if k > 1 and case.split[i]:
            halo_items = layer.x[0] * ((k - 1) // 2)
            for size in layer.x[2:]:
                halo_items *= size  # C·(K−1)/2·H[·D]
            t_halo += 2 * (alpha + halo_items * b * BYTES_PER_ITEM * beta)  # of x, forward
            t_halo += 2 * (alpha + halo_items * b * BYTES_PER_ITEM * beta)  # of ∂L/∂x, backward
    t_halo *= case.iterations
    beta = 1 / (bandwidth / 2)
    out_items = case.net.layers[last].out_items
    t_gather = 2 * (inner - 1) * (alpha + (b * out_items * BYTES_PER_ITEM * beta) / inner) * case.iterations
    # ParaDL quirk: get_network_factor(plat, P2, p, RING) passes p as the algorithm and 1 as GPUDIRECT,
    # so the all-reduce within a node is priced over NVLink.
    bandwidth, alpha = network_factor(inner)
    t_reduce = 2 * (inner - 1) * (alpha + s.w * BYTES_PER_ITEM * (1 / bandwidth) / inner)
    bandwidth, alpha = network_factor(p)
    beta = 1 / (bandwidth / (inner * 2))  # then among node leaders, through the shared PLX link
    t_reduce += 2 * (outer - 1) * (alpha + s.w * BYTES_PER_ITEM * beta / outer)
    t_reduce *= case.iterations
    return b, mem, math.ceil(D / outer) * comp_s, t_halo + t_gather + t_reduce


def _data_filter(case: _Case) -> _Parts:  # analysis_hybrid_df()
    s, p, B = case.sums, case.p, case.B
    inner = case.platform.gpus_per_node  # P2, filter
    outer = p / inner  # P1, data
    b = B / outer
    weight_items, comp_s, gathered, gathered_y = case.filter_sums(inner)
    mem = 2 * (b * (s.x + s.y) + weight_items) * BYTES_PER_ITEM
    bandwidth, alpha = network_factor(inner)
    beta = 1 / bandwidth
    step = alpha * gathered + (b * gathered_y * BYTES_PER_ITEM * beta) / inner
    t_filter = 3 * case.iterations * (inner - 1) * step
    bandwidth, alpha = network_factor(p)
    beta = 1 / (bandwidth / (2 * inner))  # the inner flows leave the node through one PLX link
    # ParaDL quirk: the all-reduce among groups moves the whole model's weights, not a GPU's share.
    t_data = 2 * case.iterations * (outer - 1) * (alpha + s.w * BYTES_PER_ITEM * beta / outer)
    return b, mem, case.iterations * b * comp_s, t_filter + t_data


_EQUATIONS: dict[str, Callable[[_Case], _Parts]] = {
    "o": _sequential,
    "d": _data,
    "f": lambda case: _filter_or_channel(case, 1),
    "c": lambda case: _filter_or_channel(case, 3),
    "s": _spatial,
    "ds": _data_spatial,
    "df": _data_filter,
}


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        known = ", ".join(f"{code} ({what})" for code, what in STRATEGIES.items())
        raise ParadlError(f"unknown ParaDL strategy {strategy!r}; accepted: {known}")


def _mask_of(net: Net, mask: Sequence[bool] | None) -> tuple[bool, ...]:
    if mask is None:
        return (True,) * len(net.layers)  # no --lc: every layer is split
    if len(mask) != len(net.layers):
        raise ParadlError(f"layer mask has {len(mask)} entries; the net has {len(net.layers)} layers, one each")
    if not any(mask):
        raise ParadlError("layer mask splits no layer; mark at least one layer 1")
    return tuple(bool(m) for m in mask)


def max_p(net: Net, platform: Platform, *, strategy: str, mask: Sequence[bool] | None = None) -> int:
    """The most GPUs ParaDL evaluates a strategy on: a power of two, capped by the platform and the split."""
    _check_strategy(strategy)
    split = _mask_of(net, mask)
    layers = [layer for layer, cut in zip(net.layers, split, strict=True) if cut]
    limit = {  # main(), analysis_filter/channel/spatial(): every GPU keeps a filter, channel or column
        "f": lambda: min(layer.y[0] for layer in layers),
        "c": lambda: min(
            (layer.x[0] for layer, cut in zip(net.layers[1:], split[1:], strict=True) if cut), default=1e9
        ),
        "s": lambda: min(min(layer.x[1], layer.y[1]) for layer in layers),
    }.get(strategy, lambda: math.inf)()
    return 1 if strategy == "o" else _floor_pow2(min(platform.max_gpus, limit))


def max_micro_batch(
    net: Net, platform: Platform, *, strategy: str = "d", p: int = 1, mask: Sequence[bool] | None = None
) -> int:
    """The micro-batch ParaDL picks without --cBon: the largest power of two whose memory fits; 0 if none."""
    _check_strategy(strategy)
    case = _Case(net=net, platform=platform, sums=_sums(net, platform), split=_mask_of(net, mask), p=p, B=1)
    samples = case.max_samples(strategy)
    return _floor_pow2(samples) if samples >= 1 else 0


def _check_config(net: Net, platform: Platform, *, strategy: str, p: int, B: int, mask: Sequence[bool] | None) -> None:
    _check_strategy(strategy)
    if not isinstance(p, int) or p < 1 or p & (p - 1):
        raise ParadlError(f"p={p!r} GPUs: ParaDL's rings take a power of two (1, 2, 4, 8, ...)")
    if strategy == "o" and p != 1:
        raise ParadlError(f"p={p}: sequential training (o) runs on p=1 GPU")
    if p > (top := max_p(net, platform, strategy=strategy, mask=mask)):
        raise ParadlError(f"p={p} GPUs: ParaDL evaluates {strategy!r} on at most {top} here (platform and split)")
    inner = platform.gpus_per_node
    if strategy in ("ds", "df") and p % inner:
        raise ParadlError(f"p={p}: hybrid {strategy!r} takes a multiple of GPU_PER_NODE={inner} GPUs")
    groups = p // inner if strategy in ("ds", "df") else p if strategy == "d" else 1
    if not isinstance(B, int) or B < 1 or B % groups:
        raise ParadlError(f"B={B!r}: {strategy!r} on p={p} takes a positive multiple of {groups} samples")


def paradl_predict(
    net: Net, platform: Platform, *, strategy: str, p: int, B: int, mask: Sequence[bool] | None = None
) -> ParadlFigures:
    """ParaDL's memory, epoch time and cost of training net with strategy on p GPUs, global mini-batch B.

    mask (a .lc file's, one entry per layer) says which layers f, c, s, ds and df split; None splits all.
    """
    _check_config(net, platform, strategy=strategy, p=p, B=B, mask=mask)
    case = _Case(net=net, platform=platform, sums=_sums(net, platform), split=_mask_of(net, mask), p=p, B=B)
    b, mem, t_comp, t_comm = _EQUATIONS[strategy](case)
    t_total = t_comp + t_comm
    return ParadlFigures(
        strategy=strategy,
        p=p,
        B=B,
        b=b,
        mem_bytes=mem,
        t_comp_s=t_comp,
        t_comm_s=t_comm,
        t_total_s=t_total,
        cost=p * math.ceil(t_total / 60),
        fits_memory=mem <= platform.mem_per_gpu_bytes,
    )
