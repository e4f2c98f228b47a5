"""The share of a model's forward FLOPs a ParaDL split really splits, predicted at plan time without torch.

ddlbench/catalog/layers.json holds, per (model, dataset, options that change the layers), the facts the
filter, channel and spatial strategies read off the modules at run time (ddlbench.catalog.split_rules
names them): the convolution and linear layers with their channels, groups and forward FLOPs, and the
top-level children with their shapes and windowed layers. Applying the strategies' own rules to them
gives the layers a point will split and so the share of FLOPs it splits: the figure each rank reports
as `split_flops_share` in its facts, which tests/test_plan_split_share.py checks against real runs.

The table is generated from the real models by `python -m ddlbench.train.build_layer_table`;
tests/test_catalog.py fails when it is out of date.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ddlbench.catalog import MODELS
from ddlbench.catalog.split_rules import (
    SPLITTABLE_TYPES,
    ChildFacts,
    LayerFacts,
    WindowFacts,
    slab_region,
    split_layer_names,
)

TABLE_PATH = Path(__file__).with_name("layers.json")
REGENERATE = "python -m ddlbench.train.build_layer_table"

SplitKind = Literal["filter", "channel", "spatial"]


@dataclass(frozen=True, kw_only=True)
class ModelLayers:
    """One entry of the table: what the split rules need to know of a model built for one dataset."""

    flops: int  # forward FLOPs of one sample
    input_extent: int  # the input's dim 2 (height, or depth for volumes): the spatial split's axis
    layers: tuple[LayerFacts, ...]
    children: tuple[ChildFacts, ...]

    def share(self, names: Sequence[str]) -> float:
        flops = {layer.name: layer.flops for layer in self.layers}
        return sum(flops.get(name, 0) for name in set(names)) / self.flops if self.flops else 0.0


@dataclass(frozen=True, kw_only=True)
class SplitShare:
    """What a split over `parts` ranks really splits: FLOPs share, and layers (or blocks) split of all."""

    flops_share: float  # 0..1 of one sample's forward FLOPs, in layers a rank computes a slice (slab) of
    split: int  # filter/channel: layers split; spatial: top-level children (blocks) run on slabs
    of: int  # filter/channel: convolution and linear layers; spatial: top-level children
    unit: str  # "layers" or "blocks"
    names: tuple[str, ...]  # the layers whose FLOPs count as split
    detail: str = ""  # spatial: why the slabs are gathered where they are


def entry_key(dataset: str, options: Mapping[str, str], shape_options: Sequence[str]) -> str:
    """The table's key of a dataset and the values of the options that change the model's layers."""
    return " ".join([dataset, *(f"{option}={options[option]}" for option in shape_options)])


@functools.cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE_PATH.read_text())


@functools.cache
def model_layers(model: str, dataset: str, model_options: tuple[tuple[str, str], ...] = ()) -> ModelLayers:
    """The table's entry for a model built for a dataset with these options (defaults filled in)."""
    models = _table()["models"]
    if model not in models:
        raise LookupError(f"the layer table has no model {model!r}; regenerate it with `{REGENERATE}`")
    data = models[model]
    options = MODELS.get(model).default_options() | dict(model_options)
    key = entry_key(dataset, options, data["shape_options"])
    entry = data["entries"].get(key)
    if isinstance(entry, str):  # the same layers as another key's
        entry = data["entries"][entry]
    if entry is None:
        raise LookupError(f"the layer table has no entry {model!r}: {key!r}; regenerate it with `{REGENERATE}`")
    return _decode(entry)


def _decode(entry: dict[str, Any]) -> ModelLayers:
    layers = tuple(
        LayerFacts(
            name=name,
            type=kind,
            in_channels=inputs,
            out_channels=outputs,
            groups=groups,
            padding_mode=mode,
            flops=flops,
        )
        for name, kind, inputs, outputs, groups, mode, flops in entry["layers"]
    )
    children = tuple(
        ChildFacts(
            calls=calls,
            in_shape=tuple(shape_in),
            out_shape=tuple(shape_out),
            windowed=tuple(
                WindowFacts(name=name, blocked=blocked, extent=extent, out_extent=out)
                for name, blocked, extent, out in windowed
            ),
        )
        for calls, shape_in, shape_out, windowed in entry["children"]
    )
    return ModelLayers(flops=entry["flops"], input_extent=entry["extent"], layers=layers, children=children)


@functools.cache
def predict_split_share(
    model: str, dataset: str, model_options: tuple[tuple[str, str], ...], kind: SplitKind, parts: int
) -> SplitShare:
    """What a `kind` split of `model` over `parts` ranks will split, by the rules its ranks apply."""
    entry = model_layers(model, dataset, tuple(sorted(model_options)))
    if kind == "spatial":
        children, reason = slab_region(entry.input_extent, entry.children, parts)
        names = tuple(window.name for child in entry.children[:children] for window in child.windowed)
        return SplitShare(
            flops_share=entry.share(names),
            split=children,
            of=len(entry.children),
            unit="blocks",
            names=names,
            detail=reason,
        )
    names = tuple(split_layer_names(entry.layers, parts, kind))
    candidates = [layer for layer in entry.layers if layer.type in SPLITTABLE_TYPES]
    return SplitShare(flops_share=entry.share(names), split=len(names), of=len(candidates), unit="layers", names=names)
