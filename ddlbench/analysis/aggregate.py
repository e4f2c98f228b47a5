"""All records of a sweep (failed ones included) → one table, saved as Parquet and CSV.

One row per planned point. Its columns, by group:

- the point: one column per `Point` field, named after it (options as canonical JSON), derived from the
  dataclass (ddlbench.analysis.keys), plus point_id, world_size, replicas and global_batch_size;
- keys: config_key, series_key, strong_series_key, baseline_key, baseline_replica_key: which
  configuration, which line over nodes at a fixed per-replica batch and which at a fixed global batch, and
  which configurations it is compared with like for like (the same global batch) or, failing a ddp there,
  at the same per-replica batch (ddlbench.analysis.keys says how each is derived);
- outcome: status, reason, measurement_version and other_measurement_version (figures of another version
  mean something else: they are left out of every comparison unless asked for);
- step figures, per point over its kept measured steps (records.Stats): samples_per_s_<s> and
  step_time_s_<s> for every Stats field s: n, mean, median, p5, p95, min, max, ci_low, ci_high (95 % CI
  of the median, empty for n ≤ 5), cv, noisy;
- input: for points that read real data through a loader, input_wait_s_<s> and input_wait_share_<s> the
  same way (records.Metrics: the longest wait of any rank per kept step, and its share of the step
  time), and input_source (loader, or resident: batches made before timing);
- inside the steps (ddlbench.analysis.inside.figures): phase_<figure>_{median,ci_low,ci_high} per phase figure
  (seconds, mean over ranks per step), comm_overlap_<s>, update_gap_s_<s>, straggler_wait_s_<s>,
  straggler_wait_share_<s>, straggler_skew_s_<s>, straggler_rank, straggler_host,
  straggler_slowest_steps, straggler_steps; trace_file (the point's Chrome/Perfetto trace, relative to
  the sweep's folder, when traced);
- window, memory and losses: samples_per_s_overall (samples of the kept window ÷ its wall time, Hoefler
  & Belli's rule 3), window_s, warmup_dropped_steps, clock_uncertainty_s, oversubscribed, cores_note,
  shared_host_s (seconds of a local launch with other points running on its host); the host's speed probe
  (ddlbench.analysis.machine.host_speed, records.Metrics.host_probe): host_compute_s, host_copy_s and
  host_all_reduce_s (seconds, medians over ranks and the start and end probes), host_at_once (ranks probing
  at once on a host), host_threads;
  memory (peak_rss_bytes, tensor_peak_bytes, tensor_resident_bytes, input_pool_bytes,
  cuda_peak_allocated_bytes, cuda_peak_reserved_bytes) and losses (loss_first, loss_last), as
  records.Metrics has them;
- energy over the measured window (ddlbench.analysis.energy, records.Metrics): energy_j (Σ over distinct
  GPUs, NVML), energy_uncertainty_j, energy_gpus, cpu_package_energy_j (Σ over distinct RAPL packages),
  cpu_package_uncertainty_j, energy_window_s, samples_per_j (global samples of the window ÷ energy_j),
  samples_per_j_uncertainty, energy_too_short, energy_note ("not measurable here: no NVML, no RAPL");
- rank facts: mesh, stages, local_parameters_{max,min}, split_flops_share, gradient_path,
  gradient_reduction;
- provenance: hostnames, cpu_model, gpu_model, backend, launcher, torch_version, ddlbench_version,
  git_commit, config_hash, start_time, end_time, and the SLURM job: slurm_job_id,
  slurm_{array_task_id,partition,node_list,cpus,gpus,restarts,exclusive}; the software and the cards:
  driver_version, cuda_runtime_version, cudnn_version, nccl_version, nvml ("nvml" or why not), and each
  fact of the point's GPUs as text, its distinct values comma-separated:
  gpu_{uuids,power_limit_w,sm_clock_app_mhz,sm_clock_max_mhz,mem_clock_app_mhz,mem_clock_max_mhz},
  gpu_{ecc_mode,mig_mode,persistence_mode,vbios_version}; the host allocator: allocator ("glibc defaults",
  or the MALLOC_* / GLIBC_TUNABLES variables and preloaded allocator the ranks ran with);
- per configuration, over its repetitions, repeated on each of its rows that took part
  (ddlbench.analysis.configurations.POINT_SUMMARY_COLUMNS): n_repetitions, repetitions_not_ok,
  repetitions_other_version, rep_samples_per_s_* and rep_step_time_s_* …, median_repetition,
  any_oversubscribed, speedup, scaling_efficiency, base_*, scaling_held and scaling_key (the batch the
  speedup's series holds equal over nodes, and that series), vs_baseline, baseline_* (baseline_held_equal:
  which batch the ddp it divides by holds equal).
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.analysis.configurations import POINT_SUMMARY_COLUMNS, summarize_configurations
from ddlbench.analysis.inside.figures import TABLE_STATS, anatomy_columns
from ddlbench.analysis.inside.timeline import trace_path
from ddlbench.analysis.keys import keys, point_columns
from ddlbench.atomic import write_atomic
from ddlbench.parallel import map_forked
from ddlbench.point import Point
from ddlbench.records import MEASUREMENT_VERSION, PointRecord, RecordError, Stats, read_record, record_path
from ddlbench.sweep import Plan

RECORDS_PER_WORKER = 500  # below this many records a worker process costs more than it saves (ddlbench.parallel)

STATS_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Stats))
STEP_FIGURES = ("samples_per_s", "step_time_s")
INPUT_FIGURES = ("input_wait_s", "input_wait_share")  # points that read through a loader only
# columns of yes/no facts, kept as nullable booleans (a missing or failed point has none)
BOOLEAN_COLUMNS = (
    *(f"{figure}_noisy" for figure in (*STEP_FIGURES, *INPUT_FIGURES, *TABLE_STATS)),
    "oversubscribed",
    "energy_too_short",
    "other_measurement_version",
    "rep_samples_per_s_noisy",
    "rep_step_time_s_noisy",
    "any_oversubscribed",
)
COUNT_COLUMNS = (
    "n_repetitions",
    "repetitions_not_ok",
    "repetitions_other_version",
    "median_repetition",
    "base_nodes",
    "straggler_rank",
    "straggler_slowest_steps",
    "straggler_steps",
    "energy_gpus",
)
# per-configuration columns of text: a key, which batch the ddp baseline and the speedup hold equal, the
# repetitions' values (JSON), the speedup's series
TEXT_COLUMNS = (
    "baseline_config_key", "baseline_held_equal", "rep_samples_per_s_values", "scaling_held", "scaling_key",
)  # fmt: skip
FLOAT_COLUMNS = tuple(
    column for column in POINT_SUMMARY_COLUMNS if column not in (*BOOLEAN_COLUMNS, *COUNT_COLUMNS, *TEXT_COLUMNS)
)
# rank facts copied as they are, from the first rank that states them
FACT_COLUMNS = ("split_flops_share", "gradient_path", "gradient_reduction")
# records.Metrics' energy fields, copied as they are (ddlbench.analysis.energy defines them)
ENERGY_COLUMNS = (
    "energy_j", "energy_uncertainty_j", "energy_gpus", "cpu_package_energy_j", "cpu_package_uncertainty_j",
    "energy_window_s", "samples_per_j", "samples_per_j_uncertainty", "energy_too_short", "energy_note",
)  # fmt: skip
# records.GpuFacts' facts that tell two runs' cards apart: table column ← GpuFacts field, as text (the distinct
# values over the point's GPUs, comma-separated)
GPU_FACT_COLUMNS = {
    "gpu_uuids": "uuid",  # the point's GPUs, by UUID (GPU-…)
    "gpu_power_limit_w": "power_limit_w",  # their power limits (W)
    "gpu_sm_clock_app_mhz": "sm_clock_app_mhz",  # their SMs' application clocks (MHz)
    "gpu_sm_clock_max_mhz": "sm_clock_max_mhz",  # their SMs' highest clocks (MHz)
    "gpu_mem_clock_app_mhz": "mem_clock_app_mhz",  # their memory's application clocks (MHz)
    "gpu_mem_clock_max_mhz": "mem_clock_max_mhz",  # their memory's highest clocks (MHz)
    "gpu_ecc_mode": "ecc_mode",  # ECC: 1 on, 0 off
    "gpu_mig_mode": "mig_mode",  # Multi-Instance GPU: 1 on, 0 off
    "gpu_persistence_mode": "persistence_mode",  # 1: the driver stays loaded without clients
    "gpu_vbios_version": "vbios_version",  # their VBIOS versions
}


def build_table(plan: Plan, *, include_other_versions: bool = False) -> pd.DataFrame:
    """One row per planned point; a point without a readable record is a row with status `missing`.

    Configuration figures (repetitions, speedup, vs ddp) leave out records of another measurement
    version unless `include_other_versions`."""
    sweep_dir = plan.config.sweep_dir
    rows = map_forked(partial(_planned_row, sweep_dir), plan.points, least=RECORDS_PER_WORKER)
    return add_configuration_columns(pd.DataFrame(rows), include_other_versions=include_other_versions)


def _planned_row(sweep_dir: Path, point: Point) -> dict[str, Any]:
    """The point's row from its record; a `missing` row where it has no readable one."""
    path = record_path(sweep_dir, point.point_id)
    try:
        record = read_record(path)
        if record.point == point:  # the plan's own point knows its id and spec already
            record = dataclasses.replace(record, point=point)
        row = record_row(record)
        trace = trace_path(path)
        # the point's Chrome/Perfetto trace, relative to the sweep's folder; empty when not traced
        row["trace_file"] = str(trace.relative_to(sweep_dir)) if trace.exists() else None
        return row
    except RecordError as exc:
        reason = "no record yet" if not path.exists() else str(exc)
        return point_row(point) | {"status": "missing", "reason": reason}


