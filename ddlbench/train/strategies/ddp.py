"""Data parallelism with torch DistributedDataParallel: a replica per rank, gradients all-reduced in buckets."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ddlbench.train.recording.comms import trace_ddp
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.common import count_parameters, cpu_state, ddp_options, slice_of


class DataParallelTrainer:
    """Each rank trains on its own contiguous slice of the global batch; DDP averages the gradients."""

    def __init__(self, model: nn.Module, setup: StrategySetup) -> None:
        self.ctx, self.loss_fn = setup.ctx, setup.loss_fn
        self.bucket_cap_mb = float(setup.options.get("bucket_cap_mb", "25"))
        model = model.to(self.ctx.device)
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        # every rank built the same weights from the point's seed, so DDP's initial broadcast would copy
        # them onto themselves; skipping it also spares the memory probe a buffer that gloo's worker
        # thread frees where the probe cannot see (ddlbench.train.memory)
        self.model = DistributedDataParallel(
            model, device_ids=device_ids, bucket_cap_mb=self.bucket_cap_mb, **ddp_options()
        )
        trace_ddp(self.model)  # DDP's own averaging, with each bucket's issue and completion stamped
        self.optimizer = setup.make_optimizer(self.model.parameters())
        self.execution = setup.execution
        # compiled around DDP, not inside it: dynamo then splits the graph at DDP's bucket boundaries
        # (torch._dynamo's DDPOptimizer), so buckets are still all-reduced while backward goes on
        # (https://pytorch.org/docs/stable/notes/ddp.html, "TorchDynamo DDPOptimizer")
        self.execution.compile_module(self.model, "ddp")

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        return slice_of(global_batch_size, self.ctx.rank, self.ctx.world_size)

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.execution.autocast():
            loss = self.loss_fn(self.model(self.execution.prepare_inputs(inputs)), targets)
        self.execution.backward(loss)  # returns after the last bucket's all-reduce has finished
        self.execution.optimizer_step(self.optimizer)
        return loss.detach()

    def full_state_dict(self) -> dict[str, Tensor] | None:
        return cpu_state(self.model.module) if self.ctx.rank == 0 else None

    def facts(self) -> dict[str, Any]:
        buckets = self.model._get_ddp_logging_data().get("rebuilt_bucket_sizes")
        return {
            "mesh": {"dp": self.ctx.world_size},
            "coords": {"dp": self.ctx.rank},
            "local_parameters": count_parameters(self.model.module),
            "bucket_cap_mb": self.bucket_cap_mb,
            "bucket_bytes": [int(b) for b in str(buckets).split(", ")] if buckets else None,
        }


def parallelize_ddp(model: nn.Module, setup: StrategySetup) -> Trainer:
    return DataParallelTrainer(model, setup)
