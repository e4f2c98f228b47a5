"""What spatial parallelism adds to a step per layer it runs on slabs, on a toy (imported by the worker only:
it needs torch).

The analytical model of spatial parallelism (ddlbench.analysis.analytic.layer_splits.model_spatial_layers)
costs each windowed layer's halo exchange from the collectives point's ping-pong, its window from a copy's
bytes and each slab batch norm from its operator fit and two collectives' fits. The twenty-second scoring set
measured resnet56 on 1×28² at 0.30 of its spatial step (docs/analytic.md): 151 blocking calls a step, each
two-way halo exchange a median of 0.3-0.4 ms and a fifth of them one clock tick (4 ms) where the ping-pong
said 0.06 ms, and about 2 ms a layer outside the calls (the halo's narrow, cat and zeroed gradient slab, the
slab batch norm's plain tensor operations, their autograd Functions and Python) where the model counted
the copies' bytes alone. None of that is an α–β or an operator's FLOPs.

So this point times it whole, on every rank of the point at once, as a training point's ranks run: a toy of
UNITS units, each a 3×3 convolution (stride 1, padding 1, no bias), a batch norm and a ReLU on `channels`
× `side`² maps; per VARIANT the toy runs on slabs of 1/p of the rows over all the point's ranks, with the
spatial strategy's own layers (ddlbench.train.strategies.halo: SlabWindowed, SlabBatchNorm), and the
same toy unsplit on the rank's own slab alone (side/p rows, the convolution's padding at both ends), on
every rank at once. Both are trained as fsdp_unit_kernel trains its toys (time_toy_steps), without the
update (the region's gradient all-reduce and the update are costed apart): forward_s and backward_s per
step, at least MIN_STEPS timed steps. The machine file
takes the difference, slabs − alone, per unit (ddlbench.analysis.machine.spatial_layers).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddlbench.train.calibration.fsdp_unit_kernel import time_toy_steps
from ddlbench.train.calibration.layer_timing_kernel import SEED
from ddlbench.train.calibration.point import CalibrationPoint

UNITS = 8
BATCH = 2
# (channels, side): slabs of 16 KiB to 8 MiB a rank on two ranks: CIFAR's ResNets on 28²-64² inputs, an
# ImageNet ResNet's later stages, and large maps of few channels, whose copies and norm passes pin the cost
# per byte (a VGG's first layers on 512² images hold 64 MiB slabs) at little arithmetic
VARIANTS = ((16, 16), (64, 16), (16, 64), (64, 64), (16, 256), (8, 512))
MIN_STEPS = 20  # gloo's calls are bimodal (~0.2 ms or a clock tick): a median over fewer steps wanders


def toy(channels: int, device: torch.device) -> nn.Sequential:
    torch.manual_seed(SEED)
    units = [
        nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        for _ in range(UNITS)
    ]
    return nn.Sequential(*units).to(device).train()


def on_slabs(model: nn.Sequential, side: int) -> nn.Sequential:
    """`model` with its convolutions and batch norms swapped for the spatial strategy's slab versions over
    all the ranks (as SpatialTrainer._wrap_region swaps a model's region)."""
    from ddlbench.train.strategies.halo import SlabBatchNorm, SlabWindowed, halo_windows, rank_plan

    group = dist.group.WORLD
    parts, rank = dist.get_world_size(), dist.get_rank()
    windows = halo_windows(side, parts, kernel=3, stride=1, padding=1)
    for unit in model:
        unit[0] = SlabWindowed(unit[0], rank_plan(windows, rank, side), group)
        unit[1] = SlabBatchNorm(unit[1], group, parts, rank)
    return model


def run_spatial_layers(point: CalibrationPoint, device: torch.device) -> list[dict[str, Any]]:
    """One entry per variant: the toy's per-step parts, in seconds, on slabs over all the ranks and alone on
    the rank's own slab."""
    parts, rank = dist.get_world_size(), dist.get_rank()
    out = []
    for channels, side in VARIANTS:
        rows = side // parts
        generator = torch.Generator().manual_seed(SEED)
        whole = torch.randn(BATCH, channels, side, side, generator=generator)
        slab = whole.narrow(2, rank * rows, rows).contiguous().to(device)
        alone = time_toy_steps(toy(channels, device), slab, point, device, update=False, min_steps=MIN_STEPS)
        split = time_toy_steps(
            on_slabs(toy(channels, device), side), slab, point, device, update=False, min_steps=MIN_STEPS
        )
        out.append(
            {
                "kind": "spatial_layers",
                "units": UNITS,
                "channels": channels,
                "side": side,
                "batch": BATCH,
                "parts": parts,
                # a unit's input slab on one rank (float32): what its copies and its norm's passes scale with
                "slab_bytes": BATCH * channels * rows * side * 4,
                "halo_bytes": BATCH * channels * side * 4,  # one row each way (a 3×3 on two or more ranks)
                "alone": alone,
                "slabs": split,
            }
        )
    return out
