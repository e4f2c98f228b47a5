"""The per-rank training loop of one point: data, model, strategy, timed steps, memory."""

from __future__ import annotations

import logging
import resource
import socket
import time

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.catalog import DATASETS, MODELS, resolve_builder
from ddlbench.point import Point
from ddlbench.records import RankResult
from ddlbench.train.data import BatchSource, open_dataset
from ddlbench.train.faults import planned_fault, strike
from ddlbench.train.losses import loss_for
from ddlbench.train.memory import TensorPeak
from ddlbench.train.strategies import RankContext, StrategySetup, build_trainer

log = logging.getLogger(__name__)

# Distinct batches materialised on the device before timing starts; steps cycle through them, so
# data generation never sits inside a timed step (like the synthetic benchmarks of Horovod/DDLBench).
DATA_POOL_STEPS = 8
MOMENTUM = 0.9


def build_model(point: Point) -> nn.Module:
    """The point's model with its initial weights drawn from the point's seed (identical on every rank)."""
    model_spec, dataset_spec = MODELS.get(point.model), DATASETS.get(point.dataset)
    if model_spec.input_kind != dataset_spec.input_kind:
        raise ValueError(
            f"model {point.model} takes {model_spec.input_kind} input; dataset {point.dataset} gives "
            f"{dataset_spec.input_kind}"
        )
    torch.manual_seed(point.seed)
    builder = resolve_builder(model_spec.builder)
    return builder(
        sample_shape=dataset_spec.sample_shape,
        num_outputs=dataset_spec.num_outputs,
        **dict(point.model_options),
        **dict(model_spec.shape),
    )


def open_point_data(point: Point) -> BatchSource:
    return open_dataset(DATASETS.get(point.dataset), seed=point.seed, path=point.data_path or None)


def step_batches(
    point: Point, start: int, stop: int, device: torch.device, dataset: BatchSource | None = None
) -> list[tuple[Tensor, Tensor]]:
    """This rank's samples [start, stop) of each of the pool's global batches."""
    dataset = dataset or open_point_data(point)
    global_batch = point.global_batch_size
    pool = min(point.warmup_steps + point.steps, DATA_POOL_STEPS)
    batches = []
    for step in range(pool):
        inputs, targets = dataset.batch(step * global_batch + start, stop - start)
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def make_optimizer_for(point: Point):
    return lambda params: torch.optim.SGD(params, lr=point.learning_rate, momentum=MOMENTUM)


def strategy_setup(point: Point, ctx: RankContext, dataset: BatchSource | None = None) -> StrategySetup:
    sample, _ = (dataset or open_point_data(point)).batch(0, 1)
    return StrategySetup(
        ctx=ctx,
        make_optimizer=make_optimizer_for(point),
        loss_fn=loss_for(DATASETS.get(point.dataset).task),
        sample=sample,
        global_batch_size=point.global_batch_size,
        micro_batches=point.micro_batches,
        split=point.split,
        options=point.resolved_strategy_options(),
    )


def train_point(
    point: Point, ctx: RankContext, *, keep_state: bool = False
) -> tuple[RankResult, dict[str, Tensor] | None]:
    """Run the point's warm-up and measured steps on this rank; return what it measured."""
    torch.set_num_threads(point.threads)
    model = build_model(point)
    dataset = open_point_data(point)
    trainer = build_trainer(point.strategy, model, strategy_setup(point, ctx, dataset))
    start, stop = trainer.local_batch_range(point.global_batch_size)
    batches = step_batches(point, start, stop, ctx.device, dataset)
    fault = planned_fault(point.point_id) if ctx.rank == ctx.world_size - 1 else None
    on_cuda = ctx.device.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)

    def synchronize() -> None:
        if on_cuda:
            torch.cuda.synchronize(ctx.device)

    # on the CPU the last warm-up step runs under a tensor-memory probe (it slows that step, which is
    # not timed); the CUDA allocator's own peak counters need no probe
    probe_step = point.warmup_steps - 1 if not on_cuda else -1
    probe: TensorPeak | None = None
    losses: list[float] = []
    step_times: list[float] = []
    dist.barrier()  # start the clock on all ranks together
    for step in range(point.warmup_steps + point.steps):
        if fault and step == point.warmup_steps:
            strike(fault, model)
        inputs, targets = batches[step % len(batches)]
        if step == probe_step:
            probe = TensorPeak(ctx.device.type, exclude=[t for batch in batches for t in batch])
            with probe:
                loss = trainer.step(inputs, targets)
            if loss is not None:
                losses.append(loss.item())
            continue
        synchronize()
        began = time.perf_counter()
        loss = trainer.step(inputs, targets)
        synchronize()
        elapsed = time.perf_counter() - began
        if loss is not None:
            losses.append(loss.item())
        if step >= point.warmup_steps:
            step_times.append(elapsed)
    log.info("rank %d: %d steps, last loss %s", ctx.rank, len(step_times), losses[-1] if losses else None)

    result = RankResult(
        rank=ctx.rank,
        hostname=socket.gethostname(),
        step_times_s=tuple(step_times),
        losses=tuple(losses),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # ru_maxrss is KiB
        tensor_peak_bytes=probe.peak_bytes if probe else None,
        tensor_resident_bytes=probe.resident_bytes if probe else None,
        cuda_peak_allocated_bytes=torch.cuda.max_memory_allocated(ctx.device) if on_cuda else None,
        cuda_peak_reserved_bytes=torch.cuda.max_memory_reserved(ctx.device) if on_cuda else None,
        device=ctx.device.type,
        device_name=torch.cuda.get_device_name(ctx.device) if on_cuda else "",
        backend=ctx.backend,
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        facts=trainer.facts(),
    )
    state = trainer.full_state_dict() if keep_state else None
    close = getattr(trainer, "close", None)
    if close is not None:
        close()  # a strategy's own runtime (Horovod's background thread) stops on every rank before teardown
    return result, state
