"""ParaDL's spatial parallelism (Kahira et al., HPDC'21) and its data-parallel hybrid ("ds").

The ranks of an sp group each hold every weight and one contiguous slab of the activations along dim 2
(height, or depth for volumes). Before each convolution or pooling the ranks exchange the halo rows its
window reads (halo.py); norms share their statistics. Where the split axis stops dividing into equal
slabs (at the latest, the head's adaptive pool and linear layers) the slabs are all-gathered and the
rest of the model runs replicated. Weight gradients of the split region are partial sums (each rank saw
part of every image), so they are summed over the group; the replicated tail's are already whole.

torch's DTensor convolution (torch/distributed/tensor/_tp_conv.py) is not used: it splits the last
(width) axis only, over the default group's ranks (dist.get_rank(), not a mesh dimension, so not inside
a dp × sp mesh); it needs dilation 1, and stride 1 whenever there is padding (so no stride-2 3×3 or 7×7
stem); it swaps kernel//2 columns with ring neighbours (rank 0 also with the last rank), runs the
convolution with its padding on the widened slab and trims the surplus outputs; and it covers
convolution only: no pooling, no norm statistics. Here the rows come from the layer's exact window
(halo.py), for any stride, dilation and padding, along the axis ParaDL splits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddlbench.catalog.split_rules import ChildFacts, WindowFacts, slab_region
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.common import build_mesh, count_parameters, cpu_state, slice_of
from ddlbench.train.strategies.flops import Extents, count_model_flops, probe_shapes
from ddlbench.train.strategies.halo import (
    NORMS,
    WINDOWED,
    GatherSlabs,
    SlabBatchNorm,
    SlabGroupNorm,
    SlabWindowed,
    Window,
    geometry,
    halo_windows,
    output_extent,
    rank_plan,
)

# Leaf layers that act on each position alone, so they run on a slab unchanged. Dropout is left out on
# purpose: its masks would be drawn per slab from the same generator state on every rank.
POINTWISE = (
    nn.Identity,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.SiLU,
    nn.GELU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Mish,
)


@dataclass(frozen=True, kw_only=True)
class SplitLayer:
    """A windowed layer inside the split region and its global extents along the split axis."""

    name: str
    extent: int
    out_extent: int
    windows: tuple[Window, ...]  # the input rows each rank's output slab reads


@dataclass(frozen=True, kw_only=True)
class Region:
    """The prefix of top-level children that runs on slabs; the slabs are gathered before child `children`."""

    parts: int
    children: int
    reason: str  # why the region ends where it does
    input_extent: int
    layers: tuple[SplitLayer, ...]


def plan_region(
    model: nn.Sequential, sample: Tensor, parts: int, *, shapes: Mapping[str, Extents] | None = None
) -> Region:
    """The longest prefix of `model`'s children that can run on `parts` equal slabs along dim 2 (`shapes`:
    the probe of `model` on `sample`, when the caller has it already).

    Where the region ends is decided by ddlbench.catalog.split_rules from the children's facts, the rule
    planning applies to the same facts in the catalog's layer table."""
    shapes = shapes if shapes is not None else probe_shapes(model, sample)[0]
    extent = sample.shape[2] if sample.dim() >= 4 else 0
    facts = [child_facts(str(index), child, shapes) for index, child in enumerate(model)]
    children, reason = slab_region(extent, facts, parts)
    layers = []
    for index in range(children):
        for window in facts[index].windowed:
            geo = geometry(model.get_submodule(window.name))
            assert not isinstance(geo, str), geo  # a blocked layer ends the region before it
            args = {"kernel": geo.kernel[0], "stride": geo.stride[0], "padding": geo.padding[0]}
            windows = halo_windows(window.extent, parts, dilation=geo.dilation[0], **args)
            layers.append(
                SplitLayer(name=window.name, extent=window.extent, out_extent=window.out_extent, windows=windows)
            )
    return Region(parts=parts, children=children, reason=reason, input_extent=extent, layers=tuple(layers))


