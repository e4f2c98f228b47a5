"""The record of one point: versioned JSON, written atomically, read back into value objects."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.point import Point
from ddlbench.statistics import coefficient_of_variation, is_noisy, median_ci, percentile

Status = Literal["ok", "failed", "oom", "timeout"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "oom", "timeout")

# What the figures of a record mean. Bump it when a change alters what a figure measures (not when it
# only adds a field): reports and plans flag records of another version and leave them out of
# comparisons. 1: per-rank step clocks, dispatch-mode memory probe (ddlbench ≤ stop 7). 2: steps on one
# clock, window throughput, allocator-event memory peaks without the input pool, warm-up detection.
# 3: the CPU memory probe counts the blocks of every thread of the rank (c10's process-wide accounting):
# gloo's clones freed on its worker thread no longer stay live (zero2 read 3P for 2P, fsdp up to 2.1P
# for 1.5P) and Horovod's fusion buffer counts; fsdp, tensor and dp_tp start sharded on the meta device,
# so their peaks no longer include the whole model built at setup. 4: the CUDA tensor peak is over the
# probed step, as the CPU's was (it ran from the inputs' residence, first warm-up steps included), and
# counted from the probe's start; a broken CPU probe says "not probed: <why>" on an ok point.
MEASUREMENT_VERSION = 4


# The per-step figures a rank records inside its measured steps (RankResult.anatomy), in this order; each
# is defined where it is computed, ddlbench.train.recording.recorder
ANATOMY_FIGURES = (
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "update_s",
    "other_s",
    "comm_s",
    "comm_exposed_s",
    "comm_hidden_s",
    "exposed_forward_s",
    "exposed_backward_s",
    "exposed_update_s",
    "exposed_p2p_s",
    "busy_s",
    "comm_ops",
    "comm_bytes",
)


class RecordError(DdlbenchError):
    """A record file that cannot be read as a record of a known schema version."""


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Summary of a sample of one quantity (ddlbench.statistics): percentiles by linear interpolation
    between order statistics; a nonparametric 95 % confidence interval of the median (None for n ≤ 5);
    the coefficient of variation (sample stdev / mean; None for n < 2); `noisy` when the interval's
    half-width exceeds 5 % of the median or there is no interval."""

    n: int  # sample size
    mean: float  # arithmetic mean
    median: float  # 50th percentile
    p5: float  # 5th percentile
    p95: float  # 95th percentile
    min: float  # smallest value
    max: float  # largest value
    ci_low: float | None = None  # lower end of the median's 95 % CI; absent from records of measurement version 1
    ci_high: float | None = None  # upper end of the median's 95 % CI
    cv: float | None = None  # coefficient of variation: sample stdev / mean
    noisy: bool | None = None  # the CI's half-width exceeds 5 % of the median, or there is no CI

    @classmethod
    def of(cls, values: list[float] | tuple[float, ...]) -> Stats:
        if not values:
            raise ValueError("Stats of an empty sample")
        ordered = sorted(values)
        median = percentile(ordered, 50)
        ci = median_ci(ordered)
        return cls(
            n=len(ordered),
            mean=math.fsum(ordered) / len(ordered),
            median=median,
            p5=percentile(ordered, 5),
            p95=percentile(ordered, 95),
            min=ordered[0],
            max=ordered[-1],
            ci_low=ci[0] if ci else None,
            ci_high=ci[1] if ci else None,
            cv=coefficient_of_variation(ordered),
            noisy=is_noisy(median, ci),
        )


