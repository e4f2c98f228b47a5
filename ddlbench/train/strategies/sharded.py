"""Sharded data parallelism: FSDP2 (ZeRO stage 3) and a hand-written ZeRO stage 2.

Both feed each rank its own slice of the global batch, like DDP; they differ from DDP, and from each
other, in which of parameters, gradients and optimizer state a rank keeps whole (Rajbhandari et al.
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"):

| strategy | parameters | gradients          | optimizer state |
|----------|------------|--------------------|-----------------|
| ddp      | full       | full               | full            |
| zero2    | full       | shard (after r-s)  | shard           |
| fsdp     | shard      | shard              | shard           |
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh

from ddlbench.train.models.init import is_meta, materialise
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.common import count_parameters, slice_of

# The flat-tensor collectives: torch 2.13 names them *_single and deprecates (FutureWarning) the
# *_tensor names, which are the only ones torch 2.10, the floor, has. Whichever this torch has.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# ZeRO-2's gradient buckets, in MiB of fp32 gradient; the same default as DDP's bucket_cap_mb, so that
# ddp and zero2 issue comparable numbers of collectives. Small models fit in one bucket.
DEFAULT_BUCKET_CAP_MB = 25.0


def _state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(elements, bytes) of the tensors an optimizer keeps as state (momentum buffers, Adam moments);
    a DTensor counts its local shard."""
    elements = size = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor) and value.dim() > 0:  # step counters are 0-d
                local = value.to_local() if hasattr(value, "to_local") else value
                elements += local.numel()
                size += local.numel() * local.element_size()
    return elements, size


# --------------------------------------------------------------------------------------------------
# FSDP2 (ZeRO-3)


