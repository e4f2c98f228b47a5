"""Scheduler load of a 200-point sweep: how many times ddlbench (through Snakemake's SLURM plugin, and
through `ddlbench submit` with submitit) calls sbatch, squeue, sacct and scontrol, and how many calls
that makes per point per minute of the sweep (issue 23's target: at most 0.05).

Needs the cluster of `make slurm-up`. Every SLURM client command is shadowed by a shim on PATH that
logs the call (and whether it came from inside a job) and then runs the real command. The points are
the cheapest that still run as real jobs: resnet8 on one rank, one measured step, repeated; nodes are
shared (--no-exclusive), so each virtual node runs two points at once.

    python benchmarks/scheduler_load.py [--points 200]

Figures per point per minute (the sweep's wall time, submission to the last record):
  status queries = (squeue + sacct calls on the login node) / points / minutes
  scheduler calls = (every SLURM command on the login node) / points / minutes
Calls from inside jobs (each point's own scontrol and srun) are per point, not per minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sacctmgr", "srun", "scancel")


def make_shims(folder: Path, log: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        real = shutil.which(command)
        if real is None:
            sys.exit(f"{command} not found: run `make slurm-up` first")
        shim = folder / command
        shim.write_text(f'#!/bin/sh\necho "{command} ${{SLURM_JOB_ID:+job}}" >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)


def count(log: Path) -> tuple[Counter, Counter]:
    login, jobs = Counter(), Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        (jobs if len(parts) > 1 else login)[parts[0]] += 1
    return login, jobs


def sweep_file(folder: Path, name: str, points: int) -> Path:
    config = {
        "name": name,
        "results_dir": str(folder / "results"),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp"],
        "nodes": [1],
        "batch_size": [4],
        "warmup_steps": 1,
        "steps": 1,
        "repetitions": points,
        "timeout_s": 60,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def statuses(sweep_dir: Path) -> dict[str, int]:
    """How many of the sweep's records say each status: every point must have run for the figures to count."""
    found = Counter(json.loads(path.read_text())["status"] for path in sweep_dir.glob("points/*/record.json"))
    return dict(sorted(found.items()))


def run(label: str, command: list[str], env: dict[str, str], log: Path, sweep_dir: Path) -> dict:
    log.unlink(missing_ok=True)
    began = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if result.returncode != 0:
        sys.exit(f"{label} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    login, jobs = count(log)
    return {"label": label, "wall_s": wall, "login": login, "jobs": jobs, "records": statuses(sweep_dir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddlbench-load-") as tmp:
        folder = Path(tmp)
        log = folder / "calls.log"
        make_shims(folder / "shims", log)
        env = {
            **os.environ,
            "PATH": f"{folder / 'shims'}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
            "XDG_CONFIG_HOME": str(folder / "xdg"),
        }
        subprocess.run(
            [BIN / "ddlbench", "profile", "slurm", "--partition", "cpu", "--mem-per-rank-mb", "600",
             "--time-margin-s", "60", "--no-exclusive"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        smk_sweep = sweep_file(folder, "smk", args.points)
        runs = [
            run(
                "snakemake --profile slurm",
                [str(BIN / "snakemake"), "--profile", "slurm", "--configfile", str(smk_sweep)],
                env,
                log,
                folder / "results" / "smk",
            ),
            run(
                "ddlbench submit (submitit arrays)",
                [str(BIN / "ddlbench"), "submit", "--configfile", str(sweep_file(folder, "sub", args.points))],
                env,
                log,
                folder / "results" / "sub",
            ),
        ]
    print(f"scheduler calls for a {args.points}-point sweep (login node; calls from inside jobs in brackets)")
    print(f"{'way':<36} {'wall s':>7} " + " ".join(f"{c:>13}" for c in COMMANDS))
    for result in runs:
        cells = " ".join(f"{result['login'][c]:>6} [{result['jobs'][c]:>4}]" for c in COMMANDS)
        print(f"{result['label']:<36} {result['wall_s']:>7.1f} {cells}")
    for result in runs:
        per_point = {c: round(result["login"][c] / args.points, 2) for c in ("sbatch", "squeue", "sacct")}
        print(f"{result['label']}: per point on the login node {per_point}; records {result['records']}")
    for result in runs:
        minutes = result["wall_s"] / 60
        login = result["login"]
        status = (login["squeue"] + login["sacct"]) / args.points / minutes
        every = sum(login.values()) / args.points / minutes
        print(
            f"{result['label']}: {status:.4f} status queries and {every:.4f} scheduler calls per point per minute "
            f"({args.points} points in {minutes:.1f} min; target <= 0.05)"
        )


if __name__ == "__main__":
    main()
