"""The per-rank training loop of one point: data, model, strategy, timed steps, memory."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES, resolve_builder
from ddlbench.point import Point
from ddlbench.records import RankResult
from ddlbench.train import recording
from ddlbench.train.clock import StepTimer, estimate_offset, host_group
from ddlbench.train.data import BatchSource, open_dataset
from ddlbench.train.data.loader import LOADER_MEMORY_NOTE, open_point_loader, reads_through_loader
from ddlbench.train.energy import open_energy_window, rank_provenance
from ddlbench.train.execution import Execution, configure_execution
from ddlbench.train.faults import delay_s, hold, planned_fault, stretch, strike
from ddlbench.train.host_probe import probe_all_at_once
from ddlbench.train.losses import loss_for
from ddlbench.train.memory import MemoryProbe, storage_bytes
from ddlbench.train.models.init import init_plan
from ddlbench.train.models.init import materialise as materialise_model
from ddlbench.train.recording import comms
from ddlbench.train.recording.recorder import CudaClock, HostClock, IterationRecorder
from ddlbench.train.strategies import RankContext, StrategySetup, build_trainer

log = logging.getLogger(__name__)

# Distinct batches materialised on the device before timing starts; steps cycle through them, so
# data generation never sits inside a timed step (like the synthetic benchmarks of Horovod/DDLBench).
# Real data is not pooled: every step reads its own samples through a loader (ddlbench.train.data.loader).
DATA_POOL_STEPS = 8
MOMENTUM = 0.9


def build_model(point: Point, *, materialise: bool = True) -> nn.Module:
    """The point's model with its initial weights drawn from the point's seed (identical on every rank).

    Built on the meta device (shapes only), then materialised on the default device (the CPU unless a
    `torch.device` context names another; a meta context keeps it shapes-only). Each module's weights
    are drawn from its own seed, (point seed, qualified name) (ddlbench.train.models.init), so the same
    numbers come out whatever builds them: this function for the single-process reference and most
    strategies, or a sharding strategy given `materialise=False` that shards the meta model first and
    then materialises only its own shards (`StrategySpec.materialises_shards`).
    """
    model_spec, dataset_spec = MODELS.get(point.model), DATASETS.get(point.dataset)
    if model_spec.input_kind != dataset_spec.input_kind:
        raise ValueError(
            f"model {point.model} takes {model_spec.input_kind} input; dataset {point.dataset} gives "
            f"{dataset_spec.input_kind}"
        )
    torch.manual_seed(point.seed)  # the builder's InitPlan takes its seed from here (finish_model)
    builder = resolve_builder(model_spec.builder)
    # the device a `torch.device` context (or set_default_device) names; get_default_device() ignores the
    # context in torch releases before 2.8
    device = torch.empty(0).device
    with torch.device("meta"):
        model = builder(
            sample_shape=dataset_spec.sample_shape,
            num_outputs=dataset_spec.num_outputs,
            **dict(point.model_options),
            **dict(model_spec.shape),
        )
    if init_plan(model).seed != point.seed:
        raise RuntimeError(f"{model_spec.builder} reseeded the global generator; its model would not be the point's")
    if not materialise or device.type == "meta":
        return model
    return materialise_model(model, device)


def open_point_data(point: Point) -> BatchSource:
    return open_dataset(DATASETS.get(point.dataset), seed=point.seed, path=point.data_path or None)


def step_batches(
    point: Point, start: int, stop: int, device: torch.device, dataset: BatchSource | None = None
) -> list[tuple[Tensor, Tensor]]:
    """This rank's samples [start, stop) of each of the pool's global batches: DATA_POOL_STEPS of them for
    synthetic data, every step's own for real data (what the loader reads; the reference trains on them)."""
    dataset = dataset or open_point_data(point)
    global_batch = point.global_batch_size
    steps = point.warmup_steps + point.steps
    pool = steps if reads_through_loader(point) else min(steps, DATA_POOL_STEPS)
    batches = []
    for step in range(pool):
        inputs, targets = dataset.batch(step * global_batch + start, stop - start)
        batches.append((inputs.to(device), targets.to(device)))
    return batches