@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    """A GPU and its driver as NVML reports them (ddlbench.train.nvml), read by the rank that trains on it
    outside its measured steps; a fact NVML does not answer (NotSupported) is None, and without NVML
    every fact is None and `source` says why."""

    source: str  # "nvml", or "no NVML: <why>" (pynvml not installed, NVML failed to start)
    driver_version: str | None = None  # nvmlSystemGetDriverVersion: the NVIDIA driver, e.g. 580.159.04
    cuda_driver_version: int | None = None  # nvmlSystemGetCudaDriverVersion: the driver's CUDA, 13000 = 13.0
    name: str | None = None  # nvmlDeviceGetName
    uuid: str | None = None  # nvmlDeviceGetUUID: GPU-…, as nvidia-smi prints it
    pci_bus_id: str | None = None  # nvmlDeviceGetPciInfo().busId: 00000000:00:06.0
    sm_clock_app_mhz: int | None = None  # application clock of the SMs (MHz), what kernels run at by default
    sm_clock_max_mhz: int | None = None  # highest SM clock the board allows (MHz)
    mem_clock_app_mhz: int | None = None  # application clock of the memory (MHz)
    mem_clock_max_mhz: int | None = None  # highest memory clock (MHz)
    power_limit_w: float | None = None  # nvmlDeviceGetPowerManagementLimit ÷ 1000: the board's power cap (W)
    ecc_mode: int | None = None  # ECC: 1 on, 0 off (current)
    ecc_mode_pending: int | None = None  # ECC after the next reset
    mig_mode: int | None = None  # Multi-Instance GPU: 1 on, 0 off (current)
    mig_mode_pending: int | None = None  # MIG after the next reset
    persistence_mode: int | None = None  # 1: the driver stays loaded without clients
    vbios_version: str | None = None  # nvmlDeviceGetVbiosVersion


