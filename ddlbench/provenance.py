"""Where, when and with what a point ran: versions, hosts, devices, SLURM job, config hash."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ddlbench
from ddlbench.records import GpuFacts, Provenance, RankResult, SlurmJob

SOURCE_DIR = Path(ddlbench.__file__).resolve().parents[1]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@functools.cache
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout ddlbench runs from; (None, None) when it is not a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(SOURCE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(SOURCE_DIR), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, bool(status.strip())


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_provenance(
    *,
    launcher: str,
    ranks: list[RankResult],
    config_hash: str | None,
    start_time: str,
    end_time: str,
    slurm: SlurmJob | None = None,
) -> Provenance:
    commit, dirty = git_state()
    hostnames = tuple(dict.fromkeys(rank.hostname for rank in sorted(ranks, key=lambda r: r.rank)))
    if not hostnames:
        hostnames = (platform.node(),)
    device_names = sorted({rank.device_name for rank in ranks if rank.device_name})
    return Provenance(
        ddlbench_version=ddlbench.__version__,
        git_commit=commit,
        git_dirty=dirty,
        python_version=platform.python_version(),
        torch_version=ranks[0].torch_version if ranks else installed_version("torch"),
        backend=ranks[0].backend if ranks else None,
        launcher=launcher,
        hostnames=hostnames,
        cpu_model=cpu_model(),
        gpu_model=", ".join(device_names) or None,
        slurm_job_id=slurm.job_id if slurm else os.environ.get("SLURM_JOB_ID"),
        slurm=slurm,
        config_hash=config_hash,
        start_time=start_time,
        end_time=end_time,
        **software_and_cards(ranks),
    )


def software_and_cards(ranks: list[RankResult]) -> dict[str, Any]:
    """Provenance's driver, CUDA runtime, cuDNN and NCCL versions (each one's distinct values over ranks,
    comma-separated; None where no rank states it), every distinct GPU (by host and UUID, the lowest rank's
    facts), and whether NVML was read ("nvml") or why not (rank 0's "no NVML: …")."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    facts = [rank.gpu_facts for rank in ordered if rank.gpu_facts is not None]
    gpus: dict[tuple[str, str], GpuFacts] = {}
    for rank in ordered:
        if rank.gpu_facts is not None and rank.gpu_facts.uuid:
            gpus.setdefault((rank.hostname, rank.gpu_facts.uuid), rank.gpu_facts)
    nvml = next((f.source for f in facts if f.source == "nvml"), facts[0].source if facts else None)
    return {
        "driver_version": _distinct(f.driver_version for f in facts),
        "cuda_runtime_version": _distinct(rank.cuda_runtime_version for rank in ordered),
        "cudnn_version": _distinct(rank.cudnn_version for rank in ordered),
        "nccl_version": _distinct(rank.nccl_version for rank in ordered),
        "gpus": tuple(gpus.values()),
        "nvml": nvml,
    }


def _distinct(values: Iterable[Any]) -> str | None:
    """The distinct values stated, sorted, comma-separated; None when none is."""
    return ", ".join(sorted({str(value) for value in values if value is not None})) or None
