"""ParaDL's filter and channel parallelism (Kahira et al., HPDC'21) and its df hybrid with data parallelism.

Filter parallelism gives each of p ranks a slice of every layer's output channels (filters): a rank
convolves the full input with its filters, and the slices are all-gathered into the full activation
the next (replicated) layer needs. Channel parallelism gives each rank a slice of every layer's input
channels: a rank convolves its slice of the input with the matching slice of every filter, and the
partial outputs are summed with an all-reduce. Norms, activations, pools, grouped convolutions and
layers whose channels do not divide by p stay replicated, and every rank of a group is fed the same
batch and computes the same loss, so what is replicated stays identical without any reduction. In the
df hybrid the groups are replicas fed different slices of the batch, and DDP averages their gradients
over the dp dimension as the ddp strategy does (buckets all-reduced during backward).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ddlbench.catalog import split_rules
from ddlbench.catalog.split_rules import Kind, LayerFacts
from ddlbench.train.recording.comms import trace_ddp
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies import collectives as C
from ddlbench.train.strategies.common import (
    build_mesh,
    count_parameters,
    cpu_state,
    ddp_options,
    slice_of,
)
from ddlbench.train.strategies.flops import count_model_flops

log = logging.getLogger(__name__)

LayerOp = Callable[[Tensor, Tensor, Tensor | None], Tensor]

# the exact types are split_rules.SPLITTABLE_TYPES, named there so planning can apply them without torch
_SPLITTABLE = (nn.Conv2d, nn.Conv3d, nn.Linear)


def layer_facts(name: str, layer: nn.Module, flops: int = 0) -> LayerFacts:
    """What the filter/channel split rules (ddlbench.catalog.split_rules) need to know of a layer."""
    if isinstance(layer, nn.Linear):
        inputs, outputs, groups, padding_mode = layer.in_features, layer.out_features, 1, "zeros"
    else:
        inputs, outputs, groups, padding_mode = layer.in_channels, layer.out_channels, layer.groups, layer.padding_mode
    return LayerFacts(
        name=name,
        type=type(layer).__name__,
        in_channels=inputs,
        out_channels=outputs,
        groups=groups,
        padding_mode=padding_mode,
        flops=flops,
    )


def why_replicated(layer: nn.Module, parts: int, kind: Kind) -> str | None:
    """None when `layer` can be split over `parts` ranks the `kind` way; otherwise why it stays whole."""
    return split_rules.why_replicated(layer_facts("", layer), parts, kind)


def plan_split(model: nn.Module, parts: int, kind: Kind) -> dict[str, str | None]:
    """Every convolution and linear layer's name → None if it is split, or the reason it stays replicated."""
    return {
        name: why_replicated(module, parts, kind)
        for name, module in model.named_modules()
        if type(module) in _SPLITTABLE
    }


def _functional(layer: nn.Module) -> LayerOp:
    """The layer's computation as a function of (input, weight, bias), with its hyper-parameters bound."""
    if isinstance(layer, nn.Linear):
        return F.linear
    conv = F.conv2d if isinstance(layer, nn.Conv2d) else F.conv3d
    return functools.partial(conv, stride=layer.stride, padding=layer.padding, dilation=layer.dilation)


class SplitLayer(nn.Module):
    """A convolution or linear layer whose weight is sliced over a group; parameter names stay the original's.

    `shard_dims` maps each sliced parameter to the dimension it is sliced along, for rebuilding the
    full weight. The per-sample sizes of the layer's full input and output are kept from the last
    forward, for the communication volume in the facts.
    """

    shard_dims: dict[str, int]

    def __init__(self, layer: nn.Module, group: C.Group) -> None:
        super().__init__()
        self.group = group
        self.parts, self.index = dist.get_world_size(group), dist.get_rank(group)
        self.op = _functional(layer)
        self.channel_dim = -1 if isinstance(layer, nn.Linear) else 1  # where activations carry channels
        self.layer_type = type(layer).__name__
        self.input_elements = self.output_elements = 0

    def _slice(self, tensor: Tensor, dim: int) -> nn.Parameter:
        start, stop = slice_of(tensor.shape[dim], self.index, self.parts)
        return nn.Parameter(tensor.detach().narrow(dim, start, stop - start).clone())

    def _measure(self, x: Tensor, out: Tensor) -> Tensor:
        self.input_elements, self.output_elements = x[0].numel(), out[0].numel()
        return out

    def extra_repr(self) -> str:
        return f"{self.layer_type}, weight {tuple(self.weight.shape)}, slice {self.index} of {self.parts}"