def add_configuration_columns(
    table: pd.DataFrame, *, include_other_versions: bool = False, summary: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The per-configuration figures (ddlbench.analysis.configurations) on every point row that fed them;
    `summary`: summarize_configurations(table) with the same include_other_versions, when already made."""
    if summary is None:
        summary = summarize_configurations(table, include_other_versions=include_other_versions)
    table = table.drop(columns=[c for c in POINT_SUMMARY_COLUMNS if c in table.columns])
    used = _used_rows(table, include_other_versions=include_other_versions)
    joined = table.join(summary.set_index("config_key")[POINT_SUMMARY_COLUMNS], on="config_key")
    for column in POINT_SUMMARY_COLUMNS:
        joined[column] = joined[column].astype(object).where(used, None)
    return _nullable_types(joined)


def _used_rows(table: pd.DataFrame, *, include_other_versions: bool) -> pd.Series:
    if table.empty or "status" not in table.columns:
        return pd.Series(False, index=table.index, dtype=bool)
    used = table["status"] == "ok"
    if not include_other_versions and "other_measurement_version" in table.columns:
        used &= table["other_measurement_version"].fillna(False).astype(bool) == False  # noqa: E712
    return used


HOST_PROBE_COLUMNS = ("host_compute_s", "host_copy_s", "host_all_reduce_s", "host_at_once", "host_threads")


def host_probe_columns(probe: dict[str, Any] | None) -> dict[str, Any]:
    """The host speed probe's figures as columns (None where the record has no probe)."""
    probe = probe or {}
    return {column: probe.get(column.removeprefix("host_")) for column in HOST_PROBE_COLUMNS}


def record_row(record: PointRecord) -> dict[str, Any]:
    row = point_row(record.point) | {
        "status": record.status,
        "reason": record.reason,  # why a point is not ok; for a missing point, why there is no record
        "measurement_version": record.measurement_version,  # what the record's figures mean
        "other_measurement_version": record.measurement_version != MEASUREMENT_VERSION,  # not this ddlbench's
    }
    metrics = record.metrics
    if metrics is not None:
        for figure in STEP_FIGURES:
            stats = getattr(metrics, figure)
            row |= {f"{figure}_{name}": getattr(stats, name) for name in STATS_FIELDS}
        for figure in INPUT_FIGURES:
            if (stats := getattr(metrics, figure)) is not None:
                row |= {f"{figure}_{name}": getattr(stats, name) for name in STATS_FIELDS}
        row |= {
            "samples_per_s_overall": metrics.samples_per_s_overall,
            "window_s": metrics.window_s,
            "warmup_dropped_steps": metrics.warmup_dropped_steps,
            "clock_uncertainty_s": metrics.clock_uncertainty_s,
            "oversubscribed": metrics.oversubscribed,
            "cores_note": metrics.cores_note,
            "shared_host_s": metrics.shared_host_s,
            **host_probe_columns(metrics.host_probe),
            "peak_rss_bytes": metrics.peak_rss_bytes,
            "cuda_peak_allocated_bytes": metrics.cuda_peak_allocated_bytes,
            "cuda_peak_reserved_bytes": metrics.cuda_peak_reserved_bytes,
            "tensor_peak_bytes": metrics.tensor_peak_bytes,
            "tensor_resident_bytes": metrics.tensor_resident_bytes,
            "input_pool_bytes": metrics.input_pool_bytes,
            "loss_first": metrics.loss_first,
            "loss_last": metrics.loss_last,
        }
        row |= {name: getattr(metrics, name) for name in ENERGY_COLUMNS}
        row |= anatomy_columns(metrics, STATS_FIELDS)
    if record.ranks:
        row |= _facts_columns(record)
        # loader: some rank read real data during the steps; resident: batches made before timing
        row["input_source"] = "loader" if any(rank.input_source == "loader" for rank in record.ranks) else "resident"
    prov = record.provenance
    row |= {
        "hostnames": ",".join(prov.hostnames),  # distinct hosts of the ranks, comma-separated, in rank order
        "cpu_model": prov.cpu_model,  # the CPU's model name, on the launcher's host
        "gpu_model": prov.gpu_model,  # the ranks' GPU names; empty without GPUs
        "backend": prov.backend,  # torch.distributed backend: gloo or nccl
        "launcher": prov.launcher,  # how the ranks were started: local, srun or mpirun
        "torch_version": prov.torch_version,  # of the ranks
        "ddlbench_version": prov.ddlbench_version,
        "git_commit": prov.git_commit,  # of the checkout ddlbench ran from
        "slurm_job_id": prov.slurm_job_id,  # the SLURM job; empty outside SLURM
        "slurm_array_task_id": prov.slurm.array_task_id if prov.slurm else None,  # the task in a job array
        "slurm_partition": prov.slurm.partition if prov.slurm else None,  # the partition the job ran in
        "slurm_node_list": prov.slurm.node_list if prov.slurm else None,  # the job's nodes, SLURM's compressed form
        "slurm_cpus": prov.slurm.num_cpus if prov.slurm else None,  # CPUs of the whole allocation
        "slurm_gpus": prov.slurm.num_gpus if prov.slurm else None,  # GPUs of the whole allocation
        "slurm_restarts": prov.slurm.restarts if prov.slurm else None,  # times SLURM requeued the job before
        "slurm_exclusive": prov.slurm.exclusive if prov.slurm else None,  # nodes held alone (sbatch --exclusive)
        "config_hash": prov.config_hash,  # sha256 of the point's canonical spec
        "start_time": prov.start_time,  # ISO 8601, UTC
        "end_time": prov.end_time,  # ISO 8601, UTC
        "driver_version": prov.driver_version,  # the NVIDIA driver (NVML); empty off CUDA
        "cuda_runtime_version": prov.cuda_runtime_version,  # torch's CUDA runtime
        "cudnn_version": prov.cudnn_version,
        "nccl_version": prov.nccl_version,
        "nvml": prov.nvml,  # "nvml", or why NVML was not read
        "allocator": prov.allocator,  # the host allocator's settings: "glibc defaults", or what was set
    }
    for column, name in GPU_FACT_COLUMNS.items():  # the GPUs' facts, distinct values comma-separated
        values = {_fact_text(getattr(gpu, name)) for gpu in prov.gpus if getattr(gpu, name) is not None}
        row[column] = ",".join(sorted(values)) or None
    return row


def _fact_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)  # a power limit of 700.0 W reads 700


