"""What every launcher starts: the worker command of a point's ranks, and their thread variables."""

from __future__ import annotations

import sys
from pathlib import Path

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
