"""What goes into the results database: a sweep's figures, or a certificate's verdicts.

A sweep's figures are named and computed as a certificate's (ddlbench.history.figures), so a sweep and a
certificate of the same configurations compare figure by figure. Where a sweep ran: the system is
$DDLBENCH_SYSTEM (default `local`), the partition the one SLURM partition its records ran in (`local`
outside SLURM, `mixed` over several). With what it ran: `run_provenance`, which `compare` reads to name
what changed between two runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

import ddlbench
from ddlbench.config import SweepConfig
from ddlbench.history.db import store_run
from ddlbench.history.figures import machine_figures, training_figures
from ddlbench.provenance import utc_now
from ddlbench.records import MEASUREMENT_VERSION


def store_sweep(
    config: SweepConfig, table: pd.DataFrame, *, machine: dict[str, Any] | None, db: str | Path | None = None
) -> tuple[int, bool]:
    """Store an aggregated sweep; (run id, whether it was new)."""
    figures = [figure.to_dict() for figure in (machine_figures(machine) if machine else [])]
    figures += [figure.to_dict() for figure in training_figures(table)]
    run = {
        "kind": "sweep",
        "name": config.name,
        "system": os.environ.get("DDLBENCH_SYSTEM") or "local",
        "partition": _partition(table),
        "config_hash": config.config_hash(),
        "date": utc_now(),
        "ddlbench_version": ddlbench.__version__,
        "measurement_version": MEASUREMENT_VERSION,
        "git_commit": _one(table, "git_commit"),
        "passed": None,
        "source": str(config.sweep_dir),
        "provenance": run_provenance(table),
    }
    return store_run(run, figures, db=db)


def store_certificate(certificate: dict[str, Any], *, source: str, db: str | Path | None = None) -> tuple[int, bool]:
    run = {key: certificate[key] for key in ("system", "partition", "config_hash", "date", "ddlbench_version")}
    run |= {
        "kind": "certificate",
        "name": certificate["suite"],
        "measurement_version": certificate["measurement_version"],
        "git_commit": certificate.get("git_commit"),
        "passed": certificate["passed"],
        "source": source,
        "provenance": certificate.get("provenance") or {},
    }
    return store_run(run, certificate["figures"], db=db)


# the table's columns (ddlbench.analysis.aggregate) that say with which software and cards a run's records
# ran, in the order compare names them (ddlbench.history.compare.PROVENANCE_NAMES)
PROVENANCE_COLUMNS = (
    "driver_version", "cuda_runtime_version", "cudnn_version", "nccl_version", "torch_version", "gpu_model",
    "gpu_power_limit_w", "gpu_sm_clock_app_mhz", "gpu_sm_clock_max_mhz", "gpu_mem_clock_app_mhz",
    "gpu_mem_clock_max_mhz", "gpu_ecc_mode", "gpu_mig_mode", "gpu_persistence_mode", "gpu_vbios_version",
    "cpu_model", "allocator",
)  # fmt: skip


def run_provenance(table: pd.DataFrame) -> dict[str, str]:
    """Each provenance column's distinct values over the run's points ("a, b": several), where any point
    has one; a table's cell may already hold several, comma-separated."""
    provenance = {}
    for column in PROVENANCE_COLUMNS:
        if column not in table.columns:
            continue
        values = {part.strip() for value in table[column].dropna() for part in str(value).split(",")}
        if values := sorted(value for value in values if value):
            provenance[column] = ", ".join(values)
    return provenance


def _partition(table: pd.DataFrame) -> str:
    if "slurm_partition" not in table.columns:
        return "local"
    partitions = {str(value) for value in table["slurm_partition"].dropna()}
    return partitions.pop() if len(partitions) == 1 else ("mixed" if partitions else "local")


def _one(table: pd.DataFrame, column: str) -> str | None:
    if column not in table.columns:
        return None
    values = sorted({str(value) for value in table[column].dropna()})
    return ",".join(values) or None