def make_optimizer_for(point: Point):
    return lambda params: torch.optim.SGD(params, lr=point.learning_rate, momentum=MOMENTUM)


def strategy_setup(
    point: Point, ctx: RankContext, dataset: BatchSource | None = None, *, execution: Execution | None = None
) -> StrategySetup:
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
        execution=execution or Execution(),
    )


def start_recorder(device: torch.device) -> IterationRecorder:
    """The rank's recorder of phases and collectives (ddlbench.train.recording), installed process-wide.

    On CUDA the phases are stamped with events on the stream and collectives are not traced (NCCL's run
    on their own streams; host stamps around the calls would time their launch)."""
    on_cuda = device.type == "cuda"
    recorder = IterationRecorder(clock=CudaClock(device) if on_cuda else HostClock(), comms_traced=not on_cuda)
    if not on_cuda:
        comms.install()
    recording.install(recorder)
    return recorder


def traced_steps(point: Point) -> range:
    """The steps written as a timeline: the last max(1, trace_steps) measured ones (indices of all steps)."""
    last = point.warmup_steps + point.steps
    return range(max(point.warmup_steps, last - max(1, point.trace_steps)), last)


def stamped_steps(point: Point, on_cuda: bool) -> range:
    """The measured steps whose phases are stamped (the record's anatomy): every one on the CPU, the traced
    ones on CUDA. A stamp on CUDA is an event, and a step with the recorder's ten or so ran 0.3-1.1 ms
    longer than a bare one (resnet18, batch 32 and 128, bf16, one H200, benchmarks/gpu_probe.py, medians of
    3 rounds of 40 steps): more than the 2 % a benchmark harness may cost at a 5-10 ms step."""
    if on_cuda:
        return traced_steps(point)
    return range(point.warmup_steps, point.warmup_steps + point.steps)


def anatomy_note(on_cuda: bool, completions: dict[str, int], fault: str | None, stamped: int = 0) -> str:
    """How the rank's phases and collectives were stamped, for the record."""
    if on_cuda:
        note = (
            f"phases by CUDA events on the compute stream, in the last {stamped} measured step(s) only (the "
            "traced ones: stamps cost a fast GPU step time); collectives not traced on CUDA"
        )
    else:
        counts = ", ".join(f"{count} {how}" for how, count in completions.items() if count)
        note = (
            "phases and collectives by host perf_counter on the rank's thread; completion of collectives: "
            + (counts or "no collectives")
            + " (observed: the collective's future; waited: bounded by the end of the last wait on it)"
        )
    if fault and fault.startswith("slow:"):
        note += f"; injected straggler: this rank slept {fault.removeprefix('slow:')} s in every measured step"
    elif fault and fault.startswith("slower:"):
        note += (
            f"; injected slowdown: this rank held its core busy {fault.removeprefix('slower:')} × each measured "
            "step's own time at its end"
        )
    return note