class FullyShardedTrainer:
    """FSDP2 over a 1-D mesh: each top-level block is one unit whose parameters live as dim-0 shards
    (DTensors) and are all-gathered for its forward, freed after it, and gathered again for its backward;
    gradients are reduce-scattered back to shards, so the optimizer sees and keeps only shards."""

    def __init__(self, model: nn.Module, setup: StrategySetup) -> None:
        from torch.distributed.fsdp import fully_shard  # +0.9 s of import; only this strategy pays it

        self.ctx, self.loss_fn = setup.ctx, setup.loss_fn
        self.reshard_after_forward = True
        self.total_parameters = sum(p.numel() for p in model.parameters())
        # a meta model (the kernel's, as the catalog marks fsdp materialises_shards) is sharded first and
        # only then materialised, so no rank ever holds the whole model: FSDP2 leaves meta parameters on
        # meta as dim-0 DTensor shards, and to_empty + initialisation fill each rank's shard (FSDP2's
        # meta-device initialisation, https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html)
        starts_on_meta = is_meta(model)
        if not starts_on_meta:
            model = model.to(self.ctx.device)
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,), mesh_dim_names=("dp",))
        # the blocks are the natural units: one all-gather per block keeps at most ~one block unsharded
        # at a time; the root call then owns what no block does (nothing, for our flat models) and
        # drives the root's pre-forward work (lazy init, prefetch order)
        children = list(model.children())
        for child in children:
            fully_shard(child, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        if starts_on_meta:
            # each module drawn whole on the CPU, one at a time, and this rank's dim-0 chunk kept
            materialise(model, self.ctx.device)
        self.units = len(children) + 1
        self.model = model
        self.optimizer = setup.make_optimizer(model.parameters())  # DTensor shards: state is sharded too
        self.execution = setup.execution  # precision only: channels_last and compile are refused (catalog)

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        return slice_of(global_batch_size, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        # gradients live from one backward to the next step's start, as in ddp.py, so the memory a step
        # starts with compares like with like: full (ddp), or a shard (zero2, fsdp)
        self.optimizer.zero_grad(set_to_none=True)
        execution = self.execution
        with execution.autocast():  # FSDP2 gathers fp32 parameters; autocast casts them per op
            loss = self.loss_fn(self.model(execution.prepare_inputs(inputs)), targets)
        execution.backward(loss)  # FSDP2 waits for the last reduce-scatter before backward returns
        execution.optimizer_step(self.optimizer)  # fp16: the scaler unscales the DTensor gradient shards
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        # full_tensor() per entry rather than torch.distributed.checkpoint's get_model_state_dict: both
        # all-gather one tensor at a time, but this keeps the order explicit (state_dict() order, the
        # same on every rank, as every rank must join each gather) and copies to the CPU only on rank
        # 0, dropping the gathered tensor at once elsewhere, so no rank ever holds more than one full
        # tensor besides its shards. fully_shard keeps the original names (no wrapper prefix).
        state: dict[str, Tensor] = {}
        for name, value in self.model.state_dict().items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value  # buffers are plain
            if self.ctx.rank == 0:
                state[name] = full.detach().cpu().clone()
        return state if self.ctx.rank == 0 else None

    def facts(self) -> dict[str, Any]:
        local = count_parameters(self.model)
        element = next(self.model.parameters()).element_size()
        state_elements, state_bytes = _state_bytes(self.optimizer)
        return {
            "mesh": {"dp": self.ctx.world_size},
            "coords": {"dp": self.ctx.rank},
            "local_parameters": local,  # this rank's shard of every parameter (dim-0 chunks, unpadded)
            "total_parameters": self.total_parameters,
            "units": self.units,  # each top-level block, plus the root
            "reshard_after_forward": self.reshard_after_forward,
            "shard_bytes": local * element,  # parameters; gradients and optimizer state follow the same shards
            "optimizer_state_elements": state_elements,
            "optimizer_state_bytes": state_bytes,
        }


def parallelize_fsdp(model: nn.Module, setup: StrategySetup) -> Trainer:
    return FullyShardedTrainer(model, setup)


# --------------------------------------------------------------------------------------------------
# ZeRO stage 2, by hand


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """A run of parameters laid out back to back in the flat buffer, padded to a multiple of the ranks
    so that it reduce-scatters into equal shards; rank r owns [start + r*shard, start + (r+1)*shard)."""

    index: int
    params: tuple[nn.Parameter, ...]
    offsets: tuple[int, ...]  # of each parameter in the flat buffer
    start: int
    elements: int  # parameter elements, without padding
    padded: int

    def shard_range(self, rank: int, world: int) -> tuple[int, int]:
        lo, hi = slice_of(self.padded, rank, world)
        return self.start + lo, self.start + hi


def plan_buckets(params: list[nn.Parameter], cap_elements: int, world: int) -> list[Bucket]:
    """Cut the parameters into buckets in reverse registration order (the order backward produces
    their gradients, so the first bucket is ready first); a parameter larger than the cap gets its own."""
    runs: list[list[nn.Parameter]] = []
    filled = 0
    for p in reversed(params):
        if not runs or filled + p.numel() > cap_elements:
            runs.append([])
            filled = 0
        runs[-1].append(p)
        filled += p.numel()
    buckets: list[Bucket] = []
    start = 0
    for index, run in enumerate(runs):
        sizes = [p.numel() for p in run]
        offsets = [start + sum(sizes[:i]) for i in range(len(run))]
        padded = -(-sum(sizes) // world) * world
        buckets.append(
            Bucket(
                index=index,
                params=tuple(run),
                offsets=tuple(offsets),
                start=start,
                elements=sum(sizes),
                padded=padded,
            )
        )
        start += padded
    return buckets


class ZeroStage2Trainer:
    """ZeRO-2: a full replica per rank, but each rank reduces, keeps optimizer state for, and updates
    only 1/world of the (flattened) parameters, then all-gathers the updated shards.

    Every parameter is re-pointed to a view of one flat buffer (fp32 here). As backward finishes a bucket's
    gradients, a hook copies them into a bucket-sized buffer, frees the parameters' own .grad at once,
    and starts an asynchronous reduce-scatter of the bucket (pre-divided by the ranks: an average) whose
    output is this rank's shard of the averaged gradient. The optimizer's parameters are views of this
    rank's shard of each bucket, so SGD with momentum (elementwise) updates exactly the elements that
    per-parameter SGD would, and its state is shard-sized.
    """

    def __init__(self, model: nn.Module, setup: StrategySetup) -> None:
        self.ctx, self.loss_fn = setup.ctx, setup.loss_fn
        self.world, self.rank = self.ctx.world_size, self.ctx.rank
        self.model = model.to(self.ctx.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"zero2 flattens parameters of one dtype; this model has {sorted(map(str, dtypes))}")
        self.bucket_cap_mb = float(setup.options.get("bucket_cap_mb", DEFAULT_BUCKET_CAP_MB))
        element = params[0].element_size()
        cap_elements = max(1, int(self.bucket_cap_mb * 2**20) // element)
        self.buckets = plan_buckets(params, cap_elements, self.world)
        self.total_parameters = sum(p.numel() for p in params)
        padded_total = sum(b.padded for b in self.buckets)
        self.flat = torch.zeros(padded_total, dtype=params[0].dtype, device=self.ctx.device)
        with torch.no_grad():
            for bucket in self.buckets:
                for p, offset in zip(bucket.params, bucket.offsets, strict=True):
                    view = self.flat[offset : offset + p.numel()]
                    view.copy_(p.reshape(-1))
                    p.data = view.view_as(p)  # the same Parameter object (hooks, names) over the flat buffer
        # nn.Parameter over a view shares its storage: the optimizer's in-place update lands in self.flat
        self.shards = [nn.Parameter(self.flat[slice(*b.shard_range(self.rank, self.world))]) for b in self.buckets]
        self.optimizer = setup.make_optimizer(self.shards)
        self.execution = setup.execution
        # compiled in place over the flat-buffer views; the post-accumulate hooks below still fire, once the
        # compiled backward has produced the gradients
        self.execution.compile_module(self.model)
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._ready = [0] * len(self.buckets)
        self._next = 0  # buckets are launched in index order on every rank, so the collectives match
        self._in_flight: deque[dist.Work] = deque()
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_gradient)

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        return slice_of(global_batch_size, self.rank, self.world)

    def _on_gradient(self, param: nn.Parameter) -> None:
        bucket = self._bucket_of[param]
        self._ready[bucket.index] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: Bucket) -> None:
        full = torch.zeros(bucket.padded, dtype=self.flat.dtype, device=self.flat.device)
        for p, offset in zip(bucket.params, bucket.offsets, strict=True):
            if p.grad is not None:  # a parameter the loss did not reach contributes zeros
                lo = offset - bucket.start
                full[lo : lo + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None  # the full gradient is freed here, not after the whole backward
        full.div_(self.world)  # a sum of gradients / world each: the average, portable to any backend
        shard = torch.empty(bucket.padded // self.world, dtype=full.dtype, device=full.device)
        # gloo implements reduce-scatter in torch 2.13 (checked), so CPU and NCCL runs do the same
        work = _reduce_scatter(shard, full, async_op=True)
        self.shards[bucket.index].grad = shard
        self._in_flight.append(work)
        # drop the bucket buffers whose reduce-scatter is done, so full gradients do not pile up
        while self._in_flight and self._in_flight[0].is_completed():
            self._in_flight.popleft().wait()

    def _finish_reduction(self) -> None:
        # buckets that never filled (parameters without gradients this step) still take part
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next])
            self._next += 1
        while self._in_flight:
            self._in_flight.popleft().wait()
        self._ready = [0] * len(self.buckets)
        self._next = 0

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)  # the shard gradients, kept since the last step as in ddp.py
        execution = self.execution
        with execution.autocast():
            loss = self.loss_fn(self.model(execution.prepare_inputs(inputs)), targets)
        execution.backward(loss)
        self._finish_reduction()
        execution.optimizer_step(self.optimizer)  # over the shards; fp16 skips on every rank alike
        gathers: list[dist.Work] = []
        for bucket, shard in zip(self.buckets, self.shards, strict=True):
            # the input must not alias the output; a shard-sized copy is cheap
            out = self.flat[bucket.start : bucket.start + bucket.padded]
            gathers.append(_all_gather(out, shard.detach().clone(), async_op=True))
        for work in gathers:
            work.wait()
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        # every rank holds the whole, all-gathered model; buffers (BatchNorm statistics) are rank 0's,
        # updated from its own slice, as with DDP
        if self.rank != 0:
            return None
        return {name: value.detach().cpu().clone() for name, value in self.model.state_dict().items()}

    def facts(self) -> dict[str, Any]:
        state_elements, state_bytes = _state_bytes(self.optimizer)
        shard_elements = sum(s.numel() for s in self.shards)
        return {
            "mesh": {"dp": self.world},
            "coords": {"dp": self.rank},
            "local_parameters": self.total_parameters,  # ZeRO-2 keeps the full model on every rank
            "total_parameters": self.total_parameters,
            "padding_elements": self.flat.numel() - self.total_parameters,  # to a multiple of world, per bucket
            "shard_elements": shard_elements,  # of the gradient and of the parameters this rank updates
            "gradient_shard_bytes": shard_elements * self.flat.element_size(),
            "optimizer_state_elements": state_elements,
            "optimizer_state_bytes": state_bytes,
            "bucket_cap_mb": self.bucket_cap_mb,
            "buckets": len(self.buckets),
            "bucket_elements": [b.padded for b in self.buckets],
            "gradient_reduction": "reduce_scatter",
        }


def parallelize_zero2(model: nn.Module, setup: StrategySetup) -> Trainer:
    return ZeroStage2Trainer(model, setup)