def _facts_columns(record: PointRecord) -> dict[str, Any]:
    """The strategy's facts, summarised: mesh and stage counts from rank 0, parameter spread over ranks."""
    first = record.ranks[0].facts
    local = [rank.facts.get("local_parameters") for rank in record.ranks]
    local = [count for count in local if isinstance(count, int)]
    stage_blocks = first.get("stage_blocks")  # every stage's block range, on every rank of a pipeline
    columns = {
        "mesh": json.dumps(first.get("mesh"), sort_keys=True) if first.get("mesh") else None,  # dims and sizes (JSON)
        "stages": len(stage_blocks) if isinstance(stage_blocks, list) else None,
        "local_parameters_max": max(local) if local else None,  # parameters held by the fullest rank
        "local_parameters_min": min(local) if local else None,  # … and by the emptiest
    }
    for name in FACT_COLUMNS:
        stated = next((rank.facts[name] for rank in record.ranks if rank.facts.get(name) is not None), None)
        columns[name] = stated if stated is None or isinstance(stated, str | int | float) else json.dumps(stated)
    return columns


def point_row(point: Point) -> dict[str, Any]:
    """The columns every row has, record or not: the point's fields, its keys and its derived sizes."""
    return (
        {"point_id": point.point_id}
        | point_columns(point)
        | keys(point)
        | {"world_size": point.world_size, "replicas": point.replicas, "global_batch_size": point.global_batch_size}
    )