def train_point(
    point: Point, ctx: RankContext, *, keep_state: bool = False
) -> tuple[RankResult, dict[str, Tensor] | None]:
    """Run the point's warm-up and measured steps on this rank; return what it measured.

    Warm-up steps are timed loosely (for the record only). The last of them, when there are two or
    more, runs under the memory probe (ddlbench.train.memory): the peak of live tensor bytes during that
    one step, counted from before the model is built, less the input pool. The measured steps form one
    window: every rank leaves warm-up at a barrier, times each step's start and end (host timer, or CUDA
    events with no synchronisation and no `.item()` inside the window), and maps them onto rank 0's
    clock (ddlbench.train.clock).

    Input: synthetic points cycle through batches made resident before timing; real-data points read
    each step's own batch through a DataLoader (ddlbench.train.data.loader), warm-up steps included, and
    the step timer includes that read, so throughput is end to end; the wait on input is timed apart,
    per step, as `input_wait_s`.
    """
    torch.set_num_threads(point.threads)
    # precision, layout, compile (ddlbench.train.execution); what the device cannot do is refused here
    execution = configure_execution(point.precision, point.channels_last, point.compile, ctx.device)
    on_cuda = ctx.device.type == "cuda"
    # the host's speed before anything of the point is built (its memory not yet counted) and after its steps
    probes = [probe_all_at_once(ctx.device, "start")]
    recorder = start_recorder(ctx.device)
    probe_step = point.warmup_steps - 1 if point.warmup_steps >= 2 else None
    memory = MemoryProbe(
        ctx.device,
        enabled=probe_step is not None,
        why_not="not probed: needs warmup_steps >= 2 (never the only warm-up step, never a timed one)",
    )
    memory.start()
    # a strategy that starts sharded takes the model on the meta device and materialises only its shards
    model = build_model(point, materialise=not STRATEGIES.get(point.strategy).materialises_shards)
    execution.prepare_model(model)  # channels_last, before the strategy wraps or cuts it
    dataset = open_point_data(point)
    trainer = build_trainer(point.strategy, model, strategy_setup(point, ctx, dataset, execution=execution))
    start, stop = trainer.local_batch_range(point.global_batch_size)
    # real data is read during the steps, through a loader (ddlbench.train.data.loader); synthetic data stays resident
    real = reads_through_loader(point)
    batches = [] if real else step_batches(point, start, stop, ctx.device, dataset)
    batches = [(execution.prepare_inputs(x), y) for x, y in batches]  # NHWC once, outside the timed steps
    pool_bytes = storage_bytes(t for batch in batches for t in batch)
    fault = planned_fault(point.point_id) if ctx.rank == ctx.world_size - 1 else None
    delay, stretched = delay_s(fault), stretch(fault)
    clock_group = host_group(ctx.backend)
    clock = estimate_offset(ctx.rank, ctx.world_size, clock_group)
    loader = (
        open_point_loader(point, start=start, stop=stop, device=ctx.device, source=dataset, group=clock_group)
        if real
        else None
    )

    def synchronize() -> None:
        if on_cuda:
            torch.cuda.synchronize(ctx.device)

    losses: list[Tensor | None] = []
    warmup_times: list[float] = []
    dist.barrier()
    for step in range(point.warmup_steps):
        began = time.perf_counter()
        inputs, targets = loader.next_batch() if loader else batches[step % len(batches)]
        with memory.probing() if step == probe_step else contextlib.nullcontext():
            losses.append(trainer.step(inputs, targets))
        synchronize()
        warmup_times.append(time.perf_counter() - began)
    figures = memory.finish(pool_bytes)

    timer = StepTimer(ctx.device)
    stamped = stamped_steps(point, on_cuda)
    # energy counters read before the window's barrier: outside the timed steps, and no rank's reads
    # (4 ms per NVML call on a virtualised H200) delay its first step against the others'
    energy = open_energy_window(ctx.device, ctx.local_rank)
    dist.barrier()  # the window opens on every rank together
    timer.open_window(point.steps)
    recorder.open_window()
    for step in range(point.warmup_steps, point.warmup_steps + point.steps):
        if fault and not (delay or stretched) and step == point.warmup_steps:
            strike(fault, model)
        began = time.perf_counter()
        if loader is None:
            inputs, targets = batches[step % len(batches)]
            timer.start()
            if step in stamped:
                recorder.begin_step(step)
        else:  # the step includes reading its input, as a training loop on real data does; the wait is timed apart
            timer.start()
            if step in stamped:
                recorder.begin_step(step)
            with recording.phase("data"):
                inputs, targets = loader.next_batch()
        if delay:
            time.sleep(delay)  # an injected straggler (DDLBENCH_INJECT_FAULT=slow:<seconds>)
        loss = trainer.step(inputs, targets)
        if stretched:  # an injected slowdown in proportion (DDLBENCH_INJECT_FAULT=slower:<fraction>)
            synchronize()
            hold(stretched * (time.perf_counter() - began))
        recorder.end_step()
        timer.end()
        losses.append(loss)
    starts, ends = timer.close_window()  # the window's one synchronisation
    energy_readings = energy.close()  # after the closing synchronisation
    recorder.close_window()
    recording.install(None)
    if loader:
        loader.close()  # workers stop; the rank's threads get its whole affinity back
    drift = estimate_offset(ctx.rank, ctx.world_size, clock_group).offset_s - clock.offset_s
    values = [loss.item() for loss in losses if loss is not None]
    log.info("rank %d: %d steps, last loss %s", ctx.rank, len(starts), values[-1] if values else None)

    inside = recorder.figures()
    cuda_peaks = memory.cuda_run_peaks() if on_cuda else (None, None)  # the whole run's, inputs included
    offset = clock.offset_s
    traced = traced_steps(point)
    probes.append(probe_all_at_once(ctx.device, "end"))
    result = RankResult(
        rank=ctx.rank,
        hostname=socket.gethostname(),
        step_times_s=tuple(end - begin for begin, end in zip(starts, ends, strict=True)),
        step_starts_s=tuple(begin + clock.offset_s for begin in starts),
        step_ends_s=tuple(end + clock.offset_s for end in ends),
        warmup_times_s=tuple(warmup_times),
        timer=timer.name,
        clock_offset_s=clock.offset_s,
        clock_uncertainty_s=clock.uncertainty_s,
        clock_drift_s=drift,
        losses=tuple(values),
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # ru_maxrss is KiB
        tensor_peak_bytes=figures.peak_bytes,
        tensor_resident_bytes=figures.resident_bytes,
        input_pool_bytes=figures.input_pool_bytes,
        memory_probe=figures.method + (LOADER_MEMORY_NOTE if loader and figures.peak_bytes is not None else ""),
        cuda_peak_allocated_bytes=cuda_peaks[0],
        cuda_peak_reserved_bytes=cuda_peaks[1],
        device=ctx.device.type,
        device_name=torch.cuda.get_device_name(ctx.device) if on_cuda else "",
        backend=ctx.backend,
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        facts=trainer.facts(),
        cpus=tuple(sorted(os.sched_getaffinity(0))),
        input_source=loader.source_kind if loader else "resident",
        loader_workers=loader.workers if loader else 0,
        input_wait_s=tuple(loader.waits_s[point.warmup_steps :]) if loader else (),
        loader_cpus=loader.cores.worker_cpus if loader else (),
        loader_binding=loader.cores.binding if loader else "",
        execution=execution.facts(model),
        anatomy=dict(inside.figures),
        anatomy_steps=() if len(stamped) == point.steps else tuple(step - point.warmup_steps for step in stamped),
        update_starts_s=tuple(None if t is None else t + offset for t in inside.update_starts),
        update_ends_s=tuple(None if t is None else t + offset for t in inside.update_ends),
        anatomy_note=anatomy_note(on_cuda, inside.completions, fault, len(stamped)),
        timeline=tuple(
            {**event, "start": event["start"] + offset, "end": event["end"] + offset, "step": step}
            for step in traced
            for event in recorder.events(step)
        ),
        energy=energy_readings,
        energy_note=energy.note,
        host_probe=tuple(probes),
        **rank_provenance(ctx.device),  # the software and the card, read after the window
    )
    state = trainer.full_state_dict() if keep_state else None
    close = getattr(trainer, "close", None)
    if close is not None:
        close()  # a strategy's own runtime (Horovod's background thread) stops on every rank before teardown
    return result, state
