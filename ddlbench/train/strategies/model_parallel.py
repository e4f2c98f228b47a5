"""DDLBench's naive model parallelism: one stage per rank, the whole batch handed stage to stage.

There is no micro-batching, so exactly one rank computes at any time: the baseline the pipeline
schedules are measured against. Activations go forward and gradients come back with point-to-point
send/recv, which autograd does not see, so each stage hands the gradient of its input back by hand.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.balance import plan_stages, probe_blocks, release_blocks
from ddlbench.train.strategies.common import count_parameters, cpu_state, gather_state_on_rank0


class ModelParallelTrainer:
    """Rank r runs stage r (a contiguous range of blocks) on the whole global batch."""

    def __init__(self, model: nn.Sequential, setup: StrategySetup) -> None:
        self.ctx, self.loss_fn = setup.ctx, setup.loss_fn
        world, rank = self.ctx.world_size, self.ctx.rank
        if setup.split != world:
            raise ValueError(f"model_parallel cuts the model over all {world} ranks; split is {setup.split}")
        probes = probe_blocks(model, setup.sample)
        self.plan = plan_stages(probes, world, setup.options.get("balance", "flops"))
        self.lo, self.hi = self.plan.bounds[rank]
        release_blocks(model, [(self.lo, self.hi)])
        self.blocks = [(index, model[index].to(self.ctx.device)) for index in range(self.lo, self.hi)]
        self.stage = nn.Sequential(*(block for _, block in self.blocks))
        self.first, self.last = rank == 0, rank == world - 1
        # what this stage receives: the previous block's output at batch 1 (the batch size comes with
        # each step), so the buffer is allocated before the data arrives
        self.input_shape = probes[self.lo - 1].output_shape[1:] if not self.first else None
        self.input_dtype = probes[self.lo - 1].output_dtype if not self.first else None
        self.optimizer = setup.make_optimizer(self.stage.parameters())
        self.execution = setup.execution
        self.execution.compile_module(self.stage, f"stage {rank}")  # in place: the blocks keep their names

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        # every rank gets the whole batch: the first consumes the inputs, the last the targets, and
        # the others read its size
        return 0, global_batch_size

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor | None:
        rank, device, execution = self.ctx.rank, self.ctx.device, self.execution
        self.optimizer.zero_grad(set_to_none=True)
        if self.first:
            x = execution.prepare_inputs(inputs)
        else:
            # under autocast activations cross in the autocast dtype, whatever dtype a block ends in
            dtype = execution.boundary_dtype(self.input_dtype)
            x = torch.empty((inputs.shape[0], *self.input_shape), dtype=dtype, device=device)
            dist.recv(x, src=rank - 1)
            x.requires_grad_(x.is_floating_point())
        with execution.autocast():
            out = self.stage(x)
        loss = None
        if self.last:
            with execution.autocast():
                loss = self.loss_fn(out, targets)
            execution.backward(loss)  # fp16: scaled, so every stage's gradients carry the scale
        else:
            out = execution.to_boundary(out)  # a cast autograd undoes on the way back
            dist.send(out.detach().contiguous(), dst=rank + 1)
            grad = torch.empty(out.shape, dtype=out.dtype, device=device)
            dist.recv(grad, src=rank + 1)
            execution.backward(out, grad)  # continue autograd from dL/d(output), which the next stage computed
        if not self.first:
            # dL/d(input) is what the previous stage needs to run its own backward
            grad_in = x.grad if x.grad is not None else torch.zeros_like(x)
            dist.send(grad_in.contiguous(), dst=rank - 1)
        execution.optimizer_step(self.optimizer)
        return loss.detach() if loss is not None else None

    def full_state_dict(self) -> dict[str, Tensor] | None:
        local: dict[str, Tensor] = {}
        for index, block in self.blocks:
            local.update(cpu_state(block, prefix=f"{index}."))
        return gather_state_on_rank0(local)

    def facts(self) -> dict[str, Any]:
        return {
            "mesh": {"mp": self.ctx.world_size},
            "coords": {"mp": self.ctx.rank},
            "local_parameters": count_parameters(self.stage),
            "stages": [self.ctx.rank],
            "stage_blocks": [list(bounds) for bounds in self.plan.bounds],
            "stage_costs": list(self.plan.stage_costs),
            "block_costs": list(self.plan.block_costs),
            "balance": self.plan.rule,
            "micro_batches": 1,
        }


def parallelize_model_parallel(model: nn.Module, setup: StrategySetup) -> Trainer:
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model_parallel cuts a flat nn.Sequential; got {type(model).__name__}")
    return ModelParallelTrainer(model, setup)
