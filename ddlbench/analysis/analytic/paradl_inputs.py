"""ParaDL's input files, read as its oracle reads them: the platform (`.plat`), the network (`.net`, one
line per layer with its input, weight and output shapes and an optional profiled time) and the layer mask
(`.lc`), and the FLOPs it counts per layer (TruongThaoNguyen/paraDL-analysis, commit ce36803). The
equations that use them are in ddlbench.analysis.analytic.paradl."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import DdlbenchError

_KINDS = ("CONV", "MPOOL", "APOOL", "RELU", "FC", "BNORM", "ADD")  # looked for in the name, in this order


class ParadlError(DdlbenchError, ValueError):
    """A ParaDL input or configuration the oracle cannot evaluate; says what was wrong and what is accepted."""


@dataclass(frozen=True, kw_only=True)
class Platform:
    """A machine as ParaDL's `.plat` file describes it, one `KEY|value|unit` line per figure."""

    mem_per_gpu_bytes: float  # MEM_PER_NODE
    gpu_flops: float  # NODE_SPEED: prices a layer that has no profiled time
    bandwidth_bytes_per_s: float  # BANDWIDTH: unused by the equations (see _NVLINK_BPS)
    latency_s: float  # LATENCY: unused likewise
    max_gpus: int  # MAX_NODE: caps p
    gpus_per_node: int  # GPU_PER_NODE: P2, the inner size of the hybrids ds and df


@dataclass(frozen=True, kw_only=True)
class NetLayer:
    """One layer line of a `.net` file, `NAME|x|w|y[|time]`, for one sample."""

    name: str
    x: tuple[int, ...]  # input C×W×H[×D]
    w: tuple[int, ...]  # weights C×F×K×K[×K]; 0×0×K×K for a pool
    y: tuple[int, ...]  # output F×W×H[×D]
    time_s: float | None  # profiled seconds per sample, forward and backward; None when absent

    @property
    def kind(self) -> str:
        """The layer's type as ParaDL tells it: the first of CONV, MPOOL, ..., ADD in its name, or ""."""
        return next((kind for kind in _KINDS if kind in self.name), "")

    @property
    def in_items(self) -> int:
        return math.prod(self.x)

    @property
    def weight_items(self) -> int:
        return math.prod(self.w)

    @property
    def out_items(self) -> int:
        return math.prod(self.y)


@dataclass(frozen=True, kw_only=True)
class Net:
    """A dataset and a CNN as ParaDL's `.net` file gives them."""

    dataset: str
    samples: int  # D, the dataset's size
    sample_shape: tuple[int, ...]
    model: str
    layers: tuple[NetLayer, ...]


def parse_platform(text: str) -> Platform:
    """Reads a `.plat` file's text (load_platform, which goes by line number; this goes by key)."""
    values = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) >= 2 and fields[0].strip():
            values[fields[0].strip()] = float(fields[1])
    keys = ("MEM_PER_NODE", "NODE_SPEED", "BANDWIDTH", "LATENCY", "MAX_NODE", "GPU_PER_NODE")
    if missing := [key for key in keys if key not in values]:
        raise ParadlError(f".plat file lacks {', '.join(missing)}; it needs KEY|value lines for {', '.join(keys)}")
    return Platform(
        mem_per_gpu_bytes=values["MEM_PER_NODE"],
        gpu_flops=values["NODE_SPEED"],
        bandwidth_bytes_per_s=values["BANDWIDTH"],
        latency_s=values["LATENCY"],
        max_gpus=int(values["MAX_NODE"]),
        gpus_per_node=int(values["GPU_PER_NODE"]),
    )


def parse_net(text: str) -> Net:
    """Reads a `.net` file's text (load_network): three header lines, then `NAME|x|w|y[|time]` per layer."""
    lines = text.splitlines()
    if len(lines) < 3 or any(len(line.split("|")) < 2 for line in lines[:3]):
        raise ParadlError(".net file must start with Dataset|name, Input|DxCxWxH and Model|name lines")
    dataset, shape, model = (line.split("|")[1] for line in lines[:3])
    size, *sample_shape = shape.split("x")
    layers = []
    for number, line in enumerate(lines[3:], start=4):
        fields = line.split("|")
        if len(fields) < 4:  # a comment such as "# Second block group|0", or a blank line
            if line.strip() and not line.startswith("#"):
                raise ParadlError(f".net line {number} is neither NAME|x|w|y[|time] nor a # comment: {line!r}")
            continue
        x, w, y = (tuple(int(d) for d in field.split("x")) for field in fields[1:4])
        time_s = float(fields[4]) if len(fields) >= 5 else None
        layers.append(NetLayer(name=fields[0], x=x, w=w, y=y, time_s=time_s))
    sample = tuple(int(d) for d in sample_shape)
    return Net(dataset=dataset, samples=int(float(size)), sample_shape=sample, model=model, layers=tuple(layers))


def parse_mask(text: str) -> tuple[bool, ...]:
    """Reads a `.lc` layer mask (load_layer_configuration): `index NAME |v`, split unless v is "0" or ""."""
    return tuple(line.split("|")[1] not in ("0", "") for line in text.splitlines() if len(line.split("|")) >= 2)


def read_platform(path: Path) -> Platform:
    """Reads a `.plat` file."""
    return parse_platform(Path(path).read_text())


def read_net(path: Path) -> Net:
    """Reads a `.net` file."""
    return parse_net(Path(path).read_text())


def read_mask(path: Path) -> tuple[bool, ...]:
    """Reads a `.lc` layer-mask file."""
    return parse_mask(Path(path).read_text())


def layer_flops(layer: NetLayer) -> int:
    """FLOPs of one sample through a layer, forward and backward (estimate_layer_flop)."""
    x, w, y = layer.x, layer.w, layer.y
    window = math.prod(w[i] * y[i - 1] for i in range(2, len(w)))  # K·W_out · K·H_out [· K·D_out]
    forward = {
        "CONV": 2 * w[0] * w[1] * window,  # 2·C·F·K²·W·H: a multiply and an add
        "MPOOL": x[0] * y[0] * window,  # ParaDL quirk: C·F·K²·W·H with F = C, so C² for a pool
        "APOOL": x[0] * y[0] * window,
        "RELU": layer.out_items,
        "FC": layer.weight_items,  # C·F, no factor 2
        "BNORM": 4 * layer.in_items,  # mean, variance, normalise, scale and shift
        "ADD": layer.out_items,
    }.get(layer.kind, 0)
    return forward * 2 + layer.weight_items  # ×2: the input gradient; + |w|: the weight gradient