def _nullable_types(table: pd.DataFrame) -> pd.DataFrame:
    """Yes/no and count columns as pandas' nullable types, so Parquet stores them as such with nulls."""
    for columns, dtype in ((BOOLEAN_COLUMNS, "boolean"), (COUNT_COLUMNS, "Int64"), (FLOAT_COLUMNS, "float64")):
        for column in columns:
            if column in table.columns:
                table[column] = table[column].astype(dtype)
    return table


def save_table(table: pd.DataFrame, *, parquet: Path, csv: Path) -> None:
    """Parquet (the typed table the report reads) and CSV for other tools, both through Arrow: its CSV
    writer is 9× faster than pandas' on a 10,000-point table (0.25 s against 2.2 s); it writes booleans
    as true/false and quotes only where needed."""
    import pyarrow
    import pyarrow.csv
    import pyarrow.parquet

    arrow = pyarrow.Table.from_pandas(table, preserve_index=False)  # keeps pandas' dtypes in its metadata
    write_atomic(parquet, lambda tmp: pyarrow.parquet.write_table(arrow, str(tmp)))
    options = pyarrow.csv.WriteOptions(quoting_style="needed")
    write_atomic(csv, lambda tmp: pyarrow.csv.write_csv(arrow, str(tmp), write_options=options))
