"""Pipeline parallelism with torch.distributed.pipelining: GPipe, 1F1B, interleaved 1F1B, and dp × pp.

The flat nn.Sequential is cut into balanced contiguous stages (`balance`); each rank wraps its
stage(s) in a PipelineStage built by hand (shapes are inferred from the first micro-batch) and a
schedule runs the micro-batches. Gradients are the mean over micro-batches (the schedules' default
scale_grads), which for equal micro-batches is the gradient of the replica's batch mean loss. In dp × pp
each stage module is wrapped in DDP over its dp group, which torch.distributed.pipelining drives itself:
the replicas' gradients are all-reduced in buckets during the last micro-batch's backward.

The facts carry the order in which each stage really ran micro-batches forward and backward in the first
step and how many it held at once, observed by hooks on the stage modules (ActionRecorder): GPipe and 1F1B
compute the same numbers, so only that order tells them apart.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.nn.parallel import DistributedDataParallel

from ddlbench.train.execution import Execution
from ddlbench.train.recording import wrap_in_phase
from ddlbench.train.recording.comms import trace_ddp
from ddlbench.train.strategies import StrategySetup, Trainer
from ddlbench.train.strategies.balance import BlockProbe, StagePlan, plan_stages, probe_blocks, release_blocks
from ddlbench.train.strategies.common import (
    build_mesh,
    count_parameters,
    cpu_state,
    ddp_options,
    gather_state_on_rank0,
    slice_of,
)

SINGLE_STAGE_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass(frozen=True, kw_only=True)
class PipelineLayout:
    """Where this rank sits: its place in the pipeline and, for dp × pp, which replica it serves."""

    pp_size: int
    pp_rank: int
    pp_group: dist.ProcessGroup | None  # None: the whole world is one pipeline
    dp_size: int = 1
    dp_rank: int = 0
    dp_group: dist.ProcessGroup | None = None


class ActionRecorder:
    """The order in which one step runs micro-batches forward and backward through this rank's stages,
    observed from the stage modules' side rather than taken from the schedule's name.

    A forward hook on each stage module records its k-th call as forward of micro-batch k and hangs a
    gradient hook on that call's output, which fires when backward reaches the output, i.e. when the stage
    starts that micro-batch's backward: so each B is tied to the forward it undoes. The hooks are removed
    after the one step they watch (`stop`), so timed steps run without them.
    """

    def __init__(self, stages: list[tuple[int, nn.Module]]) -> None:
        self.events: list[tuple[str, int, int]] = []  # (F or B, stage index, micro-batch index)
        self.stages = [stage for stage, _ in stages]
        self.handles = [module.register_forward_hook(self._on_forward(stage)) for stage, module in stages]

    def _on_forward(self, stage: int):
        forwards = itertools.count()

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            micro_batch = next(forwards)
            self.events.append(("F", stage, micro_batch))
            if isinstance(output, Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self.events.append(("B", stage, micro_batch)))

        return hook

    def stop(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def sequence(self, stage: int | None = None) -> str:
        """The actions as "F0 F1 B0 …", of one stage, or of all this rank's stages ("F0@s0 …" when several)."""
        several = stage is None and len(self.stages) > 1
        return " ".join(
            f"{kind}{micro_batch}" + (f"@s{s}" if several else "")
            for kind, s, micro_batch in self.events
            if stage is None or s == stage
        )

    def peak_in_flight(self, stage: int | None = None) -> int:
        """The most micro-batches forwarded but not yet backwarded at once (of one stage, or of the rank):
        what the schedule makes a stage hold activations for."""
        in_flight = peak = 0
        for kind, s, _ in self.events:
            if stage is None or s == stage:
                in_flight += 1 if kind == "F" else -1
                peak = max(peak, in_flight)
        return peak


