"""Where, when and with what a point ran: versions, hosts, devices, SLURM job, config hash."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ddlbench
from ddlbench.records import GpuFacts, Provenance, RankResult, SlurmJob

SOURCE_DIR = Path(ddlbench.__file__).resolve().parents[1]


# the host allocator's settings a rank records as it saw them (never set by ddlbench): glibc's malloc tunables
# and a preloaded allocator (jemalloc, tcmalloc, mimalloc). On a CPU they move a step: glibc's defaults map and
# zero a pipeline's per-micro-batch gradients anew (ddlbench.analysis.analytic.pipelines, ~25 % of vgg11's 1F1B)
ALLOCATOR_ENV_NAMES = (
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
)


def allocator_env_seen(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator's variables (ALLOCATOR_ENV_NAMES) of `environ`, as a rank records them; of LD_PRELOAD only
    the libraries that are allocators (a file name with "malloc" in it: jemalloc, tcmalloc, mimalloc, …)."""
    seen = {name: environ[name] for name in ALLOCATOR_ENV_NAMES if environ.get(name)}
    if "LD_PRELOAD" in seen:
        allocators = [part for part in seen["LD_PRELOAD"].replace(":", " ").split() if "malloc" in Path(part).name]
        if allocators:
            seen["LD_PRELOAD"] = " ".join(allocators)
        else:
            del seen["LD_PRELOAD"]
    return seen


def allocator_summary(seen: Mapping[str, str]) -> str:
    """One line for a rank's allocator settings: "glibc defaults", or the variables that were set, in
    ALLOCATOR_ENV_NAMES order (a preloaded library by its file name: its folder differs by host, not what it is)."""
    if not seen:
        return "glibc defaults"
    shown = {**seen}
    if "LD_PRELOAD" in shown:  # allocator_env_seen keeps it space-separated
        shown["LD_PRELOAD"] = " ".join(Path(part).name for part in shown["LD_PRELOAD"].split())
    return " ".join(f"{name}={shown[name]}" for name in ALLOCATOR_ENV_NAMES if name in shown)


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


def host_memory_bytes() -> int | None:
    """This host's physical memory, bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


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
        allocator=ranks_allocator(ranks),
    )


def ranks_allocator(ranks: list[RankResult]) -> str | None:
    """The ranks' allocator settings (allocator_summary), distinct values in rank
    order joined by "; "; None without ranks."""
    seen = [allocator_summary(rank.allocator_env) for rank in sorted(ranks, key=lambda r: r.rank)]
    return "; ".join(dict.fromkeys(seen)) or None


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
