"""The model table's text renderings: a fixed-width table, a CSV of the layers, and ParaDL's `.net` layer
file (TruongThaoNguyen/paraDL-analysis, `model/*.net`, read by `load_network` in parallel_analysis.py),
which the analytical model and its checks read back.

The table itself (ddlbench.catalog.model_table: per-layer shapes, parameters, FLOPs and saved
activations) is built by ddlbench.train.introspect; this module stays torch-free.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import NamedTuple

from ddlbench.catalog.model_table import LayerRow, ModelTable, Shape
from ddlbench.errors import DdlbenchError


def shape_text(shape: Shape) -> str:
    """A shape as ParaDL and the CSV write it: 3x32x32 (empty for no dimensions)."""
    return "x".join(str(extent) for extent in shape)


def _options_text(table: ModelTable) -> str:
    return ", ".join(f"{key}={value}" for key, value in table.options) or "no options"


def render_table(table: ModelTable) -> str:
    """The table as fixed-width text: one line per layer, a totals line, and a header naming the units."""
    header = ["name", "type", "block", "input", "output", "weight", "params", "fwd_flops", "bwd_flops", "saved_B"]
    rows = [
        [
            layer.name if layer.leaf else f"{layer.name} (own)",
            layer.type,
            str(layer.block),
            shape_text(layer.input_shape),
            shape_text(layer.output_shape),
            shape_text(layer.weight_shape) or "-",
            str(layer.params),
            str(layer.forward_flops),
            str(layer.backward_flops),
            str(layer.saved_bytes),
        ]
        for layer in table.layers
    ]
    totals = ["total", "", "", "", "", "", str(table.params), str(table.forward_flops), str(table.backward_flops)]
    rows.append([*totals, str(table.saved_bytes)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    numeric = {2, 6, 7, 8, 9}

    def line(cells: list[str]) -> str:
        padded = zip(cells, widths, strict=True)
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(padded))

    rule = "-" * len(line(header))
    intro = [
        f"# {table.model} on {table.dataset} ({_options_text(table)}), sample {shape_text(table.sample_shape)}: "
        f"{len(table.layers)} layers in {len(table.blocks)} blocks",
        "# per sample: FLOPs as torch's FlopCounterMode counts them (2 per multiply-add of convolutions and "
        "matrix products), saved_B = bytes autograd keeps for backward (fp32); params in elements",
        f"# besides: {table.param_bytes} B of parameters, {table.buffer_bytes} B of buffers, "
        f"{table.saved_fixed_bytes} B saved for backward whatever the batch size",
    ]
    return "\n".join([*intro, line(header), rule, *map(line, rows[:-1]), rule, line(rows[-1])]) + "\n"


CSV_COLUMNS = (
    "name",
    "type",
    "block",
    "input_shape",
    "output_shape",
    "weight_shape",
    "params",
    "forward_flops",
    "backward_flops",
    "saved_bytes",
)


def render_csv(table: ModelTable) -> str:
    """One row per layer under a header row; shapes written like 3x32x32."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for layer in table.layers:
        values = [getattr(layer, column) for column in CSV_COLUMNS]
        writer.writerow(shape_text(v) if c.endswith("_shape") else v for v, c in zip(values, CSV_COLUMNS, strict=True))
    return out.getvalue()


# ParaDL's layer kinds in the order its estimator tests them (`"CONV" in layer['name']` first, …, else no
# FLOPs): a `.net` layer's kind is the first of these its NAME contains. DROPOUT is named in its files too.
NET_KINDS = ("CONV", "MPOOL", "APOOL", "RELU", "FC", "BNORM", "ADD")
_NET_KIND_OF_TYPE = {
    **dict.fromkeys(("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"), "CONV"),
    **dict.fromkeys(("MaxPool1d", "MaxPool2d", "MaxPool3d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d"), "MPOOL"),
    **dict.fromkeys(("AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"), "APOOL"),
    # ParaDL knows one activation (RELU: one FLOP an element) and one norm (BNORM: 4 an element)
    **dict.fromkeys(("ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Hardswish", "Sigmoid", "Tanh"), "RELU"),
    **dict.fromkeys(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "GroupNorm", "LayerNorm"), "BNORM"),
    **dict.fromkeys(("Dropout", "Dropout1d", "Dropout2d", "Dropout3d"), "DROPOUT"),
    "Linear": "FC",
}


class NetLayer(NamedTuple):
    """One layer line of a ParaDL `.net` file: NAME|x|w|y|time (time None when the file gives none)."""

    name: str
    kind: str
    x_shape: Shape
    w_shape: Shape
    y_shape: Shape
    time_s: float | None