class ContiguousStage(nn.Sequential):
    """A stage's blocks in sequence, run under the point's autocast, returning a contiguous output.

    The schedule sends outputs as they are and sizes receive buffers from the declared (contiguous)
    layout; a block ending in a view must not break that, nor may a block whose output dtype under
    autocast depends on its last op: under bf16/fp16 every stage outputs the autocast dtype
    (`Execution.boundary_dtype`, which `stage_io` declares). The names of the state stay those of a
    plain nn.Sequential.
    """

    def __init__(self, *blocks: nn.Module, execution: Execution | None = None) -> None:
        super().__init__(*blocks)
        self.execution = execution or Execution()

    def forward(self, x: Tensor) -> Tensor:
        # autocast here, inside the schedule's forward, rather than around schedule.step(): the schedule
        # runs backward too, which AMP keeps out of autocast (https://pytorch.org/docs/stable/amp.html)
        with self.execution.autocast():
            out = super().forward(x)
        return self.execution.to_boundary(out).contiguous()


def _meta(shape: tuple[int, ...], dtype: torch.dtype, *, requires_grad: bool) -> Tensor:
    return torch.empty(shape, dtype=dtype, device="meta").requires_grad_(requires_grad and dtype.is_floating_point)


def stage_io(
    probes: list[BlockProbe],
    sample: Tensor,
    bounds: tuple[int, int],
    micro_batch: int,
    execution: Execution | None = None,
) -> tuple[Tensor, Tensor]:
    """Meta tensors of one micro-batch's input and output of the stage holding blocks [lo, hi).

    Given both, PipelineStage runs in its static mode. Left to infer them, it would run the stage once
    on an uninitialised tensor of the right shape at the first step: BatchNorm's running statistics
    would absorb that garbage (we saw inf) and dropout would draw random numbers the reference does not.
    """
    lo, hi = bounds
    cross = (execution or Execution()).boundary_dtype  # what a ContiguousStage outputs
    if lo == 0:
        inputs = _meta((micro_batch, *sample.shape[1:]), sample.dtype, requires_grad=False)
    else:
        before = probes[lo - 1]
        inputs = _meta((micro_batch, *before.output_shape[1:]), cross(before.output_dtype), requires_grad=True)
    last = probes[hi - 1]
    return inputs, _meta((micro_batch, *last.output_shape[1:]), cross(last.output_dtype), requires_grad=True)