class FilterParallel(SplitLayer):
    """This rank's filters: full input in, all-gathered full output out; the input's gradient is summed."""

    def __init__(self, layer: nn.Module, group: C.Group) -> None:
        super().__init__(layer, group)
        self.weight = self._slice(layer.weight, 0)
        self.bias = self._slice(layer.bias, 0) if layer.bias is not None else None
        self.shard_dims = {"weight": 0, "bias": 0}

    def forward(self, x: Tensor) -> Tensor:
        # each rank's output slice depends on all of x, so dL/dx is the sum of the ranks' partial gradients
        partial = self.op(C.copy_to_group(x, self.group), self.weight, self.bias)
        return self._measure(x, C.gather_from_group(partial, self.channel_dim, self.group))


class ChannelParallel(SplitLayer):
    """This rank's input channels: its slice of the input convolved with its slice of every filter, summed."""

    def __init__(self, layer: nn.Module, group: C.Group) -> None:
        super().__init__(layer, group)
        self.weight = self._slice(layer.weight, 1)  # (out, in, ...) for both convolutions and linear layers
        # replicated and added once, to the sum: added to every rank's partial output it would count p times
        self.bias = nn.Parameter(layer.bias.detach().clone()) if layer.bias is not None else None
        self.shard_dims = {"weight": 1}

    def forward(self, x: Tensor) -> Tensor:
        own = C.slice_for_group(x, self.channel_dim, self.group)
        out = C.reduce_from_group(self.op(own, self.weight, None), self.group)
        if self.bias is not None:
            out = out + (self.bias if self.channel_dim == -1 else self.bias.view(-1, *[1] * (out.dim() - 2)))
        return self._measure(x, out)


@dataclass(frozen=True, kw_only=True)
class GroupLayout:
    """Where this rank sits: the group a layer is split over, and the data-parallel replicas around it."""

    group: C.Group  # the filter/channel group (None: the whole world)
    dp_group: C.Group = None
    dp_size: int = 1
    dp_index: int = 0
    mesh: dict[str, int] = field(default_factory=dict)
    coords: dict[str, int] = field(default_factory=dict)