def child_facts(prefix: str, child: nn.Module, shapes: Mapping[str, Extents]) -> ChildFacts:
    """What spatial parallelism needs to know of one top-level child, whatever the number of ranks: its
    probed shapes and its leaf layers, up to and including the first that cannot run on slabs."""
    calls = shapes[prefix].calls
    if len(calls) != 1:
        return ChildFacts(calls=len(calls))
    ((shape_in, shape_out),) = calls
    windowed = []
    for name, module in child.named_modules(prefix=prefix):
        if next(module.children(), None) is not None or isinstance(module, POINTWISE + NORMS):
            continue  # containers are assumed to compose their layers locally (true of the zoo's blocks)
        window = _window_facts(name, module, shapes[name])
        windowed.append(window)
        if window.blocked is not None:
            break
    return ChildFacts(calls=1, in_shape=shape_in, out_shape=shape_out, windowed=tuple(windowed))


def _window_facts(name: str, module: nn.Module, extents: Extents) -> WindowFacts:
    if not isinstance(module, WINDOWED):
        return WindowFacts(name=name, blocked=f"{name} ({type(module).__name__}) mixes rows across the split axis")
    geo = geometry(module)
    if isinstance(geo, str):
        return WindowFacts(name=name, blocked=f"{name}: {geo}")
    pairs = {(shape_in[2], shape_out[2]) for shape_in, shape_out in extents.calls}
    if len(pairs) != 1:
        return WindowFacts(name=name, blocked=f"{name} is called with {len(pairs)} different extents")
    ((extent, out_extent),) = pairs
    args = {"kernel": geo.kernel[0], "stride": geo.stride[0], "padding": geo.padding[0], "dilation": geo.dilation[0]}
    if output_extent(extent, **args) != out_extent:
        return WindowFacts(name=name, blocked=f"{name}: ceil_mode adds an output row")
    return WindowFacts(name=name, extent=extent, out_extent=out_extent)


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attribute = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, attribute, new)


