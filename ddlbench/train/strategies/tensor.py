"""Megatron-style tensor parallelism (Shoeybi et al. 2019) with DTensor, alone or under data parallelism.

Within each transformer block, the attention's q/k/v projections and the MLP's first Linear are
split column-wise (a rank computes heads/tp whole heads and 4d/tp hidden units) and the attention's
output projection and the MLP's second Linear row-wise, so each half of a block costs one all-reduce
forward (after the row-wise Linear) and one backward (of the gradient of the block's normalised input).
The embeddings, LayerNorms and the LM head stay replicated: every tp rank computes them whole on the
same full activations. Sharding the vocabulary too would save their memory but needs a vocabulary-
parallel cross-entropy and a vocabulary the ranks divide, and the benchmark's loss is a plain mean.

`tensor` feeds every rank the whole batch. `dp_tp` lays ranks on a (dp, tp) mesh: each dp replica is
a tp group fed its slice of the global batch, and FSDP2 (fully_shard over the dp dimension, after TP)
shards each replica's parameters over dp and averages gradients across replicas with a reduce-scatter.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from ddlbench.train.models.init import is_meta, materialise
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.common import build_mesh, count_parameters, slice_of

# The Linears a block shards, by their name inside the block (ddlbench.train.models.gpt's layout).
COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc")
ROWWISE = ("attn.out", "mlp.proj")


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _block_indices(model: nn.Sequential) -> list[int]:
    """The top-level children holding every Linear the plan shards (the transformer blocks)."""
    return [i for i, child in enumerate(model) if all(_has(child, name) for name in COLWISE + ROWWISE)]


def tensor_parallel_plan(model: nn.Sequential) -> dict[str, ParallelStyle]:
    """parallelize_module's plan for a GPT model: per block, q/k/v and fc column-wise, out and proj row-wise."""
    blocks = _block_indices(model)
    if not blocks:
        raise ValueError(f"tensor parallelism needs transformer blocks with Linears {COLWISE + ROWWISE}; none found")
    plan: dict[str, ParallelStyle] = {}
    for i in blocks:
        # q, k and v read the same normalised input; making it one replicated DTensor at the attention's
        # entrance sums their three partial input gradients locally and all-reduces once (Megatron's f),
        # where three separately wrapped Linears would all-reduce three times (CommDebugMode on gpt_tiny,
        # 2 layers: 4 all-reduces forward and 4 backward with this, 8 backward without)
        plan[f"{i}.attn"] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False
        )
        plan |= {f"{i}.{name}": ColwiseParallel() for name in COLWISE}
        plan |= {f"{i}.{name}": RowwiseParallel() for name in ROWWISE}
    return plan


def _parameter_groups(model: nn.Module) -> list[dict[str, Any]]:
    """The parameters grouped by where they live: plain tensors, and DTensors by mesh.

    The optimizers' foreach kernels (CUDA's default) refuse a list mixing plain tensors with DTensors
    ("aten._foreach_add_.List got mixed torch.Tensor and DTensor", measured with foreach=True on the
    replicated and sharded parameters of `tensor`); one group per kind, with the same hyper-parameters,
    computes the same update.
    """
    groups: dict[Any, list[nn.Parameter]] = {}
    for p in model.parameters():
        key = (p.device_mesh.mesh_dim_names, tuple(p.device_mesh.shape)) if isinstance(p, DTensor) else None
        groups.setdefault(key, []).append(p)
    return [{"params": params} for params in groups.values()]


