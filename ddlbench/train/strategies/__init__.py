"""The interface every parallelism strategy implements; the registry is ddlbench.catalog.STRATEGIES.

A strategy module defines `parallelize_<name>(model, *, ctx, make_optimizer) -> Trainer`. It decides
how the model is placed and how one optimizer step runs; the kernel around it owns data and timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from ddlbench.catalog import STRATEGIES, resolve_builder

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Who this rank is and what it runs on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


class Trainer(Protocol):
    """One rank's share of a parallelized model."""

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        """[start, stop) of the global batch that this rank feeds in."""
        ...

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor | None:
        """One optimizer step; returns the loss of this rank's batch (None where no loss is computed)."""
        ...

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """The whole model's parameters and buffers on rank 0 (None elsewhere); for checks against a reference."""
        ...


def build_trainer(strategy: str, model: nn.Module, *, ctx: RankContext, make_optimizer: OptimizerFactory) -> Trainer:
    parallelize = resolve_builder(STRATEGIES.get(strategy).builder)
    return parallelize(model, ctx=ctx, make_optimizer=make_optimizer)