class ParaDLTrainer:
    """Filter or channel parallelism inside a group of ranks fed the same batch; data parallel across groups."""

    def __init__(self, model: nn.Module, setup: StrategySetup, *, kind: Kind, layout: GroupLayout) -> None:
        self.ctx, self.loss_fn, self.kind, self.layout = setup.ctx, setup.loss_fn, kind, layout
        self.parts = dist.get_world_size(layout.group)
        self.flops = count_model_flops(model, setup.sample)  # before any layer is swapped
        self.plan = plan_split(model, self.parts, kind)
        split_type = FilterParallel if kind == "filter" else ChannelParallel
        for name, reason in self.plan.items():
            if reason is None:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, split_type(model.get_submodule(name), layout.group))
        self.model = model.to(self.ctx.device)
        self.split_layers = {name: m for name, m in self.model.named_modules() if isinstance(m, SplitLayer)}
        if not self.split_layers:  # still a valid run, but every rank then trains the whole model alone
            log.warning("%s parallelism over %d ranks splits no layer of this model", kind, self.parts)
        self.optimizer = setup.make_optimizer(self.model.parameters())
        self.execution = setup.execution  # precision and channels_last; compile is refused (catalog)
        # replicas (dp_filter) average their gradients as ddp does: DDP's buckets, each all-reduced over the
        # dp group as soon as backward has produced it. The same slice index on every replica holds the same
        # slice, so a plain average is right. Every rank built the same weights: no initial broadcast.
        self.forward_model: nn.Module = self.model
        if layout.dp_size > 1:
            device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(
                self.model, device_ids=device_ids, process_group=layout.dp_group, **ddp_options()
            )
            trace_ddp(self.forward_model, layout.dp_group)

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        # the whole replica batch on every rank of the group: the split is over channels, not samples
        return slice_of(global_batch_size, self.layout.dp_index, self.layout.dp_size)

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        execution = self.execution
        with execution.autocast():  # the split layers' collectives carry activations in the autocast dtype
            loss = self.loss_fn(self.forward_model(execution.prepare_inputs(inputs)), targets)
        execution.backward(loss)  # with replicas: returns after DDP's last bucket is averaged over the dp group
        execution.optimizer_step(self.optimizer)
        return loss.detach()

    def _sharded(self) -> list[tuple[str, nn.Parameter, int]]:
        """(original name, local slice, dimension) of every sliced parameter, in the same order on all ranks."""
        return [
            (f"{name}.{pname}", getattr(module, pname), dim)
            for name, module in self.split_layers.items()
            for pname, dim in module.shard_dims.items()
            if getattr(module, pname) is not None
        ]

    def full_state_dict(self) -> dict[str, Tensor] | None:
        # replicated entries are identical on every rank of a group and, after averaging, across replicas
        state = cpu_state(self.model) if self.ctx.rank == 0 else None
        for name, local, dim in self._sharded():
            full = C.gather_slices(local.detach(), dim, self.layout.group)  # every group gathers its own
            if state is not None:
                state[name] = full.cpu()
        return state

    def facts(self) -> dict[str, Any]:
        sharded = [p for _, p, _ in self._sharded()]
        sharded_local = sum(p.numel() for p in sharded)
        local = count_parameters(self.model)
        inputs = sum(m.input_elements for m in self.split_layers.values())
        outputs = sum(m.output_elements for m in self.split_layers.values())
        # per sample, from the last forward: filter gathers each split layer's output and sums the
        # gradient of its input; channel sums the output and gathers the input's gradient
        forward, backward = ("all_gather", "all_reduce") if self.kind == "filter" else ("all_reduce", "all_gather")
        replicated = {name: reason for name, reason in self.plan.items() if reason is not None}
        return {
            "mesh": self.layout.mesh,
            "coords": self.layout.coords,
            "local_parameters": local,
            "full_parameters": local + (self.parts - 1) * sharded_local,
            "sharded_parameters": sharded_local,  # this rank's slices
            "replicated_parameters": local - sharded_local,
            "sharded_weight_bytes": sum(p.numel() * p.element_size() for p in sharded),
            "split_layers": len(self.split_layers),
            "replicated_layers": len(replicated),
            "split_layer_names": list(self.split_layers),
            "replicated_layer_reasons": replicated,
            "collective_elements_per_sample": {f"{forward}_forward": outputs, f"{backward}_backward": inputs},
            # fraction of one sample's forward FLOPs in the layers this rank computes a slice of
            "split_flops_share": self.flops.share(self.split_layers),
            "gradient_reduction": (
                "bucketed all-reduce over dp overlapped with backward (DDP, 25 MiB buckets)"
                if self.layout.dp_size > 1
                else "none: the group shares one batch, so each rank's gradients (its slices', the replicated "
                "layers') are already complete"
            ),
        }


def _whole_world(setup: StrategySetup, dim: str) -> GroupLayout:
    return GroupLayout(group=None, mesh={dim: setup.ctx.world_size}, coords={dim: setup.ctx.rank})


def parallelize_filter(model: nn.Module, setup: StrategySetup) -> Trainer:
    return ParaDLTrainer(model, setup, kind="filter", layout=_whole_world(setup, "fp"))


def parallelize_channel(model: nn.Module, setup: StrategySetup) -> Trainer:
    return ParaDLTrainer(model, setup, kind="channel", layout=_whole_world(setup, "cp"))


def parallelize_dp_filter(model: nn.Module, setup: StrategySetup) -> Trainer:
    mesh = build_mesh(setup.ctx, setup.split, "fp")
    layout = GroupLayout(
        group=mesh.get_group("fp"),
        dp_group=mesh.get_group("dp"),
        dp_size=setup.replicas,
        dp_index=mesh.get_local_rank("dp"),
        mesh={"dp": setup.replicas, "fp": setup.split},
        coords={"dp": mesh.get_local_rank("dp"), "fp": mesh.get_local_rank("fp")},
    )
    return ParaDLTrainer(model, setup, kind="filter", layout=layout)
