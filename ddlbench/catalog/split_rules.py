"""Which layers ParaDL's filter, channel and spatial strategies split, as rules over plain facts (no torch).

The strategies (ddlbench.train.strategies.paradl and .spatial) read these facts off the real modules at
run time and apply these rules to decide what they swap; planning applies the same rules to the facts
stored in the catalog's layer table (ddlbench.catalog.layer_table), so a point's predicted split is the
one its ranks will make, and a point that would split too little is skipped before it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["filter", "channel"]

# Exact class names: a subclass (MultiheadAttention's out_proj is one) may be used without calling
# forward, so only these are swapped for split layers.
SPLITTABLE_TYPES = ("Conv2d", "Conv3d", "Linear")


@dataclass(frozen=True, kw_only=True)
class LayerFacts:
    """A convolution or linear layer as the filter/channel split sees it, with its forward FLOPs per sample."""

    name: str
    type: str  # the exact class name
    in_channels: int  # in_features of a linear layer
    out_channels: int  # out_features of a linear layer
    groups: int = 1
    padding_mode: str = "zeros"
    flops: int = 0


def why_replicated(layer: LayerFacts, parts: int, kind: Kind) -> str | None:
    """None when the layer is split over `parts` ranks the `kind` way; otherwise why it stays whole."""
    if layer.type == "Linear":
        what, size = ("out_features", layer.out_channels) if kind == "filter" else ("in_features", layer.in_channels)
    else:
        if layer.groups != 1:
            return f"grouped convolution (groups={layer.groups})"
        if layer.padding_mode != "zeros":
            return f"padding_mode {layer.padding_mode!r}"
        what, size = ("out_channels", layer.out_channels) if kind == "filter" else ("in_channels", layer.in_channels)
    return f"{what}={size} does not divide by {parts}" if size % parts else None


def split_layer_names(layers: Sequence[LayerFacts], parts: int, kind: Kind) -> list[str]:
    """The layers a filter/channel split over `parts` ranks swaps for sliced ones, in model order."""
    return [
        layer.name for layer in layers if layer.type in SPLITTABLE_TYPES and why_replicated(layer, parts, kind) is None
    ]


@dataclass(frozen=True, kw_only=True)
class WindowFacts:
    """A leaf layer inside a top-level child, as spatial parallelism sees it: a convolution or pooling with
    its extents along the split axis (dim 2), or, in `blocked`, why it cannot run on slabs at all."""

    name: str
    blocked: str | None = None  # the whole reason, naming the layer
    extent: int = 0
    out_extent: int = 0


@dataclass(frozen=True, kw_only=True)
class ChildFacts:
    """A top-level child of the model as spatial parallelism sees it: how often the probe called it, its
    input and output shapes (batch 1), and its leaf layers up to the first that cannot run on slabs."""

    calls: int
    in_shape: tuple[int, ...] = ()
    out_shape: tuple[int, ...] = ()
    windowed: tuple[WindowFacts, ...] = ()


def slab_problem(extent: int, out_extent: int, parts: int) -> str | None:
    """None when a windowed layer's input and output both split into `parts` equal slabs of at least a row."""
    if extent % parts or out_extent % parts or out_extent < parts:
        return f"input extent {extent} and output extent {out_extent} must both split into {parts} equal slabs"
    return None


def why_child_not_on_slabs(child: ChildFacts, parts: int) -> str | None:
    """None when all of the child can run on `parts` slabs along dim 2; otherwise why not."""
    if child.calls != 1:
        return f"called {child.calls} times in the probe"
    shape_in, shape_out = child.in_shape, child.out_shape
    if len(shape_out) != len(shape_in) or len(shape_out) < 3 or shape_out[2] % parts or shape_out[2] < parts:
        return f"its output {shape_out} does not split into {parts} slabs along dim 2"
    for window in child.windowed:
        if window.blocked is not None:
            return window.blocked
        if (problem := slab_problem(window.extent, window.out_extent, parts)) is not None:
            return f"{window.name}: {problem}"
    return None


def slab_region(input_extent: int, children: Sequence[ChildFacts], parts: int) -> tuple[int, str]:
    """How many leading children run on `parts` slabs (the slabs are gathered before the next), and why
    the region ends there. `input_extent` is the input's dim 2 (0 for inputs without a spatial axis)."""
    if not input_extent or input_extent % parts:
        return 0, f"the input's extent {input_extent} along dim 2 does not split into {parts} equal slabs"
    for index, child in enumerate(children):
        if (why := why_child_not_on_slabs(child, parts)) is not None:
            return index, f"child {index}: {why}"
    return len(children), "the whole model runs on slabs"