@dataclass(frozen=True, kw_only=True)
class EnergyReading:
    """The energy one hardware counter counted over a rank's measured window (ddlbench.train.energy reads
    it: once just before the first measured step, once just after the window's closing synchronisation)."""

    boundary: str  # what the counter covers: "gpu" (one GPU board) or "cpu-package" (one CPU socket, RAPL)
    device: str  # which one: the GPU's UUID, or the RAPL domain's name (package-0)
    method: str  # how: "nvml total energy counter" (mJ since driver load) or "rapl energy_uj" (µJ, wraps)
    energy_j: float  # counter at the close − at the open, wrap-around undone (J)
    window_s: float  # host time between the two reads (s)
    # ± bound from the counter's update period T at each end: energy_j × 2T ÷ window_s (J); T = 0.1 s for
    # NVML, 0.001 s for RAPL
    uncertainty_j: float
    too_short: bool  # window_s < 1 s: too short for the counter; the value is kept, left out of samples_per_j


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """What one rank measured; written by the rank, merged by the launcher."""

    rank: int  # global rank, 0 … world size − 1
    hostname: str  # the host the rank ran on
    step_times_s: tuple[float, ...]  # measured steps only: end − start of each on this rank (seconds)
    losses: tuple[float, ...]  # every step, warm-up included; empty on ranks that compute no loss
    peak_rss_bytes: int  # getrusage ru_maxrss of the rank's process (whole process, not just tensors)
    # Tensor memory, one definition on CPU and GPU (ddlbench.train.memory): the highest bytes of live
    # tensor storages during the probed step (a warm-up step, never a timed one nor the only warm-up
    # step), counting storages made since just before the model's construction, minus the input pool.
    # CPU: the allocator's events through torch.profiler; CUDA: the caching allocator's peak counter.
    tensor_peak_bytes: int | None = None
    tensor_resident_bytes: int | None = None  # the same, at the probed step's start (params, grads, state…)
    input_pool_bytes: int | None = None  # the resident input batches, reported apart from the peak
    memory_probe: str = ""  # how memory was measured, or why it was not
    cuda_peak_allocated_bytes: int | None = None  # torch.cuda.max_memory_allocated (inputs included)
    cuda_peak_reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved
    device: str = "cpu"  # torch device type the rank trained on: cpu or cuda
    device_name: str = ""  # the GPU's name on CUDA; "" on the CPU
    backend: str = ""  # torch.distributed backend: gloo or nccl
    torch_version: str = ""  # torch.__version__ in the rank
    threads: int = 1  # intra-op threads the rank ran with (torch.get_num_threads)
    # the strategy's facts about this rank's share (mesh, stages, micro-batches, shard sizes…)
    facts: dict[str, Any] = field(default_factory=dict)
    # Steps on one clock: start and end of every measured step in seconds on the job's common time
    # base (rank 0's clock; this rank's timer + clock_offset_s), so step i of the job spans the
    # earliest start to the latest end over ranks.
    step_starts_s: tuple[float, ...] = ()
    step_ends_s: tuple[float, ...] = ()  # end of every measured step, on the same common clock
    warmup_times_s: tuple[float, ...] = ()  # each warm-up step's duration on this rank (not measured figures)
    timer: str = ""  # perf_counter (host) or cuda_events (device, synchronised once after the window)
    clock_offset_s: float = 0.0  # rank 0's clock minus this rank's, estimated before the first step
    clock_uncertainty_s: float = 0.0  # bound on the offset's error: half the best ping-pong round trip
    clock_drift_s: float = 0.0  # the offset re-estimated after the last step, minus the first estimate
    cpus: tuple[int, ...] = ()  # the CPUs the rank's process could run on (its affinity) while training
    cpu_binding: str = ""  # who set that affinity: ddlbench (local pinning), slurm (its --cpu-bind), or none
    slurm_node: str = ""  # SLURMD_NODENAME: the SLURM node the rank ran on ("" outside SLURM)
    # The rank's GPU (ddlbench.launch.devices): `visible` (CUDA_VISIBLE_DEVICES as the rank saw it,
    # None when unset), `bind` (the srun step's --gpu-bind, where it bound one GPU to each task), and on
    # CUDA `index` (torch's), `name`, `uuid`, `pci_bus_id`, `numa_node` (the kernel's; None where it says
    # -1: no NUMA information), `local_cpus` (the CPUs local to the GPU), `cpu_alignment` (whether the
    # rank's CPUs were moved onto them) and `shared_with` (the local ranks on the same GPU: share_gpus)
    gpu: dict[str, Any] = field(default_factory=dict)
    # NCCL, gloo and fabric variables (ddlbench.launch.placement.NETWORK_ENV_NAMES) as the rank saw them:
    # the site's network_env, or the user's own environment; only those names
    network_env: dict[str, str] = field(default_factory=dict)
    # the host allocator's settings (ddlbench.provenance.ALLOCATOR_ENV_NAMES) as the rank saw them; {}:
    # glibc's defaults (and in records from before they were kept: unknown)
    allocator_env: dict[str, str] = field(default_factory=dict)
    # Input (ddlbench.train.data.loader): "resident" batches made before timing (synthetic data, and real
    # data in records before the loader), or "loader": real data read during the steps, inside the step
    # timer. input_wait_s, per measured step: host time blocked on the loader's next batch plus enqueueing
    # its copy to the device (seconds; on CUDA an upper bound of the stall, as the device may still be busy)
    input_source: Literal["resident", "loader"] = "resident"
    loader_workers: int = 0  # the loader's worker processes (0: read in the rank)
    input_wait_s: tuple[float, ...] = ()  # per measured step, the wait on input defined above (s)
    loader_cpus: tuple[int, ...] = ()  # the CPUs the workers were pinned to, one each; () when not split
    loader_binding: str = ""  # how the rank's CPUs were split between its threads and its workers, or why not
    # What really ran (ddlbench.train.execution, read back from torch): precision, autocast dtype, TF32
    # switches on CUDA, the first conv weight's memory format, what was compiled, the fp16 grad scaler's
    # final scale and skipped steps. Empty in records from before execution options.
    execution: dict[str, Any] = field(default_factory=dict)
    # Inside each measured step (ddlbench.train.recording.recorder, where every figure is defined): per
    # figure name (step_s, data_s, forward_s, backward_s, update_s, other_s, comm_s, comm_exposed_s,
    # comm_hidden_s, exposed_<phase>_s, exposed_p2p_s, busy_s in seconds; comm_ops; comm_bytes), one
    # value per measured step. Empty in records from before it.
    anatomy: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # the measured steps (0 = the first) that anatomy and update_*_s cover, in order; () = every measured
    # step. On CUDA only the traced steps are stamped (ddlbench.train.kernel.stamped_steps).
    anatomy_steps: tuple[int, ...] = ()
    # each measured step's first optimizer-step start and last end, on the common clock (None: no update)
    update_starts_s: tuple[float | None, ...] = ()
    update_ends_s: tuple[float | None, ...] = ()  # … and the last optimizer-step end
    anatomy_note: str = ""  # what was stamped and how collectives' completion was known
    # the last max(1, trace_steps) measured steps as timeline events on the common clock: dicts of cat
    # (step, phase, comm, wait), name, start, end (s), args
    timeline: tuple[dict[str, Any], ...] = ()
    # The software and the card (ddlbench.train.energy.rank_provenance), None off CUDA and in records from
    # before them: torch's CUDA runtime, cuDNN and NCCL, and the rank's GPU as NVML reports it
    cuda_runtime_version: str | None = None  # torch.version.cuda: 13.0
    cudnn_version: int | None = None  # torch.backends.cudnn.version(): 91900
    nccl_version: str | None = None  # torch.cuda.nccl.version(), dotted: 2.28.9
    gpu_facts: GpuFacts | None = None  # the rank's GPU and driver (NVML); on the CPU, the driver alone or why not
    # Energy over the measured window: the rank's GPU (NVML), and its host's CPU packages (RAPL, read by
    # local rank 0 only, so no host is counted twice); empty where neither can be read
    energy: tuple[EnergyReading, ...] = ()
    energy_note: str = ""  # what was not read and why: "no NVML: …", "no GPU: …", "no RAPL: …"
    # the silent-data-corruption replay after the window (Point.replay_steps; ddlbench.train.replay, where
    # every field is defined): per-step losses and gradient checksums, the weights' checksum, `digest` over
    # them all, `repeatable` across its passes. None without a replay
    replay: dict[str, Any] | None = None
    # the rank's GPU over its point, read through NVML (ddlbench.train.health.GpuHealth.to_dict: readings,
    # findings), or {"why_not": "not measurable here: …"}; None in records from before it
    health: dict[str, Any] | None = None
    # the host's speed at the point's start and end (ddlbench.train.host_probe, where each figure is defined):
    # {compute_s, copy_s, all_reduce_s, threads, when, turn, time}; () in records from before it
    host_probe: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        data = dict(data)
        if data.get("gpu_facts") is not None:
            data["gpu_facts"] = GpuFacts(**data["gpu_facts"])
        data["energy"] = tuple(EnergyReading(**reading) for reading in data.get("energy", ()))
        tuples = ("step_times_s", "losses", "step_starts_s", "step_ends_s", "warmup_times_s", "cpus")
        more = ("input_wait_s", "loader_cpus", "update_starts_s", "update_ends_s", "timeline", "anatomy_steps")
        more += ("host_probe",)
        for name in (*tuples, *more):
            if name in data:
                data[name] = tuple(data[name])
        if "anatomy" in data:
            data["anatomy"] = {name: tuple(values) for name, values in data["anatomy"].items()}
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class RankFailure:
    """An exception that ended a rank, as the rank wrote it down before leaving."""

    rank: int  # the rank that failed
    hostname: str  # its host
    error_type: str  # the exception's class name
    message: str  # first line of the exception's text
    traceback: str  # the formatted traceback
    out_of_memory: bool  # the exception was an out-of-memory error (the point's status is then oom)
    time: float  # seconds since the epoch; the earliest failure is the likeliest cause


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """The rank the others wait for, over a point's kept steps (defined in ddlbench.analysis.inside.figures)."""

    rank: int  # the rank with the most busy time
    hostname: str  # its host
    slowest_steps: int  # kept steps in which this rank was the slowest
    steps: int  # kept steps
    skew_s: Stats  # per step: max − min over ranks of busy time (s)
    wait_s: Stats  # per step: mean over the other ranks of the busy time they lack on the slowest (s)
    wait_share: Stats  # per step: wait_s ÷ the job's step time

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Straggler:
        stats = ("skew_s", "wait_s", "wait_share")
        return cls(**{**data, **{name: Stats(**data[name]) for name in stats}})


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """Figures of a point that ran to the end; every throughput is global (the whole job)."""

    step_time_s: Stats  # per kept measured step: latest end − earliest start over ranks (seconds)
    samples_per_s: Stats  # per kept measured step: global_batch_size / step_time_s
    samples_per_s_overall: float  # samples of the kept window / the window's wall time (samples/s)
    global_batch_size: int  # samples per optimizer step of the whole job (Point.global_batch_size)
    peak_rss_bytes: int  # max over ranks of the process's peak resident set (CPU memory, coarse)
    cuda_peak_allocated_bytes: int | None  # max over ranks; None without CUDA
    cuda_peak_reserved_bytes: int | None  # max over ranks of torch.cuda.max_memory_reserved; None without CUDA
    loss_first: float  # mean over loss-computing ranks, first step (warm-up included)
    loss_last: float  # same, last measured step
    tensor_peak_bytes: int | None = None  # max over ranks of RankResult.tensor_peak_bytes
    tensor_resident_bytes: int | None = None  # max over ranks
    input_pool_bytes: int | None = None  # max over ranks
    window_s: float | None = None  # wall time of the kept window, first kept start to last kept end
    step_times_job_s: tuple[float, ...] = ()  # every measured step of the job, dropped ones included
    warmup_dropped_steps: int = 0  # leading measured steps judged still warming up, left out of figures
    clock_uncertainty_s: float | None = None  # max over ranks of the clock offset's error bound
    oversubscribed: bool = False  # some host ran more threads than the CPUs its ranks could use
    cores_note: str = ""  # ranks × threads against CPUs, per host, as measured; other points beside it
    # seconds of the launch during which other ddlbench points ran on this host (local launches: disjoint
    # cores, but shared memory bandwidth and caches; ddlbench.launch.cores.host_ledger); None: not known
    # (SLURM, mpirun, records from before it)
    shared_host_s: float | None = None
    # the host's speed while the point ran (ddlbench.analysis.machine.host_speed.point_probe): the medians over
    # ranks and the start and end probes of compute_s, copy_s and all_reduce_s, with `at_once` (the most ranks
    # that shared a host) and `n` (probes pooled); None in records from before the probe
    host_probe: dict[str, Any] | None = None
    # Points that read through a loader (None otherwise), per kept measured step: the longest input wait
    # of any rank (s), and that wait ÷ the job's step time (dimensionless, the share of the step stalled
    # on input)
    input_wait_s: Stats | None = None
    input_wait_share: Stats | None = None  # input_wait_s ÷ the job's step time (dimensionless)
    # Inside the steps (ddlbench.analysis.inside.figures), per kept step: each phase figure's mean over ranks (s),
    # the share of communication hidden under computation, the gap between weight updates (s), and the
    # straggler. None in records from before the recorder.
    phases_s: dict[str, Stats] | None = None  # per phase figure (RankResult.anatomy's), its mean over ranks (s)
    comm_overlap: Stats | None = None  # Σ hidden ÷ Σ communication over ranks (dimensionless)
    update_gap_s: Stats | None = None  # one weight update's end to the next one's start (s)
    straggler: Straggler | None = None  # the rank the others wait for
    # Energy over the measured window (ddlbench.analysis.energy, where each is defined), every GPU and every
    # RAPL package counted once however many ranks share it; None where not read
    energy_j: float | None = None  # Σ over distinct GPUs (host, UUID) of their NVML energy (J)
    energy_uncertainty_j: float | None = None  # Σ of those readings' uncertainties (J)
    energy_gpus: int = 0  # distinct GPUs in energy_j (n)
    cpu_package_energy_j: float | None = None  # Σ over distinct (host, RAPL package domain) (J)
    cpu_package_uncertainty_j: float | None = None  # Σ of those readings' uncertainties (J)
    energy_window_s: float | None = None  # the longest window of the readings summed (s)
    samples_per_j: float | None = None  # global samples of the measured window ÷ energy_j (samples/J)
    samples_per_j_uncertainty: float | None = None  # samples_per_j × energy_uncertainty_j ÷ energy_j (samples/J)
    energy_too_short: bool = False  # a GPU's window was under 1 s: energy_j kept, samples_per_j None
    energy_note: str = ""  # how energy was read, or "not measurable here: no NVML, no RAPL"


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """The SLURM job a point ran in, as the controller described it."""

    job_id: str  # SLURM_JOB_ID
    array_job_id: str | None  # the array's job id, for a job of an array
    array_task_id: str | None  # the task's index in that array
    partition: str | None  # the partition the job ran in
    node_list: str | None  # the job's nodes, in SLURM's compressed form (n[1-4])
    num_nodes: int | None  # nodes of the allocation
    num_cpus: int | None  # CPUs of the whole allocation
    num_gpus: int  # GPUs of the whole allocation
    restarts: int  # times SLURM requeued the job before this run
    exclusive: bool | None = None  # the job held its nodes alone (OverSubscribe=NO); None: not known
    # a packed sweep's point is one job step on some of the allocation's nodes (ddlbench.launch.allocation)
    step_id: str | None = None  # "<job>.<step>", as srun names it
    step_nodes: str | None = None  # the step's nodes, comma-separated


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where, when and with what a point ran."""

    ddlbench_version: str  # ddlbench.__version__
    git_commit: str | None  # commit of the checkout ddlbench ran from; None outside a git checkout
    git_dirty: bool | None  # the checkout had uncommitted changes
    python_version: str  # of the launcher
    torch_version: str | None  # of the ranks (rank 0's)
    backend: str | None  # torch.distributed backend of the ranks: gloo or nccl
    launcher: str  # how the ranks were started: local, srun or mpirun
    hostnames: tuple[str, ...]  # distinct hosts of the ranks, in rank order
    cpu_model: str  # the CPU's model name, on the launcher's host
    gpu_model: str | None  # the ranks' GPU names, comma-separated; None without GPUs
    slurm_job_id: str | None  # the SLURM job the point ran in; None outside SLURM
    slurm: SlurmJob | None = None  # absent from version-1 records
    config_hash: str | None  # sha256 of the point's canonical spec (every setting that shaped the run)
    start_time: str  # ISO 8601, UTC
    end_time: str  # ISO 8601, UTC
    # The software and the cards (ddlbench.provenance.collect_provenance, from the ranks): each version's
    # distinct values over ranks, comma-separated; None off CUDA and in records from before them
    driver_version: str | None = None  # the NVIDIA driver (NVML)
    cuda_runtime_version: str | None = None  # torch's CUDA runtime
    cudnn_version: str | None = None  # cuDNN, as torch.backends.cudnn.version() numbers it (91900)
    nccl_version: str | None = None  # NCCL, dotted
    gpus: tuple[GpuFacts, ...] = ()  # every distinct GPU of the ranks (by host and UUID), as NVML reports it
    nvml: str | None = None  # "nvml" where some rank read NVML, else rank 0's "no NVML: <why>"
    # the ranks' host allocator (ddlbench.provenance.allocator_summary), distinct values joined by "; ";
    # None in records from before it was kept
    allocator: str | None = None


@dataclass(frozen=True, kw_only=True)
class PointRecord:
    """The outcome of one point; written for every status, so failures are data too."""

    # 2: provenance.slurm; 3: rank facts and tensor memory peaks; 4: steps on one clock, CI statistics,
    # allocator-event memory, CPU affinity, measurement_version
    SCHEMA_VERSION: ClassVar[int] = 4
    READABLE_VERSIONS: ClassVar[tuple[int, ...]] = (1, 2, 3, 4)
    point_id: str  # the point's stable id: its axes, its repetition and a hash of its settings
    point: Point  # every setting of the run
    status: Status  # ok, failed, oom (out of memory) or timeout
    reason: str | None  # why a point is not ok (the exception, the memory limit, the time limit); None when ok
    metrics: Metrics | None  # the point's figures; None unless ok
    provenance: Provenance  # where, when and with what it ran
    ranks: tuple[RankResult, ...] = field(default_factory=tuple)  # what each rank measured, in rank order
    failures: tuple[RankFailure, ...] = field(default_factory=tuple)  # the exceptions that ended ranks
    # what its figures mean (MEASUREMENT_VERSION when written); records before schema 4 read as 1
    measurement_version: int = MEASUREMENT_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["point"] = self.point.to_dict()
        return {"schema_version": self.SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointRecord:
        version = data.get("schema_version")
        if version not in cls.READABLE_VERSIONS:
            readable = ", ".join(str(v) for v in cls.READABLE_VERSIONS)
            raise RecordError(f"record schema version {version!r} is not supported (this ddlbench reads {readable})")
        metrics = data["metrics"]
        if metrics is not None:
            metrics = Metrics(
                **{
                    **metrics,
                    "step_time_s": Stats(**metrics["step_time_s"]),
                    "samples_per_s": Stats(**metrics["samples_per_s"]),
                    "step_times_job_s": tuple(metrics.get("step_times_job_s", ())),
                    **{
                        name: Stats(**metrics[name])
                        for name in ("input_wait_s", "input_wait_share", "comm_overlap", "update_gap_s")
                        if metrics.get(name) is not None
                    },
                    **(
                        {"phases_s": {name: Stats(**value) for name, value in metrics["phases_s"].items()}}
                        if metrics.get("phases_s") is not None
                        else {}
                    ),
                    **(
                        {"straggler": Straggler.from_dict(metrics["straggler"])}
                        if metrics.get("straggler") is not None
                        else {}
                    ),
                }
            )
        provenance = dict(data["provenance"])
        provenance["hostnames"] = tuple(provenance["hostnames"])
        if provenance.get("slurm") is not None:
            provenance["slurm"] = SlurmJob(**provenance["slurm"])
        provenance["gpus"] = tuple(GpuFacts(**gpu) for gpu in provenance.get("gpus", ()))
        return cls(
            point_id=data["point_id"],
            point=Point.from_dict(data["point"]),
            status=data["status"],
            reason=data["reason"],
            metrics=metrics,
            provenance=Provenance(**provenance),
            ranks=tuple(RankResult.from_dict(rank) for rank in data.get("ranks", ())),
            failures=tuple(RankFailure(**failure) for failure in data.get("failures", ())),
            measurement_version=data.get("measurement_version", 1),
        )


POINTS_DIR, RECORD_FILE = "points", "record.json"  # a record's place: <sweep>/points/<point id>/record.json


def record_path(sweep_dir: Path, point_id: str) -> Path:
    """Where the record of a point lives: the one place that spells the layout of a sweep's folder."""
    return sweep_dir / POINTS_DIR / point_id / RECORD_FILE


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_record(path: Path, record: PointRecord) -> None:
    write_json_atomic(path, record.to_dict())


def read_record(path: Path) -> PointRecord:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"cannot read record {path}: {exc}") from None
    try:
        return PointRecord.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise RecordError(f"record {path} is malformed: {exc}") from None
