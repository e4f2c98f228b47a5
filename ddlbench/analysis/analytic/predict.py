"""Predictions of points: step time split into its parts, throughput, memory per rank, largest batch.

    step_time_s = compute_s + comm_exposed_s + bubble_s     (means over ranks; ddlbench.analysis.analytic.simulate)
    samples_per_s = global_batch_size / step_time_s          (samples/s, the whole job)
    peak_memory_bytes = the busiest rank's peak tensor memory (ddlbench.analysis.analytic.memory)

The model table of each (model, dataset, options) is read once per process from the tables shipped with
the package or kept in the sweep's folder by a compute node, and built with torch only where neither has it
(ddlbench.analysis.analytic.table_cache): the login node predicts without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ddlbench.analysis.analytic.compute import block_times
from ddlbench.analysis.analytic.data_parallel import StrategyRun, model_ddp, model_fsdp, model_zero2
from ddlbench.analysis.analytic.layer_splits import model_filter_channel_layers, model_spatial_layers
from ddlbench.analysis.analytic.layout import Context, Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.memory import RankMemory, with_cuda_terms
from ddlbench.analysis.analytic.pipelines import model_pipeline
from ddlbench.analysis.analytic.splits import model_tensor
from ddlbench.analysis.analytic.table_cache import find_table
from ddlbench.catalog import MODELS
from ddlbench.catalog.model_table import ModelTable
from ddlbench.errors import DdlbenchError

PREDICTION_VERSION = 1
CSV_COLUMNS = (
    "point_id", "model", "dataset", "strategy", "nodes", "ranks_per_node", "split", "micro_batches", "batch_size",
    "global_batch_size", "precision", "step_time_s", "samples_per_s", "compute_s", "comm_s", "comm_exposed_s",
    "comm_hidden_s", "bubble_s", "peak_memory_bytes", "resident_memory_bytes", "params_bytes", "grads_bytes",
    "optimizer_bytes", "buffers_bytes", "activations_bytes", "memory_per_rank_bytes", "fits", "max_batch_size",
    "bottleneck", "compute_source",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One setting's predicted step (seconds), throughput and memory (bytes)."""

    point_id: str
    model: str
    dataset: str
    strategy: str
    nodes: int
    ranks_per_node: int
    split: int
    micro_batches: int
    batch_size: int
    global_batch_size: int
    precision: str
    step_time_s: float
    samples_per_s: float
    compute_s: float
    comm_s: float
    comm_exposed_s: float
    comm_hidden_s: float
    bubble_s: float
    peak_memory_bytes: int
    resident_memory_bytes: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int
    activations_bytes: int
    memory_per_rank_bytes: int | None  # what one rank may use (the device's memory, a CPU host's / ranks)
    fits: bool | None
    max_batch_size: int | None  # the largest batch_size (per replica) whose peak fits; None: not known
    bottleneck: str  # compute | communication | bubble | memory
    compute_source: str  # layer_timings | operators | rates (…)
    comm: str  # what the step communicates, in words
    memory_detail: str
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TableSource = Callable[[str, str, tuple[tuple[str, str], ...]], ModelTable]


def introspected_table(model: str, dataset: str, options: tuple[tuple[str, str], ...]) -> ModelTable:
    """The model table as shipped with the package, else built with torch (table_cache.find_table)."""
    return find_table(model, dataset, options)


def sweep_tables(sweep_dir: Path | None) -> TableSource:
    """The model tables a sweep's predictions read: shipped, else kept in the sweep's folder by its points,
    else built with torch (table_cache.find_table)."""
    return functools.partial(find_table, sweep_dir=sweep_dir)


def resolved_options(setting: Setting) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((MODELS.get(setting.model).default_options() | dict(setting.model_options)).items()))


def ranks_sharing(setting: Setting, machine: MachineModel) -> int:
    """Ranks computing at once on one node. A machine calibrated on one host ran every "node" of a local
    sweep there, so all of a point's ranks share it; otherwise a node holds ranks_per_node of them."""
    if machine.hosts == 1 and machine.source == "measured":
        return setting.world_size
    return setting.ranks_per_node


