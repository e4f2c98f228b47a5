"""All records of a sweep (failed ones included) → one table, saved as Parquet and CSV."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.atomic import write_atomic
from ddlbench.point import Point
from ddlbench.records import PointRecord, RecordError, read_record, record_path
from ddlbench.sweep import Plan

POINT_COLUMNS = [
    "model", "dataset", "strategy", "nodes", "ranks_per_node", "batch_size", "micro_batches", "split",
    "threads", "repetition", "warmup_steps", "steps", "seed",
]  # fmt: skip


# What makes two points the same configuration at different node counts (repetitions pooled). Not
# `split`: a pure model/pipeline split uses every rank, so it grows with the nodes by definition.
SERIES_KEYS = [
    "model", "dataset", "strategy", "ranks_per_node", "batch_size", "micro_batches", "threads", "model_options",
    "strategy_options", "data",
]  # fmt: skip


def build_table(plan: Plan) -> pd.DataFrame:
    """One row per planned point; a point without a readable record is a row with status `missing`."""
    rows = []
    for point in plan.points:
        path = record_path(plan.config.sweep_dir, point.point_id)
        try:
            rows.append(record_row(read_record(path)))
        except RecordError as exc:
            reason = "no record yet" if not path.exists() else str(exc)
            rows.append(_point_row(point) | {"status": "missing", "reason": reason})
    return add_scaling(pd.DataFrame(rows))


def add_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup and parallel efficiency over the smallest node count of each series.

    speedup(n) = T(n) / T(n0) and efficiency(n) = speedup(n) / (n / n0), where T is the median global
    samples/s of a successful point and T(n0) the median over repetitions at the series' smallest
    successful node count n0. Dimensionless; empty where the point failed or the series has no base.
    """
    table = table.assign(speedup=float("nan"), scaling_efficiency=float("nan"))
    if "samples_per_s_median" not in table.columns:
        return table
    ok = table["status"] == "ok"
    for _, series in table[ok].groupby(SERIES_KEYS):
        base_nodes = series["nodes"].min()
        base = series.loc[series["nodes"] == base_nodes, "samples_per_s_median"].median()
        speedup = series["samples_per_s_median"] / base
        table.loc[series.index, "speedup"] = speedup
        table.loc[series.index, "scaling_efficiency"] = speedup / (series["nodes"] / base_nodes)
    return table


def record_row(record: PointRecord) -> dict[str, Any]:
    row = _point_row(record.point) | {"status": record.status, "reason": record.reason}
    metrics = record.metrics
    if metrics is not None:
        for name in ("samples_per_s", "step_time_s"):
            stats = getattr(metrics, name)
            row |= {f"{name}_median": stats.median, f"{name}_p5": stats.p5, f"{name}_p95": stats.p95}
        row |= {
            "samples_per_s_overall": metrics.samples_per_s_overall,
            "peak_rss_bytes": metrics.peak_rss_bytes,
            "cuda_peak_allocated_bytes": metrics.cuda_peak_allocated_bytes,
            "cuda_peak_reserved_bytes": metrics.cuda_peak_reserved_bytes,
            "loss_first": metrics.loss_first,
            "loss_last": metrics.loss_last,
            "tensor_peak_bytes": metrics.tensor_peak_bytes,
        }
    if record.ranks:
        row |= _facts_columns(record)
    prov = record.provenance
    row |= {
        "hostnames": ",".join(prov.hostnames),
        "cpu_model": prov.cpu_model,
        "gpu_model": prov.gpu_model,
        "backend": prov.backend,
        "launcher": prov.launcher,
        "torch_version": prov.torch_version,
        "ddlbench_version": prov.ddlbench_version,
        "git_commit": prov.git_commit,
        "slurm_job_id": prov.slurm_job_id,
        "slurm_array_task_id": prov.slurm.array_task_id if prov.slurm else None,
        "slurm_partition": prov.slurm.partition if prov.slurm else None,
        "slurm_node_list": prov.slurm.node_list if prov.slurm else None,
        "slurm_cpus": prov.slurm.num_cpus if prov.slurm else None,
        "slurm_gpus": prov.slurm.num_gpus if prov.slurm else None,
        "slurm_restarts": prov.slurm.restarts if prov.slurm else None,
        "config_hash": prov.config_hash,
        "start_time": prov.start_time,
        "end_time": prov.end_time,
    }
    return row


def _facts_columns(record: PointRecord) -> dict[str, Any]:
    """The strategy's facts, summarised: mesh and stage counts from rank 0, parameter spread over ranks."""
    first = record.ranks[0].facts
    local = [rank.facts.get("local_parameters") for rank in record.ranks]
    local = [count for count in local if isinstance(count, int)]
    stage_blocks = first.get("stage_blocks")  # every stage's block range, on every rank of a pipeline
    return {
        "mesh": json.dumps(first.get("mesh"), sort_keys=True) if first.get("mesh") else None,
        "stages": len(stage_blocks) if isinstance(stage_blocks, list) else None,
        "local_parameters_max": max(local) if local else None,
        "local_parameters_min": min(local) if local else None,
    }


def _point_row(point: Point) -> dict[str, Any]:
    row: dict[str, Any] = {"point_id": point.point_id}
    row |= {column: getattr(point, column) for column in POINT_COLUMNS}
    row |= {
        "world_size": point.world_size,
        "replicas": point.replicas,
        "global_batch_size": point.global_batch_size,
        "model_options": json.dumps(dict(point.model_options), sort_keys=True),
        "strategy_options": json.dumps(dict(point.strategy_options), sort_keys=True),
        "data": point.data_path or "synthetic",
    }
    return row


def save_table(table: pd.DataFrame, *, parquet: Path, csv: Path) -> None:
    write_atomic(parquet, lambda tmp: table.to_parquet(tmp, index=False))
    write_atomic(csv, lambda tmp: table.to_csv(tmp, index=False))
