"""Initial weights that do not depend on where, or in what order, a model's tensors come into being.

A model is initialised module by module: each module's own parameters and buffers (not its
children's) are drawn from the CPU generator seeded with `module_seed(seed, qualified name)`, inside
`torch.random.fork_rng`, so a module draws the same numbers whether the whole model is initialised
at once on one device or a sharding strategy materialises it module by module, in any order. The
draws always happen on the CPU, in the tensor's full (global) shape, and a rank keeps the part it
holds: the whole tensor, or the local shard of a DTensor. A CUDA generator would give other numbers
than the single-process CPU reference, and drawing only a shard would give another stream.

Meta-device models have shapes but no storage and consume no random numbers (PyTorch's meta device:
https://pytorch.org/docs/stable/meta.html). FSDP2 and DTensor tensor parallelism accept meta modules
and are then materialised with `module.to_empty(device=...)` followed by the user's initialisation
(the "meta-device initialization" of FSDP2's `fully_shard` docs,
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html, and of torchtitan); `materialise`
is that step, with the initialisation below, so a rank allocates its share of the model plus one
module drawn in full at a time, never the whole model.

A model's own initialisation (He-normal convolutions, GPT-2's scaled residual projections) is an
`InitRule` of one module, given its qualified name; modules it leaves alone get their own
`reset_parameters()`, PyTorch's default, which also resets buffers (BatchNorm's running statistics).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

# Attribute of the root module holding its InitPlan: a plain attribute survives fully_shard (which
# swaps the module's class in place) and parallelize_module (which returns the same module).
PLAN_ATTRIBUTE = "_ddlbench_init_plan"

InitRule = Callable[[str, nn.Module], bool]
"""Initialise one module's own parameters and buffers in place, drawing from the global CPU generator;
given (qualified name, module). Returns False to leave the module to its `reset_parameters()`."""

ModelT = TypeVar("ModelT", bound=nn.Module)


@dataclass(frozen=True, kw_only=True)
class InitPlan:
    """How a model's initial weights are drawn: the seed every module's stream derives from, and its rule."""

    seed: int
    rule: InitRule | None = None


def module_seed(seed: int, name: str) -> int:
    """The 63-bit seed of the module called `name` (\"\" for the root) in a model seeded with `seed`.

    A hash, not Python's hash(), so every process derives the same value (PYTHONHASHSEED differs)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def finish_model(model: ModelT, rule: InitRule | None = None) -> ModelT:
    """Builders end with this: attach the model's InitPlan and, unless it was built on the meta device,
    initialise it now. Its seed is the one `torch.manual_seed` last set (the kernel's build_model sets
    the point's seed before calling the builder), so a builder called directly after a manual_seed
    draws what the kernel would."""
    model.__dict__[PLAN_ATTRIBUTE] = InitPlan(seed=torch.initial_seed(), rule=rule)
    if not is_meta(model):
        initialise(model)
    return model


def init_plan(model: nn.Module) -> InitPlan:
    plan = model.__dict__.get(PLAN_ATTRIBUTE)
    if plan is None:
        raise ValueError(f"{type(model).__name__} has no InitPlan: its builder must end with finish_model()")
    return plan


def is_meta(model: nn.Module) -> bool:
    """Whether any of the model's parameters or buffers lacks storage (lives on the meta device)."""
    return any(t.is_meta for t in _tensors(model))


def materialise(model: ModelT, device: torch.device) -> ModelT:
    """Allocate a meta model's tensors on `device` (of a DTensor, only this rank's shard) and draw them.

    Peak memory: the local tensors, plus the one module being drawn in full on the CPU."""
    model.to_empty(device=device)
    initialise(model)
    return model


def initialise(model: nn.Module) -> None:
    """Draw every module's own parameters and buffers by the model's InitPlan, in place."""
    plan = init_plan(model)
    for name, module in model.named_modules():
        if _own_tensors(module):
            # no local name keeps one module's full draw alive while the next is drawn
            _fill(module, draw_module(plan, name, module))


def draw_module(plan: InitPlan, name: str, module: nn.Module) -> dict[str, Tensor]:
    """Fresh full-size CPU tensors for `module`'s own parameters and buffers, drawn by the plan.

    The module's tensors are swapped for the fresh ones while its rule or reset_parameters() runs (they
    read shapes and fill in place: nn.Linear's default derives its bounds from the weight's fan-in, which
    must be the full weight's, not a shard's), then restored untouched."""
    saved_parameters, saved_buffers = module._parameters, module._buffers
    parameters = {
        key: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"), requires_grad=p.requires_grad)
        for key, p in saved_parameters.items()
        if p is not None
    }
    buffers = {
        key: torch.empty(b.shape, dtype=b.dtype, device="cpu") for key, b in saved_buffers.items() if b is not None
    }
    module.__dict__["_parameters"] = {**saved_parameters, **parameters}  # keeps absent ones (bias=None)
    module.__dict__["_buffers"] = {**saved_buffers, **buffers}
    try:
        # fork_rng restores the CPU generator afterwards; only the CPU one is seeded (torch.manual_seed
        # would reseed every CUDA generator outside the fork), and only the CPU one is drawn from
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.default_generator.manual_seed(module_seed(plan.seed, name))
            if plan.rule is None or not plan.rule(name, module):
                reset = getattr(module, "reset_parameters", None)
                if reset is None:
                    raise TypeError(
                        f"module {name!r} ({type(module).__name__}) holds tensors but has no reset_parameters() "
                        "and its model's init rule leaves it alone"
                    )
                reset()
    finally:
        module.__dict__["_parameters"], module.__dict__["_buffers"] = saved_parameters, saved_buffers
    return {key: value.detach() for key, value in (parameters | buffers).items()}


def local_piece(full: Tensor, mesh: Any, placements: Sequence[Any]) -> Tensor:
    """This rank's part of `full` under a DTensor layout: a view, no communication.

    Shard(d) cuts with torch.chunk semantics (the last chunks may be short or empty), as DTensor and
    FSDP2 both do; mesh dimensions apply left to right, except FSDP2's _StridedShard, which marks a
    shard of what the other dimensions left (FSDP2 over a tensor-parallel parameter shards the tp
    shard again over dp), so it applies last."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.placement_types import _StridedShard

    coordinate = mesh.get_coordinate()
    strided = [i for i, p in enumerate(placements) if isinstance(p, _StridedShard)]
    piece = full
    for i in [i for i in range(len(placements)) if i not in strided] + strided:
        placement = placements[i]
        if isinstance(placement, Replicate):
            continue
        dim = getattr(placement, "dim", None)
        if dim is None:
            raise ValueError(f"cannot materialise a parameter placed as {placement} (only Shard and Replicate)")
        chunks = torch.chunk(piece, mesh.size(i), dim=dim)
        index = coordinate[i]
        piece = chunks[index] if index < len(chunks) else piece.narrow(dim, piece.size(dim), 0)
    return piece


@torch.no_grad()
def _fill(module: nn.Module, drawn: dict[str, Tensor]) -> None:
    for key, target in _own_tensors(module).items():
        if _is_dtensor(target):
            local = target.to_local()  # under no_grad: the DTensor's own local tensor, not a copy
            local.copy_(local_piece(drawn[key], target.device_mesh, target.placements))
        else:
            target.copy_(drawn[key])


def _is_dtensor(tensor: Tensor) -> bool:
    # torch.distributed.tensor costs a second to import: no tensor is a DTensor unless it is loaded
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def _own_tensors(module: nn.Module) -> dict[str, Tensor]:
    own = {key: p for key, p in module._parameters.items() if p is not None}
    return own | {key: b for key, b in module._buffers.items() if b is not None}


def _tensors(model: nn.Module):
    yield from model.parameters()
    yield from model.buffers()