def run_strategy(ctx: Context) -> StrategyRun:
    """The strategy's model of one step (ddlbench.analysis.analytic.{data_parallel,pipelines,splits})."""
    s = ctx.setting

    sharing = ctx.sharing

    def times_for(scale=None):
        return block_times(
            ctx.table,
            ctx.machine,
            batch=s.batch_size,
            precision=s.precision,
            threads=s.threads,
            scale=scale,
            sharing=sharing,
        )

    name = s.strategy
    if name in ("ddp", "horovod", "zero2", "fsdp"):
        times = times_for()
        if name == "zero2":
            return model_zero2(ctx, times)
        if name == "fsdp":
            return model_fsdp(ctx, times)
        return model_ddp(ctx, times, horovod=name == "horovod")
    if name in ("gpipe", "1f1b", "dp_pp", "interleaved_1f1b", "model_parallel"):
        micro = 1 if name == "model_parallel" else s.micro_batches
        times = block_times(
            ctx.table,
            ctx.machine,
            batch=s.batch_size / micro,
            precision=s.precision,
            threads=s.threads,
            sharing=sharing,
        )
        # each stage alone on its host's cores, as where the other stages wait (dp_pp's other replicas compute
        # beside it: it keeps the shared prices)
        alone = None
        if sharing > 1 and s.replicas == 1:
            alone = block_times(
                ctx.table, ctx.machine, batch=s.batch_size / micro, precision=s.precision, threads=s.threads, sharing=1
            )
        if name == "interleaved_1f1b":
            return model_pipeline(ctx, times, schedule="interleaved", stages_per_rank=2, alone=alone)
        if name == "model_parallel":
            return model_pipeline(ctx, times, schedule="model_parallel", micro=1, alone=alone)
        schedule = s.option("schedule") if name == "dp_pp" else name
        return model_pipeline(ctx, times, schedule=schedule, alone=alone)
    if name in ("tensor", "dp_tp"):
        return model_tensor(ctx, times_for)
    if name in ("filter", "channel", "dp_filter"):
        return model_filter_channel_layers(ctx, kind="channel" if name == "channel" else "filter")
    if name in ("spatial", "dp_spatial"):
        return model_spatial_layers(ctx)
    raise DdlbenchError(f"the analytical model has no strategy {name!r}")


def device_memory(memory: RankMemory, setting: Setting, table: ModelTable, machine: MachineModel) -> RankMemory:
    """The rank's memory as its device counts it: on a CUDA machine whose file has `cuda_memory` terms,
    with the caching allocator's workspaces and rounding (ddlbench.analysis.analytic.memory.with_cuda_terms,
    at the rank's micro-batch); otherwise (every CPU machine) exactly the strategy model's."""
    if machine.device_kind != "cuda" or machine.cuda_memory is None:
        return memory
    micro = setting.batch_size / max(1, setting.micro_batches)
    return with_cuda_terms(memory, table=table, batch=micro, terms=machine.cuda_memory)


def memory_per_rank(machine: MachineModel, setting: Setting, memory_per_device: int | None) -> int | None:
    if memory_per_device:
        return memory_per_device
    if not machine.memory_bytes:
        return None
    if machine.device_kind == "cpu":  # the host's memory, shared by its ranks
        return machine.memory_bytes // max(1, setting.ranks_per_node)
    return machine.memory_bytes