def net_kind(type_name: str) -> str:
    """The ParaDL kind a torch layer type is written as; other types by their own name in capitals, unless
    that contains a kind ParaDL would misread it as (then OTHER)."""
    kind = _NET_KIND_OF_TYPE.get(type_name)
    if kind:
        return kind
    name = "".join(ch for ch in type_name.upper() if ch.isalnum())
    return "OTHER" if any(known in name for known in NET_KINDS) else name


def render_net(table: ModelTable, *, times: Mapping[str, float] | None = None, dataset_size: int = 1) -> str:
    """The table as a ParaDL `.net` file (TruongThaoNguyen/paraDL-analysis, model/*.net).

    Three header lines (`Dataset|`, `Input|NxCxHxW`, `Model|`), then one line per layer,
    `KIND_path|x|w|y|time`, with `# block i` comment lines between blocks. N is `dataset_size`: the catalog
    does not know how many samples a dataset has, so it is 1 unless given. Shapes follow ParaDL's notation:
    x and y channels first (a flat vector padded with 1s to the sample's rank), w as C×F×K×K for
    convolutions (C per group) and linear layers (K = 1), 0×0×K×K for pools, C×C×0×0 for layers without a
    weight ParaDL counts (norms included, as ParaDL writes BNORM). time is the layer's seconds from `times`
    (by module path; 0 for a layer not in it — ParaDL then takes the layer as free, as in its own
    files every line after the first); without `times` no line has one, and ParaDL estimates each
    layer's time from its FLOPs and the platform's speed. Functional operations that no module holds
    (the residual ADD) have no line; a module's own operations (attention) are a line of the module's type.
    """
    spatial = len(table.sample_shape) - 1
    lines = [f"Dataset|{table.dataset}", f"Input|{dataset_size}x{shape_text(table.sample_shape)}"]
    lines.append(f"Model|{table.model}")
    block = None
    for layer in table.layers:
        if layer.block != block:
            block = layer.block
            lines.append(f"# block {block}")
        kind = net_kind(layer.type)
        name = f"{kind}_{layer.name.lower().replace('.', '_')}" + ("" if layer.leaf else "_own")
        x, y = _net_shape(layer.input_shape, spatial), _net_shape(layer.output_shape, spatial)
        time = (times or {}).get(layer.name)
        fields = [name, shape_text(x), shape_text(_net_weight(layer, kind, x, spatial)), shape_text(y)]
        if times is not None:
            fields.append("0" if time is None else f"{time:.9g}")
        lines.append("|".join(fields))
    return "\n".join(lines) + "\n"


def _net_shape(shape: Shape, spatial: int) -> Shape:
    return shape + (1,) * (1 + spatial - len(shape)) if len(shape) < 1 + spatial else shape


def _net_weight(layer: LayerRow, kind: str, x: Shape, spatial: int) -> Shape:
    w = layer.weight_shape
    if kind == "CONV" and len(w) >= 2:
        return (w[1], w[0], *w[2:])  # torch's F×C×K×K is ParaDL's C×F×K×K
    if kind == "FC" and len(w) == 2:
        return (w[1], w[0], *(1,) * spatial)
    if kind in ("MPOOL", "APOOL"):
        return (0, 0, *(layer.kernel_size or (1,) * spatial))
    if w and kind not in ("BNORM", "RELU", "DROPOUT"):
        return w  # a weight ParaDL has no kind for (an embedding table): its elements count as weights
    channels = x[0] if spatial else x[-1]
    return (channels, channels, *(0,) * spatial)


def parse_net(text: str) -> list[NetLayer]:
    """The layer lines of a ParaDL `.net` file, as ParaDL's `load_network` reads them: header lines,
    comments (`#…`) and blank lines skipped, fields split on `|`, shapes on `x`, a missing time None."""
    layers = []
    for raw in text.splitlines():
        fields = [part.strip() for part in raw.strip().split("|")]
        if not fields[0] or fields[0].startswith("#") or fields[0] in ("Dataset", "Input", "Model"):
            continue
        if len(fields) < 4:
            raise DdlbenchError(f"not a ParaDL layer line (NAME|x|w|y[|time]): {raw!r}")
        name = fields[0]
        kind = next((known for known in NET_KINDS if known in name), name.split("_")[0].rstrip("0123456789"))
        time = float(fields[4]) if len(fields) > 4 and fields[4] else None
        layers.append(NetLayer(name, kind, *(_parse_shape(f) for f in fields[1:4]), time_s=time))
    return layers


def parse_net_header(text: str) -> dict[str, str]:
    """The `Dataset`, `Input` and `Model` lines of a `.net` file, by their key."""
    keys = ("Dataset", "Input", "Model")
    return {key: value.strip() for key, _, value in (line.partition("|") for line in text.splitlines()) if key in keys}


def _parse_shape(text: str) -> Shape:
    return tuple(int(part) for part in text.split("x")) if text else ()
