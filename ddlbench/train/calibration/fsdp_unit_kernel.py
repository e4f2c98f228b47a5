"""What FSDP2 adds to a step per unit it shards, on a model too small to compute (imported by the worker
only: it needs torch).

The analytical model of fsdp (ddlbench.analysis.analytic.data_parallel.model_fsdp) sets each block's
compute (layer timings or operators) beside what sharding it costs. The collectives' α–β fits price the
all-gathers and reduce-scatters as a collective benchmark calls them, but FSDP2 also runs its hooks in
Python, copies each unit's shards into a flat buffer and out of it, issues each collective asynchronously
and waits for it at once, and steps the optimizer over DTensor shards. On a 2-core host with gloo that
came to about 1.5 ms a unit in forward and 3.2 ms in backward, where the collectives' busy fits said
0.95 ms an all-gather and 0.33 ms a reduce-scatter; fsdp was predicted ×1.06 of ddp on one CI host and
measured ×1.8.

So this point times those costs whole, on every rank of the point at once, as a training point's ranks run:
a toy of UNITS units, each `layers` × Linear(width, width) (weight and bias: 2 tensors a layer), with
FSDP2's fully_shard on each unit and on the root over all the point's ranks (as
ddlbench.train.strategies.sharded shards a model), and the same toy unsharded. For each VARIANT
(layers, width) both are trained (SGD with momentum, loss = mean of the output's squares, a batch of
BATCH rows) for `warmup` untimed steps, then after a barrier max(`iterations`, MIN_STEPS) timed steps,
each part stamped as in layer_timing_kernel (host clock on a CPU, CUDA events on a GPU):
- forward_s: zero_grad + forward + loss; backward_s: backward(); update_s: the optimizer step.
Then the sharded toy again on a mesh of one rank (each rank its own, all at once): fsdp on one rank has no
peer, yet pays the hooks, the copies and the DTensor update (resnet8 on one rank measured ×1.13 of ddp's step).
The machine file takes the difference, sharded − unsharded, per unit (ddlbench.analysis.machine.fsdp_units).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddlbench.train.calibration.layer_timing_kernel import LEARNING_RATE, SEED, Stamps
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.kernel import MOMENTUM

UNITS = 8
BATCH = 4
# (layers per unit, width): 2 and 8 tensors a unit, at about 1 KiB and 1 MiB of parameters a unit
VARIANTS = ((1, 16), (4, 16), (1, 512), (4, 256))
MIN_STEPS = 20  # gloo's calls are bimodal (~0.2 ms or a few ms): a median over fewer steps wanders
PARTS = ("forward_s", "backward_s", "update_s")


def toy(layers: int, width: int, device: torch.device) -> nn.Sequential:
    torch.manual_seed(SEED)
    units = [nn.Sequential(*(nn.Linear(width, width) for _ in range(layers))) for _ in range(UNITS)]
    return nn.Sequential(*units).to(device)


def time_toy_steps(
    model: nn.Module,
    inputs: torch.Tensor,
    point: CalibrationPoint,
    device: torch.device,
    *,
    update: bool = True,
    min_steps: int = MIN_STEPS,
) -> dict[str, list[float]]:
    """A toy trained on `inputs` (loss = mean of the output's squares): `point.warmup` untimed steps, a barrier,
    max(`point.iterations`, `min_steps`) timed ones, each part in seconds: forward_s (zero_grad + forward +
    loss), backward_s (backward()) and, with `update`, update_s (an SGD step with momentum)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM) if update else None
    stamps = Stamps(device)

    def step() -> None:
        stamps.mark("start")
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        loss = model(inputs).square().mean()
        stamps.mark("forward")
        loss.backward()
        stamps.mark("backward")
        if optimizer is not None:
            optimizer.step()
        stamps.mark("end")

    for _ in range(point.warmup):
        step()
        stamps.seconds()
    if dist.is_initialized():
        dist.barrier()
    parts = PARTS if update else PARTS[:2]
    times: dict[str, list[float]] = {part: [] for part in parts}
    for _ in range(max(point.iterations, min_steps)):
        step()
        t = stamps.seconds()
        times["forward_s"].append(t["forward"])
        times["backward_s"].append(t["backward"] - t["forward"])
        if update:
            times["update_s"].append(t["end"] - t["backward"])
    return times


def run_fsdp_units(point: CalibrationPoint, device: torch.device) -> list[dict[str, Any]]:
    """One entry per variant and mesh (all the ranks; one rank): the unsharded and the sharded toy's per-step
    parts, in seconds."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size() if dist.is_initialized() else 1
    meshes = [init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))]
    if world > 1:  # each rank its own one-rank mesh: the second dimension of a world × 1 mesh
        meshes.append(init_device_mesh(device.type, (world, 1), mesh_dim_names=("replica", "dp"))["dp"])
    out = []
    for layers, width in VARIANTS:
        inputs = torch.randn(BATCH, width, generator=torch.Generator().manual_seed(SEED)).to(device)
        plain = time_toy_steps(toy(layers, width, device), inputs, point, device)
        for mesh in meshes:
            sharded = toy(layers, width, device)
            for unit in sharded.children():
                fully_shard(unit, mesh=mesh)
            fully_shard(sharded, mesh=mesh)
            out.append(
                {
                    "kind": "fsdp_units",
                    "units": UNITS,
                    "layers_per_unit": layers,
                    "width": width,
                    "tensors_per_unit": 2 * layers,
                    "unit_bytes": layers * (width * width + width) * 4,  # float32 weight and bias, unsharded
                    "mesh_ranks": mesh.size(),  # the ranks each unit is sharded over
                    "plain": plain,
                    "fsdp": time_toy_steps(sharded, inputs, point, device),
                }
            )
    return out