class PipelineTrainer:
    """This rank's stage(s) of one pipeline replica, driven by a torch.distributed.pipelining schedule."""

    def __init__(
        self, model: nn.Sequential, setup: StrategySetup, *, schedule: str, stages_per_rank: int, layout: PipelineLayout
    ) -> None:
        self.ctx, self.layout, self.schedule_name = setup.ctx, layout, schedule
        self.micro_batches = setup.micro_batches
        num_stages = layout.pp_size * stages_per_rank
        replica_batch = setup.global_batch_size // layout.dp_size
        if replica_batch % self.micro_batches:
            raise ValueError(
                f"a replica's batch of {replica_batch} does not split into {self.micro_batches} micro-batches"
            )
        probes = probe_blocks(model, setup.sample)
        self.plan: StagePlan = plan_stages(probes, num_stages, setup.options.get("balance", "flops"))
        # looped placement: rank r holds stages r, r + pp, r + 2·pp … (what the interleaved schedule expects)
        self.stage_indices = [layout.pp_rank + k * layout.pp_size for k in range(stages_per_rank)]
        release_blocks(model, [self.plan.bounds[s] for s in self.stage_indices])
        self.modules: list[tuple[int, nn.Sequential]] = []  # (first block index, stage module)
        self.stages: list[PipelineStage] = []
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        for s in self.stage_indices:
            lo, hi = self.plan.bounds[s]
            module = ContiguousStage(*(model[i] for i in range(lo, hi)), execution=setup.execution)
            module = module.to(self.ctx.device)
            self.modules.append((lo, module))
            inputs, outputs = stage_io(
                probes, setup.sample, (lo, hi), replica_batch // self.micro_batches, setup.execution
            )
            # dp × pp: replicas of a stage average gradients as ddp does, in DDP's buckets. PipelineStage
            # runs every micro-batch but the last under no_sync and lets the reducer all-reduce the buckets
            # during the last micro-batch's backward. Every rank built the same weights: no initial broadcast.
            submodule: nn.Module = module
            if layout.dp_size > 1:
                submodule = DistributedDataParallel(
                    module, device_ids=device_ids, process_group=layout.dp_group, **ddp_options()
                )
                trace_ddp(submodule, layout.dp_group)
            stage = PipelineStage(
                submodule,
                s,
                num_stages,
                self.ctx.device,
                input_args=inputs,
                output_args=outputs,
                group=layout.pp_group,
            )
            # the schedule runs each micro-batch's forward and backward through these: the stage's busy time
            wrap_in_phase(stage, "forward_one_chunk", "forward")
            wrap_in_phase(stage, "backward_one_chunk", "backward")
            self.stages.append(stage)
        # the schedule calls backward itself: the loss it gets is computed under autocast and, under fp16,
        # scaled; the unscaled losses are kept for the record
        self.execution = setup.execution
        self.loss_fn = self.execution.schedule_loss(setup.loss_fn)
        if stages_per_rank == 1:
            self.schedule = SINGLE_STAGE_SCHEDULES[schedule](
                self.stages[0], n_microbatches=self.micro_batches, loss_fn=self.loss_fn
            )
        else:
            self.schedule = ScheduleInterleaved1F1B(
                self.stages, n_microbatches=self.micro_batches, loss_fn=self.loss_fn
            )
        self.has_first = any(stage.is_first for stage in self.stages)
        self.has_last = any(stage.is_last for stage in self.stages)
        self.parameters = [p for _, module in self.modules for p in module.parameters()]
        self.optimizer = setup.make_optimizer(self.parameters)
        # watches the first step only (a warm-up step); its observations go into the facts
        self.recorder: ActionRecorder | None = ActionRecorder(
            [(s, module) for s, (_, module) in zip(self.stage_indices, self.modules, strict=True)]
        )
        self.observed: dict[str, Any] = {}

    def local_batch_range(self, global_batch_size: int) -> tuple[int, int]:
        # every rank of a replica is fed the replica's slice: the first stage reads the inputs, the
        # last the targets
        return slice_of(global_batch_size, self.layout.dp_rank, self.layout.dp_size)

    def step(self, inputs: Tensor, targets: Tensor) -> Tensor | None:
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[Tensor] = []
        # only the first stage passes inputs and only the last passes targets; outputs are not merged
        # (return_outputs=False), as nothing reads them and merging would copy the whole batch
        args = (self.execution.prepare_inputs(inputs),) if self.has_first else ()
        if self.has_last:
            self.schedule.step(*args, target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(*args, return_outputs=False)
        if self.recorder is not None:
            self._keep_observations(self.recorder)
            self.recorder = None
        # replicas of a dp × pp mesh: DDP averaged the stages' gradients during the last backward; fp16: the
        # scaler unscales this rank's gradients and skips the step on every rank if any stage overflowed
        self.execution.optimizer_step(self.optimizer)
        if not self.has_last:
            return None
        # the mean over equal micro-batches of their mean losses is the replica batch's mean loss (unscaled)
        return torch.stack(self.loss_fn.take()).mean()

    def _keep_observations(self, recorder: ActionRecorder) -> None:
        recorder.stop()
        self.observed = {
            "observed_step": 0,  # the first (warm-up) step: the hooks are gone before the timed ones
            "observed_actions": recorder.sequence(),
            "observed_actions_by_stage": {str(s): recorder.sequence(s) for s in self.stage_indices},
            "peak_in_flight_micro_batches": recorder.peak_in_flight(),
            "peak_in_flight_by_stage": {str(s): recorder.peak_in_flight(s) for s in self.stage_indices},
        }

    def full_state_dict(self) -> dict[str, Tensor] | None:
        local: dict[str, Tensor] = {}
        if self.layout.dp_rank == 0:  # the replicas are equal; one is enough
            for lo, module in self.modules:
                for i, block in enumerate(module):
                    local.update(cpu_state(block, prefix=f"{lo + i}."))
        return gather_state_on_rank0(local)

    def facts(self) -> dict[str, Any]:
        layout = self.layout
        mesh, coords = {"pp": layout.pp_size}, {"pp": layout.pp_rank}
        if layout.dp_group is not None:
            mesh, coords = {"dp": layout.dp_size} | mesh, {"dp": layout.dp_rank} | coords
        return {
            "mesh": mesh,
            "coords": coords,
            "local_parameters": sum(count_parameters(module) for _, module in self.modules),
            "schedule": self.schedule_name,
            "micro_batches": self.micro_batches,
            "stages": self.stage_indices,
            "num_stages": len(self.plan.bounds),
            "stage_blocks": [list(bounds) for bounds in self.plan.bounds],
            "stage_costs": list(self.plan.stage_costs),
            "block_costs": list(self.plan.block_costs),
            "balance": self.plan.rule,
            "gradient_reduction": (
                "bucketed all-reduce over dp overlapped with the last micro-batch's backward (DDP under "
                "torch.distributed.pipelining: the other micro-batches run under no_sync)"
                if layout.dp_size > 1
                else "none: each stage's gradients live on its own rank"
            ),
        } | self.observed


def _pure_layout(setup: StrategySetup, name: str) -> PipelineLayout:
    world = setup.ctx.world_size
    if setup.split != world:
        raise ValueError(f"{name} cuts the model over all {world} ranks; split is {setup.split}")
    return PipelineLayout(pp_size=world, pp_rank=setup.ctx.rank, pp_group=None)


def _sequential(model: nn.Module, name: str) -> nn.Sequential:
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"{name} cuts a flat nn.Sequential; got {type(model).__name__}")
    return model