class SpatialTrainer:
    """One rank of a spatial group (and of a data-parallel replica, on a dp × sp mesh)."""

    def __init__(self, model: nn.Sequential, setup: StrategySetup, mesh: DeviceMesh) -> None:
        self.ctx, self.loss_fn, self.mesh = setup.ctx, setup.loss_fn, mesh
        self.group = mesh.get_group("sp")
        self.parts, self.index = mesh.size(mesh.mesh_dim_names.index("sp")), mesh.get_local_rank("sp")
        dp = "dp" in mesh.mesh_dim_names
        self.replicas, self.replica = (mesh.size(0), mesh.get_local_rank("dp")) if dp else (1, 0)
        self.dp_group = mesh.get_group("dp") if dp else None
        self.flops = count_model_flops(model, setup.sample)  # before any layer is swapped
        self.region = plan_region(model, setup.sample, self.parts, shapes=self.flops.shapes)
        self.model = model.to(self.ctx.device)
        self.halo_rows = self._wrap_region()
        # what this rank computes a slab of: the windowed layers really swapped (pools count 0 FLOPs)
        self.slab_layers = [name for name, m in self.model.named_modules() if isinstance(m, SlabWindowed)]
        self.region_params = list(self.model[: self.region.children].parameters())
        self.tail_params = list(self.model[self.region.children :].parameters())
        if {id(p) for p in self.region_params} & {id(p) for p in self.tail_params}:
            # its gradient would be part partial sums, part replicated: no one reduction is right
            raise ValueError("a parameter is used both inside and after the spatial region")
        self.optimizer = setup.make_optimizer(self.model.parameters())
        self.execution = setup.execution  # precision and channels_last; compile is refused (catalog)
        dist.barrier(group=self.group)  # creates the group's communicator before the first point-to-point

    def _wrap_region(self) -> dict[str, int]:
        """Swap the region's windowed layers and norms for their slab versions; halo rows per layer."""
        halo: dict[str, int] = {}
        split = {layer.name: layer for layer in self.region.layers}
        for index in range(self.region.children):
            for name, module in list(self.model[index].named_modules(prefix=str(index))):
                if name in split:
                    plan = rank_plan(split[name].windows, self.index, split[name].extent)
                    halo[name] = plan.halo_rows
                    _replace(self.model, name, SlabWindowed(module, plan, self.group))
                elif isinstance(module, nn.BatchNorm2d | nn.BatchNorm3d):
                    _replace(self.model, name, SlabBatchNorm(module, self.group, self.parts, self.index))
                elif isinstance(module, nn.GroupNorm):
                    _replace(self.model, name, SlabGroupNorm(module, self.group, self.parts, self.index))
        return halo

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        # every rank of an sp group is fed its replica's whole batch and cuts its own rows from it
        return slice_of(global_batch_size, self.replica, self.replicas)

    def forward(self, inputs: Tensor) -> Tensor:
        split = self.region.children
        x = inputs
        if split:
            rows = self.region.input_extent // self.parts
            x = inputs.narrow(2, self.index * rows, rows)
        for index, child in enumerate(self.model):
            if index == split and split:
                x = GatherSlabs.apply(x, self.group, self.parts, self.index)
            x = child(x)
        if split == len(self.model):
            x = GatherSlabs.apply(x, self.group, self.parts, self.index)
        return x

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.execution.autocast():  # halos and gathers travel in the autocast dtype
            loss = self.loss_fn(self.forward(self.execution.prepare_inputs(inputs)), targets)  # same on all sp ranks
        self.execution.backward(loss)
        # region: sum over the sp group and mean over replicas in one all-reduce over all ranks (the mesh
        # is dp × sp, so all ranks = every sp group of every replica); tail: mean over replicas only
        _reduce_gradients(self.region_params, None, 1.0 / self.replicas)
        if self.replicas > 1:
            _reduce_gradients(self.tail_params, self.dp_group, 1.0 / self.replicas)
        self.execution.optimizer_step(self.optimizer)
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        # every rank holds every weight under the original names (the slab layers keep them)
        return cpu_state(self.model) if self.ctx.rank == 0 else None

    def facts(self) -> dict[str, Any]:
        names = self.mesh.mesh_dim_names
        layers = self.region.layers
        return {
            "mesh": {dim: self.mesh.size(i) for i, dim in enumerate(names)},
            "coords": {dim: self.mesh.get_local_rank(dim) for dim in names},
            "local_parameters": count_parameters(self.model),
            "spatial_children": self.region.children,
            "gather_before_child": self.region.children,
            "gather_reason": self.region.reason,
            "split_extent": self.region.input_extent,
            "split_layers": len(layers),
            "halo_rows": self.halo_rows,  # rows of the window each split layer receives on this rank
            "halo_rows_total": sum(self.halo_rows.values()),
            "slab_rows_first": layers[0].extent // self.parts if layers else None,  # first split layer's input
            "slab_rows_last": layers[-1].out_extent // self.parts if layers else None,  # last one's output
            # fraction of one sample's forward FLOPs in the layers this rank computes a slab of
            "split_flops_share": self.flops.share(self.slab_layers),
            "gradient_reduction": (
                "after backward, not overlapped: one flat all-reduce of the spatial region's gradients over all "
                "ranks (sum over sp, mean over dp), then one of the replicated tail's over dp"
                if self.replicas > 1
                else "after backward, not overlapped: one flat all-reduce (sum) of the spatial region's gradients"
            ),
        }


def _reduce_gradients(parameters: Iterable[nn.Parameter], group: dist.ProcessGroup | None, scale: float) -> None:
    """Sum .grad over `group` in one flat all-reduce, then scale; a missing gradient counts as zeros so
    every rank's flat buffer has the same layout."""
    params = list(parameters)
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat.mul_(scale)
    offset = 0
    for p in params:
        chunk = flat[offset : offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += p.numel()


def parallelize_spatial(model: nn.Module, setup: StrategySetup) -> Trainer:
    mesh = init_device_mesh(setup.ctx.device.type, (setup.ctx.world_size,), mesh_dim_names=("sp",))
    return SpatialTrainer(model, setup, mesh)


def parallelize_dp_spatial(model: nn.Module, setup: StrategySetup) -> Trainer:
    return SpatialTrainer(model, setup, build_mesh(setup.ctx, setup.split, "sp"))
