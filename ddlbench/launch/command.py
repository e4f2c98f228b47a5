"""What every launcher starts: the worker command of a point's ranks, and their process's variables (threads,
host allocator)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from ddlbench.errors import DdlbenchError
from ddlbench.point import Point


def worker_command(point: Point, rank_dir: Path, dump_params: Path | None, group: Path | None = None) -> list[str]:
    """The ranks' command; with `group`, a file listing several points of `point`'s layout that the ranks
    run one after another in this one launch (ddlbench.launch.group), `point` being the first."""
    command = [
        sys.executable,
        "-m",
        "ddlbench.launch.worker",
        "--spec",
        point.to_json(),
        "--rank-dir",
        str(rank_dir),
    ]
    if dump_params is not None:
        command += ["--dump-params", str(dump_params)]
    if group is not None:
        command += ["--group", str(group)]
    return command


def thread_env(point: Point) -> dict[str, str]:
    # OpenMP and MKL size their pools from these before torch.set_num_threads runs
    return {"OMP_NUM_THREADS": str(point.threads), "MKL_NUM_THREADS": str(point.threads)}


# glibc told to keep what it frees (the sweep key `host_allocator: retain`): no tensor below 4 GiB is mapped anew
# (glibc's default maps every block of 32 MiB or more, and each of its pages faults at first touch, each time it
# is allocated), the top of the heap is never handed back, and the heap grows 1 GiB at a time. One arena for
# every thread: glibc gives each other thread (gloo's, a loader's) an arena of 64 MiB heaps, which maps any
# larger block anew whatever the threshold, so gloo's buffers for zero2's 411 MB bucket (vgg11) faulted on
# 117 thousand pages in every all-gather (docs/analytic.md, "The host allocator's other threads"). Read by glibc
# once, as the process starts: a launcher sets them, the worker cannot.
RETAIN_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}
HOST_ALLOCATORS = ("retain", "system")


def allocator_env(point: Point, environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables a point's ranks start with beyond `environ`: for `retain` each of RETAIN_ENV that
    `environ` does not set already (a site's or a user's own setting stands, and the rank records it); for
    `system` (and a calibration point without the field) none. Another value (a spec written by hand) is refused."""
    policy = getattr(point, "host_allocator", "system")
    if policy not in HOST_ALLOCATORS:
        raise DdlbenchError(f"host_allocator {policy!r} is not one of: {', '.join(HOST_ALLOCATORS)}")
    if policy != "retain":
        return {}
    return {name: value for name, value in RETAIN_ENV.items() if not environ.get(name)}


def process_env(point: Point, environ: Mapping[str, str]) -> dict[str, str]:
    """What a launcher adds to `environ` for the point's ranks' processes: thread counts and host allocator."""
    return thread_env(point) | allocator_env(point, environ)
