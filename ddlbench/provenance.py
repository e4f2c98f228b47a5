"""Where, when and with what a point ran: versions, hosts, devices, SLURM job, config hash."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import ddlbench
from ddlbench.records import Provenance, RankResult, SlurmJob

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
    )