def parallelize_gpipe(model: nn.Module, setup: StrategySetup) -> Trainer:
    layout = _pure_layout(setup, "gpipe")
    return PipelineTrainer(_sequential(model, "gpipe"), setup, schedule="gpipe", stages_per_rank=1, layout=layout)


def parallelize_1f1b(model: nn.Module, setup: StrategySetup) -> Trainer:
    layout = _pure_layout(setup, "1f1b")
    return PipelineTrainer(_sequential(model, "1f1b"), setup, schedule="1f1b", stages_per_rank=1, layout=layout)


def parallelize_interleaved_1f1b(model: nn.Module, setup: StrategySetup) -> Trainer:
    layout = _pure_layout(setup, "interleaved_1f1b")
    return PipelineTrainer(
        _sequential(model, "interleaved_1f1b"), setup, schedule="interleaved_1f1b", stages_per_rank=2, layout=layout
    )


def parallelize_dp_pp(model: nn.Module, setup: StrategySetup) -> Trainer:
    schedule = setup.options.get("schedule", "1f1b")
    if schedule not in SINGLE_STAGE_SCHEDULES:
        raise ValueError(f"dp_pp schedule {schedule!r} unknown; accepted: {', '.join(SINGLE_STAGE_SCHEDULES)}")
    mesh = build_mesh(setup.ctx, setup.split, "pp")
    coords = mesh.get_coordinate()
    layout = PipelineLayout(
        pp_size=setup.split,
        pp_rank=coords[1],
        pp_group=mesh.get_group("pp"),
        dp_size=setup.replicas,
        dp_rank=coords[0],
        dp_group=mesh.get_group("dp"),
    )
    return PipelineTrainer(_sequential(model, "dp_pp"), setup, schedule=schedule, stages_per_rank=1, layout=layout)
