"""One sweep run both ways on the test cluster: a job per point (`ddlbench submit`, submitit arrays) and
packed into one allocation (`ddlbench submit --pack 4`, the test partition). Needs the cluster of `make slurm-up`.

The sweep: resnet8 on CIFAR-10, ddp, 1 and 2 nodes × 1 rank, `--points` points in all (repetitions of
the two shapes), 1 warm-up and 3 steps each. Both ways run the same sweep into folders of their own,
alternating (per point first in odd rounds, packed first in even ones), so that a slow moment of this
shared host does not fall on one way only.

Printed per way and round: wall seconds from the command's start to its return (submission, queue,
every point, the table and the report), the SLURM jobs it made and the node-seconds they held (sacct:
Σ nodes × elapsed, whole seconds); then the median wall time of
each way and their ratio. The test cluster's 4 virtual nodes share this host's cores, so the points'
own times are not figures of any machine; what the ratio shows is what packing saves in queueing and
per-job start-up.

    python benchmarks/packed_wall.py [--points 8] [--rounds 2] [--pack 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def sweep_file(folder: Path, name: str, points: int) -> Path:
    config = {
        "name": name,
        "results_dir": str(folder / "results"),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp"],
        "nodes": [1, 2],
        "batch_size": [8],
        "warmup_steps": 1,
        "steps": 3,
        "repetitions": max(1, points // 2),
        "timeout_s": 60,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def jobs_since(start: str, env: dict[str, str], name: str) -> tuple[int, float]:
    """SLURM jobs (array tasks one each, steps not counted) of this user since `start` named after the
    sweep, and the node-seconds they held (Σ nodes × elapsed, sacct)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", start, "-o", "JobName,NNodes,ElapsedRaw"],
        capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    rows = [line.split("|") for line in out.splitlines() if line.split("|")[0].endswith(name + "-packed")
            or line.split("|")[0] == f"ddlbench-{name}"]  # fmt: skip
    return len(rows), sum(int(nodes) * int(elapsed) for _, nodes, elapsed in rows)


def run(way: str, folder: Path, points: int, env: dict[str, str], index: int, pack: str) -> dict:
    name = f"{way}{index}"
    sweep = sweep_file(folder, name, points)
    command = [str(BIN / "ddlbench"), "submit", "--configfile", str(sweep)]
    if way == "packed":
        command += ["--pack", pack]
    start = time.strftime("%Y-%m-%dT%H:%M:%S")
    began = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if result.returncode != 0:
        sys.exit(f"{way} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    ok = result.stdout.strip().splitlines()[-1]
    time.sleep(2)  # sacct has the jobs' ends a moment after squeue
    jobs, node_s = jobs_since(start, env, name)
    return {"way": way, "wall_s": wall, "jobs": jobs, "node_s": node_s, "outcome": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pack", default="4", help="nodes of the packed allocation (default 4: the test partition)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddlbench-packed-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "XDG_CONFIG_HOME": str(folder / "xdg")}
        subprocess.run(
            [BIN / "ddlbench", "profile", "slurm", "--partition", "cpu", "--time-margin-s", "60"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        results = []
        for index in range(args.rounds):
            ways = ("per_point", "packed") if index % 2 == 0 else ("packed", "per_point")
            for way in ways:
                results.append(run(way, folder, args.points, env, index, args.pack))
                last = results[-1]
                print(f"round {index} {way:<10} {last['wall_s']:>7.1f} s wall, {last['jobs']} SLURM job(s) holding "
                      f"{last['node_s']:.0f} node-s: {last['outcome']}")  # fmt: skip
    medians = {
        way: statistics.median(r["wall_s"] for r in results if r["way"] == way) for way in ("per_point", "packed")
    }
    print(f"median wall s over {args.rounds} round(s) of {max(1, args.points // 2) * 2} points: "
          f"per point {medians['per_point']:.1f}, packed {medians['packed']:.1f}; "
          f"packed ÷ per point {medians['packed'] / medians['per_point']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