class TensorParallelTrainer:
    """One rank of a tp group (and, on a 2-D mesh, of a dp replica) training a tensor-parallel transformer."""

    def __init__(self, model: nn.Sequential, setup: StrategySetup, mesh: DeviceMesh) -> None:
        self.ctx, self.loss_fn, self.mesh = setup.ctx, setup.loss_fn, mesh
        self.names = mesh.mesh_dim_names or ()
        self.total_parameters = sum(p.numel() for p in model.parameters())
        self.blocks = _block_indices(model)
        # a meta model (the kernel's: the catalog marks tensor and dp_tp materialises_shards) is sharded
        # on the meta device, by tp and then by FSDP over dp, and only then materialised: each rank
        # allocates its DTensor shards and the replicated layers, never the whole model (DTensor and
        # FSDP2 leave meta tensors unallocated; torchtitan initialises the same way,
        # https://pytorch.org/docs/stable/distributed.tensor.parallel.html)
        starts_on_meta = is_meta(model)
        if not starts_on_meta:
            model = model.to(self.ctx.device)
        self.model = parallelize_module(model, mesh["tp"], tensor_parallel_plan(model))
        # measured on the tp shard itself, before FSDP shards it again over dp
        attn = self.model[self.blocks[0]].attn
        self.heads = attn.q.weight.shape[0] // attn.head_dim  # a DTensor's shape is the global one
        self.local_heads = attn.q.weight.to_local().shape[0] // attn.head_dim
        if "dp" in self.names:
            # after TP, so FSDP shards the tp shards again over dp (2-D DTensors); per block, so only one
            # block's parameters are gathered at a time, then the root for the embeddings and the head
            for i in self.blocks:
                fully_shard(self.model[i], mesh=mesh["dp"])
            fully_shard(self.model, mesh=mesh["dp"])
        if starts_on_meta:
            # each module drawn whole on the CPU, one at a time, and this rank's piece of it kept
            materialise(self.model, self.ctx.device)
        self.optimizer = setup.make_optimizer(_parameter_groups(self.model))
        self.execution = setup.execution  # precision only: compile is refused (catalog)

    def _coords(self) -> dict[str, int]:
        coordinate = self.mesh.get_coordinate() or []
        return dict(zip(self.names, coordinate, strict=True))

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        if "dp" not in self.names:
            return 0, global_batch_size  # every tp rank computes on the whole batch
        return slice_of(global_batch_size, self._coords()["dp"], self.mesh["dp"].size())

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.execution.autocast():
            loss = self.loss_fn(self.model(inputs), targets)
        self.execution.backward(loss)
        self.execution.optimizer_step(self.optimizer)  # fp16: the scaler unscales the DTensor gradients
        return loss.detach()  # tp peers hold the same value; dp replicas their slice's

    def full_state_dict(self) -> dict[str, Tensor] | None:
        state = {}
        for name, value in self.model.state_dict().items():
            # full_tensor() gathers the shards, a collective every rank joins in the same order
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            state[name] = whole.detach().cpu().clone()
        return state if self.ctx.rank == 0 else None

    def facts(self) -> dict[str, Any]:
        return {
            "mesh": dict(zip(self.names, (int(s) for s in self.mesh.shape), strict=True)),
            "coords": self._coords(),
            "local_parameters": count_parameters(self.model),
            "total_parameters": self.total_parameters,
            "sharded_blocks": len(self.blocks),
            "colwise": list(COLWISE),
            "rowwise": list(ROWWISE),
            "replicated_over_tp": ["embeddings", "layernorms", "lm_head"],
            "heads": self.heads,
            "local_heads": self.local_heads,
            "fsdp_over_dp": "dp" in self.names,
            "gradient_reduction": (
                "FSDP2 reduce-scatter over dp, one per block as its backward ends (overlapped with backward); "
                "each rank keeps and updates its shard"
                if "dp" in self.names
                else "none beyond tensor parallelism's own collectives: every tp rank trains on the whole batch"
            ),
        }


def parallelize_tensor(model: nn.Sequential, setup: StrategySetup) -> Trainer:
    mesh = init_device_mesh(setup.ctx.device.type, (setup.ctx.world_size,), mesh_dim_names=("tp",))
    return TensorParallelTrainer(model, setup, mesh)


def parallelize_dp_tp(model: nn.Sequential, setup: StrategySetup) -> Trainer:
    return TensorParallelTrainer(model, setup, build_mesh(setup.ctx, setup.split, "tp"))
