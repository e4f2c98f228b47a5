"""Cutting a flat nn.Sequential into contiguous stages of balanced cost (pipeline and model parallelism).

The cut is the exact linear-partition optimum: the largest stage cost is as small as it can be for
the given per-block costs. Costs are forward FLOPs of one sample or parameter counts, measured by
`probe_blocks`, which also records each block's output shape so receivers can size their buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.catalog.stage_cut import partition

BalanceRule = Literal["flops", "params"]
BALANCE_RULES: tuple[BalanceRule, ...] = ("flops", "params")


@dataclass(frozen=True, kw_only=True)
class BlockProbe:
    """What one forward pass of a block on a batch-1 sample tells: its cost and its output."""

    flops: int  # forward FLOPs (2×MACs of conv/matmul; FlopCounterMode counts nothing else)
    parameters: int  # parameter elements
    output_shape: tuple[int, ...]  # with the batch dimension first (1 here)
    output_dtype: torch.dtype
    output_elements: int


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """Which blocks each stage holds: bounds[s] = [lo, hi) of the model's children."""

    rule: BalanceRule
    block_costs: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]

    @property
    def stage_costs(self) -> tuple[int, ...]:
        return tuple(sum(self.block_costs[lo:hi]) for lo, hi in self.bounds)


def probe_blocks(model: nn.Sequential, sample: Tensor) -> list[BlockProbe]:
    """Run `sample` (batch 1) through the children one at a time, counting FLOPs and noting outputs.

    Runs in eval mode without gradients, so BatchNorm statistics are not updated and dropout draws
    no random numbers (the ranks' RNG streams stay as the model's seed left them); the modes are
    restored afterwards.
    """
    modes = {module: module.training for module in model.modules()}
    model.eval()
    probes = []
    try:
        with torch.no_grad():
            x = sample
            for child in model:
                with FlopCounterMode(display=False) as counter:
                    y = child(x)
                probes.append(
                    BlockProbe(
                        flops=int(counter.get_total_flops()),
                        parameters=sum(p.numel() for p in child.parameters()),
                        output_shape=tuple(y.shape),
                        output_dtype=y.dtype,
                        output_elements=y.numel(),
                    )
                )
                x = y
    finally:
        for module, training in modes.items():
            module.training = training
    return probes


def block_costs(probes: Sequence[BlockProbe], rule: BalanceRule) -> tuple[int, ...]:
    """Per-block cost under `rule`, never zero.

    FlopCounterMode counts only convolutions and matrix products; a norm, pooling or embedding block
    would cost nothing and could be piled onto any stage for free. Each block costs at least one
    FLOP per output element (it touches each once) and at least one parameter, a floor that is tiny
    next to the convolutions and matmuls yet keeps every block weighing something.
    """
    if rule == "flops":
        return tuple(max(p.flops, p.output_elements, 1) for p in probes)
    if rule == "params":
        return tuple(max(p.parameters, 1) for p in probes)
    raise ValueError(f"unknown balance rule {rule!r}; accepted: {', '.join(BALANCE_RULES)}")


def plan_stages(probes: Sequence[BlockProbe], stages: int, rule: str) -> StagePlan:
    """The balanced cut of the probed blocks into `stages` stages."""
    if rule not in BALANCE_RULES:
        raise ValueError(f"unknown balance rule {rule!r}; accepted: {', '.join(BALANCE_RULES)}")
    costs = block_costs(probes, rule)  # type: ignore[arg-type]
    return StagePlan(rule=rule, block_costs=costs, bounds=partition(costs, stages))  # type: ignore[arg-type]


def release_blocks(model: nn.Sequential, keep: Sequence[tuple[int, int]]) -> None:
    """Move the children outside the kept ranges to the meta device, freeing their storage.

    Every rank builds the whole model; without this each would hold all of it, and the per-rank
    memory figures of a model cut over ranks would count blocks the rank never runs.
    """
    kept = {i for lo, hi in keep for i in range(lo, hi)}
    for index, child in enumerate(model):
        if index not in kept:
            child.to(torch.device("meta"))
