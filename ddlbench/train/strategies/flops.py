"""Forward FLOPs of a model's layers on one sample, counted on the meta device (no arithmetic, no memory).

The ParaDL strategies report `split_flops_share`, the share of the model's forward FLOPs that sits in
the layers they really split, from these counts and the modules they swapped; the catalog's layer table
(ddlbench.catalog.layer_table, written by ddlbench.train.build_layer_table) holds the same counts so
that planning can predict that share without torch.

FLOPs are torch's FlopCounterMode's: 2 per multiply-accumulate of a convolution or matrix product, nothing
for norms, pools and activations. A layer's count comes from its shapes in the probe:
  convolution: 2 · out_elements · (in_channels / groups) · kernel volume  (bias not counted)
  linear:      2 · rows · in_features · out_features                        (rows: all leading dims)
which is what FlopCounterMode counts for aten.convolution and aten.addmm/mm (checked against its total
for every model of the zoo by the layer table's generator).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
FLOP_LAYERS = (*CONVS, nn.Linear)  # the only layers FlopCounterMode counts in a CNN


@dataclass(frozen=True, kw_only=True)
class Extents:
    """Input and output shapes one module was called with in the shape probe (one entry per call)."""

    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)


def probe_shapes(model: nn.Module, sample: Tensor, *, count_flops: bool = False) -> tuple[dict[str, Extents], int]:
    """Every submodule's input and output shapes on one sample, and (with count_flops) the model's total
    forward FLOPs as FlopCounterMode counts them (0 without).

    Runs on the meta device (no FLOPs, no memory), and the real model's parameters and buffers are not
    touched; eval mode gives the same shapes and lets batch norm accept one sample with a 1×1 extent.
    """
    seen: dict[str, Extents] = {}
    hooks = []
    for name, module in model.named_modules():
        if name:
            seen[name] = Extents()
            hooks.append(module.register_forward_hook(_recorder(seen[name])))
    state = {
        name: torch.empty_like(value, device="meta")
        for name, value in itertools.chain(model.named_parameters(), model.named_buffers())
    }
    training = {module: module.training for module in model.modules()}
    model.eval()
    counter = FlopCounterMode(display=False) if count_flops else None
    try:
        with torch.no_grad(), counter or contextlib.nullcontext():
            functional_call(model, state, (sample.to("meta"),))
    finally:
        for hook in hooks:
            hook.remove()
        for module, mode in training.items():
            module.training = mode
    return seen, int(counter.get_total_flops()) if counter else 0


def _recorder(extents: Extents):
    def record(module: nn.Module, args: tuple, output: Any) -> None:
        if args and isinstance(args[0], Tensor) and isinstance(output, Tensor):
            extents.calls.append((tuple(args[0].shape), tuple(output.shape)))

    return record


def layer_flops(module: nn.Module, extents: Extents) -> int:
    """Forward FLOPs of one convolution or linear layer over its recorded calls; 0 for any other module."""
    if isinstance(module, CONVS):
        per_output = math.prod(module.weight.shape[1:])  # in_channels / groups × kernel volume
        return sum(2 * math.prod(shape_out) * per_output for _, shape_out in extents.calls)
    if isinstance(module, nn.Linear):
        return sum(
            2 * math.prod(shape_in[:-1]) * module.in_features * module.out_features for shape_in, _ in extents.calls
        )
    return 0


@dataclass(frozen=True, kw_only=True)
class ModelFlops:
    """One sample's forward FLOPs: the whole model's, and each convolution and linear layer's by name; with
    the probe's shapes of every submodule, for plans that need them too."""

    total: int
    layers: Mapping[str, int]
    shapes: Mapping[str, Extents] = field(default_factory=dict, repr=False, compare=False)

    def share(self, names: Iterable[str]) -> float:
        """The fraction (0..1) of the model's FLOPs in the named layers."""
        return sum(self.layers.get(name, 0) for name in set(names)) / self.total if self.total else 0.0


def count_model_flops(model: nn.Module, sample: Tensor) -> ModelFlops:
    """Per-layer and total forward FLOPs of `model` on `sample` (batch 1), before any layer is swapped."""
    shapes, total = probe_shapes(model, sample, count_flops=True)
    layers = {
        name: layer_flops(module, shapes[name])
        for name, module in model.named_modules()
        if isinstance(module, FLOP_LAYERS)
    }
    return ModelFlops(total=total, layers=layers, shapes=shapes)
