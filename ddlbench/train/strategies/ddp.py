"""Data parallelism with torch DistributedDataParallel: a replica per rank, gradients all-reduced in buckets."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ddlbench.train.strategies import OptimizerFactory, RankContext, Trainer


class DataParallelTrainer:
    """Each rank trains on its own contiguous slice of the global batch; DDP averages the gradients."""

    def __init__(self, model: nn.Module, *, ctx: RankContext, make_optimizer: OptimizerFactory) -> None:
        self.ctx = ctx
        model = model.to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids)
        self.optimizer = make_optimizer(self.model.parameters())

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        per_rank = global_batch_size // self.ctx.world_size
        return self.ctx.rank * per_rank, (self.ctx.rank + 1) * per_rank

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(inputs), targets)
        loss.backward()  # returns after the last bucket's all-reduce has finished
        self.optimizer.step()
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        if self.ctx.rank != 0:
            return None
        return {name: value.detach().cpu().clone() for name, value in self.model.module.state_dict().items()}


def parallelize_ddp(model: nn.Module, *, ctx: RankContext, make_optimizer: OptimizerFactory) -> Trainer:
    return DataParallelTrainer(model, ctx=ctx, make_optimizer=make_optimizer)