def predict(
    setting: Setting,
    machine: MachineModel,
    *,
    tables: TableSource = introspected_table,
    memory_per_device: int | None = None,
    search_batch: bool = True,
) -> Prediction:
    """The prediction of one setting on one machine."""
    table = tables(setting.model, setting.dataset, resolved_options(setting))
    ctx = Context(setting=setting, table=table, machine=machine, sharing=ranks_sharing(setting, machine))
    run = run_strategy(ctx)
    memory = device_memory(run.memory, setting, table, machine)
    timeline = run.timeline
    step = timeline.step_s
    compute = timeline.mean("compute_s")
    exposed = timeline.mean("exposed_comm_s")
    bubble = timeline.mean("bubble_s")
    comm = timeline.mean("comm_s")
    limit = memory_per_rank(machine, setting, memory_per_device)
    fits = None if limit is None else memory.peak_bytes <= limit
    if fits is False:
        bottleneck = "memory"
    else:
        bottleneck = max((("compute", compute), ("communication", exposed), ("bubble", bubble)), key=lambda kv: kv[1])[
            0
        ]
    # which compute figures the strategy's blocks were costed from (the same lookup, at the point's batch)
    times = block_times(
        table,
        machine,
        batch=setting.batch_size,
        precision=setting.precision,
        threads=setting.threads,
        sharing=ctx.sharing,
    )
    max_batch = None
    if search_batch and limit is not None:
        max_batch = largest_batch(setting, machine, table, limit)
    return Prediction(
        point_id=setting.point_id,
        model=setting.model,
        dataset=setting.dataset,
        strategy=setting.strategy,
        nodes=setting.nodes,
        ranks_per_node=setting.ranks_per_node,
        split=setting.split,
        micro_batches=setting.micro_batches,
        batch_size=setting.batch_size,
        global_batch_size=setting.global_batch_size,
        precision=setting.precision,
        step_time_s=step,
        samples_per_s=setting.global_batch_size / step if step > 0 else 0.0,
        compute_s=compute,
        comm_s=comm,
        comm_exposed_s=exposed,
        comm_hidden_s=max(0.0, comm - exposed),
        bubble_s=bubble,
        peak_memory_bytes=memory.peak_bytes,
        resident_memory_bytes=memory.resident_bytes,
        params_bytes=memory.params_bytes,
        grads_bytes=memory.grads_bytes,
        optimizer_bytes=memory.optimizer_bytes,
        buffers_bytes=memory.buffers_bytes,
        activations_bytes=memory.activations_bytes,
        memory_per_rank_bytes=limit,
        fits=fits,
        max_batch_size=max_batch,
        bottleneck=bottleneck,
        compute_source=times.source,
        comm=run.comm,
        memory_detail=memory.detail,
        notes=tuple(dict.fromkeys([*times.notes, *ctx.notes, *allocator_notes(setting, machine)])),
    )


def allocator_notes(setting: Setting, machine: MachineModel) -> list[str]:
    """A CPU point predicted from a calibration of another host allocator policy (the sweep's and the suite's
    `host_allocator`), said: the operators' times, the first touches of memory and the collectives' waits were
    all measured under the calibration's (glibc's defaults made vgg11's step on 3×512² 1.3 times as long)."""
    calibrated = machine.host_allocator or "system"  # a calibration from before the key had the environment's
    if machine.device_kind != "cpu" or calibrated == setting.host_allocator:
        return []
    return [
        f"host allocator: the point runs {setting.host_allocator}, the machine file was calibrated with "
        f"{calibrated}; its compute and first touches are those of the calibration's"
    ]


def _peak(setting: Setting, machine: MachineModel, table: ModelTable, batch: int) -> int:
    ctx = Context(
        setting=replace(setting, batch_size=batch),
        table=table,
        machine=machine,
        sharing=ranks_sharing(setting, machine),
    )
    return device_memory(run_strategy(ctx).memory, ctx.setting, table, machine).peak_bytes


def largest_batch(
    setting: Setting, machine: MachineModel, table: ModelTable, limit: int, *, ceiling: int = 1 << 22
) -> int:
    """The largest batch_size (a multiple of micro_batches) whose predicted peak fits `limit` bytes; 0: none."""
    step = max(1, setting.micro_batches)
    if _peak(setting, machine, table, step) > limit:
        return 0
    low, high = 1, 2
    while high * step <= ceiling and _peak(setting, machine, table, high * step) <= limit:
        low, high = high, high * 2
    if high * step > ceiling:
        return low * step
    while high - low > 1:
        middle = (low + high) // 2
        if _peak(setting, machine, table, middle * step) <= limit:
            low = middle
        else:
            high = middle
    return low * step


def predict_all(settings: Iterable[Setting], machine: MachineModel, **kwargs: Any) -> list[Prediction]:
    return [predict(setting, machine, **kwargs) for setting in settings]
