"""The interface every parallelism strategy implements; the registry is ddlbench.catalog.STRATEGIES.

A strategy module defines `parallelize_<name>(model, setup) -> Trainer`. It decides how the model
is placed on the ranks and how one optimizer step runs; the kernel around it owns data and timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ddlbench.catalog import STRATEGIES, resolve_builder
from ddlbench.train.execution import Execution

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Who this rank is and what it runs on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


@dataclass(frozen=True, kw_only=True)
class StrategySetup:
    """Everything a strategy may use besides the model; each strategy reads only what it needs."""

    ctx: RankContext
    make_optimizer: OptimizerFactory
    loss_fn: LossFn  # the mean over a batch's samples (and positions); a micro-batch mean is the same function
    sample: Tensor  # one input sample with a batch dimension of 1, on the CPU: for shape and cost probes
    global_batch_size: int  # samples per optimizer step over the whole job
    micro_batches: int = 1  # pieces each replica's batch is cut into (pipeline strategies)
    split: int = 1  # ranks that share one model replica; world_size // split data-parallel replicas
    options: Mapping[str, str] = field(default_factory=dict)  # the strategy's options, defaults filled in
    # precision, memory format and compilation (the default: strict fp32, eager, contiguous); the step runs
    # forward and loss under execution.autocast(), then execution.backward(loss), execution.optimizer_step()
    execution: Execution = field(default_factory=Execution)

    @property
    def replicas(self) -> int:
        return self.ctx.world_size // self.split


class Trainer(Protocol):
    """One rank's share of a parallelized model."""

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        """[start, stop) of the global batch that this rank is fed (inputs and targets alike)."""
        ...

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor | None:
        """One optimizer step; returns the loss this rank computed over its batch (None where it computes none).

        Ranks that report a loss must together report the global batch's loss as their mean.
        """
        ...

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """The whole model's parameters and buffers, under the unparallelized model's names, on rank 0
        (None elsewhere); every rank must call it, as it may communicate. For checks against a reference."""
        ...

    def facts(self) -> dict[str, Any]:
        """JSON-able facts of this rank's share: mesh shape and coordinates, stages, micro-batches,
        local and total parameter counts, shard sizes. Written into the record."""
        ...

    # Optional: `close()`, called on every rank after the last step, stops a runtime the strategy
    # started (Horovod's background thread) before the process group is torn down.


def build_trainer(strategy: str, model: nn.Module, setup: StrategySetup) -> Trainer:
    parallelize = resolve_builder(STRATEGIES.get(strategy).builder)
    return parallelize(model, setup)
