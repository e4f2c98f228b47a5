"""Scheduler and filesystem load of a sweep on the login node, beside the figures of the code at
BASELINE (81da814), and the time `ddlbench status` takes.

--simulate N (no cluster; N = 10,000 for issue 29's targets): a sweep of N points whose records are on
disk, half of them ended, the other half queued (RUNNING at once, the rest pending) under a virtual
clock, watched by each road as it is written: `submit`'s wait (QueueWatch, ResultNap and the progress
line's status look) and `status --watch`. squeue is a function that counts its calls; filesystem
operations are counted by wrapping os.stat and io.open (a result file's existence, a fake, counts too).
Windows of virtual time:
  churn     CHURN_S (10 min) in which one job ends every END_EVERY_S (5 s): polls as often as ends ask
  settling  the first SETTLE_S (5 min) after the last end: the interval grows back (×1.5 to 120 s)
  steady    the rest of QUIET_S (30 min) with nothing ending: the state of a long sweep between ends,
            issue 29's target: ≤ 2 scheduler calls a minute for the whole sweep and ≤ 1 filesystem
            operation (stat or open) per point per minute
  calls/min = squeue calls in the window ÷ its minutes; fs ops/point/min = operations ÷ points ÷ minutes
Then the status of the N points (all with records) is timed in process: BASELINE's sweep_status, today's
cold (no cache) and warm (the cache `ddlbench status` keeps: a stat per record), and `ddlbench status
--no-queue` end to end (median of --repeats), beside planning alone (load + expand + point ids).
BASELINE's code is read with `git show`; its record reads are counted, and parsed once per version.

Without --simulate (the cluster of `make slurm-up`): how many times ddlbench (through Snakemake's SLURM
plugin, and through `ddlbench submit` with submitit) calls sbatch, squeue, sacct and scontrol for a
--points sweep (default 200), and how many calls that makes per point per minute of the sweep (issue
23's target: at most 0.05). Every SLURM client command is shadowed by a shim on PATH that logs the call
(and whether it came from inside a job) and then runs the real command. The points are the cheapest that
still run as real jobs: resnet8 on one rank, one measured step, repeated; nodes are shared
(--no-exclusive), so each virtual node runs two points at once. Each road runs twice: with today's code
and, beside it, with BASELINE's (a git worktree of it, first on PYTHONPATH and exported to the jobs,
its Snakefile, today's venv; --no-baseline leaves it out).

    python benchmarks/scheduler_load.py --simulate 10000        # issue 29's figures, no cluster
    python benchmarks/scheduler_load.py [--points 200]           # on the test cluster

Figures per point per minute on the cluster (the sweep's wall time, submission to the last record):
  status queries = (squeue + sacct calls on the login node) / points / minutes
  scheduler calls = (every SLURM command on the login node) / points / minutes
Calls from inside jobs (each point's own scontrol and srun) are per point, not per minute.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from ddlbench.cli.sweep import WATCH_MAX_INTERVAL_S, WATCH_ROUND_S
from ddlbench.config import load_sweep_config
from ddlbench.launch.progress import Progress, sweep_states, watch
from ddlbench.launch.result_watch import ResultNap
from ddlbench.launch.slurm import QueuedJob
from ddlbench.launch.status import CACHE_FILE, RecordCache, sweep_status
from ddlbench.launch.submission import JOBS_INDEX, read_jobs_index
from ddlbench.launch.waves import QueueWatch, wait_for_jobs
from ddlbench.records import record_path
from ddlbench.sweep import expand_sweep

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
        # a line a call: the command, where it ran (login, or inside a job) and its first two arguments
        shim.write_text(
            f'#!/bin/sh\nwhere=login; [ -n "$SLURM_JOB_ID" ] && where=job\n'
            f'echo "{command} $where $1 $2" >> "{log}"\nexec "{real}" "$@"\n'
        )
        shim.chmod(0o755)


def count(log: Path) -> tuple[Counter, Counter, Counter]:
    """Calls by command on the login node and inside jobs, and inside jobs by command and first two arguments."""
    login, jobs, in_jobs = Counter(), Counter(), Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        command, where, *arguments = line.split()
        (jobs if where == "job" else login)[command] += 1
        if where == "job":
            in_jobs[" ".join([command, *arguments])] += 1
    return login, jobs, in_jobs


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


def run(label: str, command: list[str], env: dict[str, str], log: Path, sweep_dir: Path, cwd: Path = REPO) -> dict:
    log.unlink(missing_ok=True)
    began = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if result.returncode != 0:
        sys.exit(f"{label} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    login, jobs, in_jobs = count(log)
    return {"label": label, "wall_s": wall, "login": login, "jobs": jobs, "in_jobs": in_jobs,
            "records": statuses(sweep_dir)}  # fmt: skip


# --- the simulated sweep: no cluster, a virtual clock --------------------------------------------------

BASELINE = "81da814"  # the commit whose figures are printed beside today's
RUNNING = 256  # jobs running at once in the simulated queue; the rest pend
CHURN_S, END_EVERY_S, QUIET_S, SETTLE_S = 600.0, 5.0, 1800.0, 300.0
SIMULATED_POINTS = 10_000


class Clock:
    """Virtual time: `sleep` advances it and ends the jobs due by then (their record rewritten, their
    result file present); `stop` ends the simulation at the first call past it."""

    def __init__(self, ends: dict[str, float], records: dict[str, Path], stop: float):
        self.now, self.stop = 0.0, stop
        self._due = deque(sorted((at, job_id) for job_id, at in ends.items()))
        self.ended: set[str] = set()
        self._records = records

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self._due and self._due[0][0] <= self.now:
            _, job_id = self._due.popleft()
            self.ended.add(job_id)
            path = self._records[job_id]
            os.utime(path, ns=(path.stat().st_mtime_ns + 1_000_000_000,) * 2)  # the job rewrote it
        if self.now >= self.stop:
            raise StopSimulation


class StopSimulation(Exception):
    pass


class Tally:
    """Scheduler calls and filesystem operations (os.stat, io.open) by window of virtual time."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls: Counter = Counter()
        self.files: Counter = Counter()

    def window(self) -> str:
        now = self.clock.now
        if now < CHURN_S:
            return "churn"
        return "settling" if now < CHURN_S + SETTLE_S else "steady"

    @contextlib.contextmanager
    def counting_files(self):
        real_stat, real_open = os.stat, io.open

        def stat(*args, **kwargs):
            self.files[self.window()] += 1
            return real_stat(*args, **kwargs)

        def opened(*args, **kwargs):
            self.files[self.window()] += 1
            return real_open(*args, **kwargs)

        os.stat, io.open = stat, opened
        try:
            yield
        finally:
            os.stat, io.open = real_stat, real_open


@dataclasses.dataclass
class FakeResult:
    """A submitit job's result file, as ResultNap sees it: present once the job ended (no disk)."""

    job_id: str
    tally: Tally

    def exists(self) -> bool:
        self.tally.files[self.tally.window()] += 1
        return self.job_id in self.tally.clock.ended


def simulated_sweep(folder: Path, points: int) -> tuple[Path, Any]:
    """A sweep of `points` points with every record written (as a sweep leaves them: report_speed's),
    and its jobs index: point i ran as job 1000_i."""
    sys.path.insert(0, str(Path(__file__).parent))
    from plan_speed import sweep_config
    from report_speed import synthetic_record

    config = folder / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep_config(points, folder / "results"), sort_keys=False))
    plan = expand_sweep(load_sweep_config(config))
    if len(plan.points) != points:
        sys.exit(f"scheduler_load: --simulate takes 100, 200, 300, 400 or a multiple of 500 points, not {points}")
    template = synthetic_record(plan.points[0], random.Random(0)).to_dict()
    template["status"], template["reason"] = "ok", None
    for point in plan.points:
        path = record_path(plan.config.sweep_dir, point.point_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(template | {"point_id": point.point_id, "point": point.to_dict()}, indent=1))
    index = {point.point_id: [f"1000_{i}"] for i, point in enumerate(plan.points)}
    (plan.config.sweep_dir / JOBS_INDEX).write_text(json.dumps(index))
    return config, plan


def baseline_code() -> tuple[Any, Any]:
    """BASELINE's sweep_status (status.py) and ResultNap (submission.py), read from git."""

    def source(path: str) -> str:
        return subprocess.run(["git", "show", f"{BASELINE}:{path}"], cwd=REPO, check=True, capture_output=True,
                              text=True).stdout  # fmt: skip

    status = types.ModuleType("baseline_status")
    sys.modules[status.__name__] = status  # its dataclasses look their module up
    exec(compile(source("ddlbench/launch/status.py"), "baseline_status", "exec"), status.__dict__)
    tree = ast.parse(source("ddlbench/launch/submission.py"))
    nap = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ResultNap")
    return status, ast.unparse(nap)


def simulate(way: str, code: str, plan: Any, *, baseline: tuple[Any, str]) -> dict:
    """One road (`submit` wait with its progress line, or `status --watch`) over the scenario: half the
    points ended before, then one job ends every END_EVERY_S for CHURN_S, then none for QUIET_S."""
    sweep_dir = plan.config.sweep_dir
    ids = [point.point_id for point in plan.points]
    jobs = {f"1000_{i}": point_id for i, point_id in enumerate(ids)}
    records = {job_id: record_path(sweep_dir, point_id) for job_id, point_id in jobs.items()}
    half = len(ids) // 2
    queued = list(jobs)[half:]
    ends = {job_id: 0.0 for job_id in list(jobs)[:half]}
    ends |= {job_id: END_EVERY_S * (k + 1) for k, job_id in enumerate(queued) if END_EVERY_S * (k + 1) <= CHURN_S}
    clock = Clock(ends, records, stop=CHURN_S + QUIET_S)
    clock.sleep(0)
    tally = Tally(clock)

    def squeue() -> list[QueuedJob]:
        tally.calls[tally.window()] += 1
        active = [job_id for job_id in queued if job_id not in clock.ended]
        return [
            QueuedJob(job_id=job_id, state="RUNNING" if k < RUNNING else "PENDING", name="ddlbench", comment="")
            for k, job_id in enumerate(active)
        ]

    old_status, old_nap = baseline
    read = functools.lru_cache(maxsize=None)(lambda path, _mtime: old_status_read(path))
    old_status_read = old_status.read_record

    def counted_read(path: Path):  # the baseline parses each record at each poll: counted as an open, parsed once
        tally.files[tally.window()] += 1
        return read(path, os.stat(path).st_mtime_ns)

    old_status.read_record = counted_read
    try:
        with tally.counting_files():
            if way == "submit":
                _simulate_submit(code, plan, queued, squeue, clock, tally, old_status, old_nap)
            else:
                _simulate_watch(code, plan, squeue, clock, old_status)
    except StopSimulation:
        pass
    finally:
        old_status.read_record = old_status_read
    return {"way": way, "code": code, "calls": tally.calls, "files": tally.files}


def _simulate_submit(code, plan, queued, squeue, clock, tally, old_status, old_nap) -> None:
    sweep_dir = plan.config.sweep_dir
    fake_jobs = [
        types.SimpleNamespace(job_id=job_id, paths=types.SimpleNamespace(result_pickle=FakeResult(job_id, tally)))
        for job_id in queued
    ]
    if code == "today":
        nap = ResultNap(lambda: fake_jobs, exists=FakeResult.exists, clock=clock.monotonic, sleep=clock.sleep)
        states = sweep_states(plan, sweep_dir=sweep_dir, clock=clock.monotonic)
    else:
        namespace = {"time": clock, "Callable": Callable, "Iterable": Iterable, "Any": Any}
        exec(old_nap, namespace)
        nap = namespace["ResultNap"](lambda: fake_jobs)

        def states(queue):
            return old_status.sweep_status(
                plan, queue=queue, jobs_index=read_jobs_index(sweep_dir), sweep_dir=sweep_dir
            )

    progress = Progress(title="simulated", stream=io.StringIO(), isatty=False, clock=clock.monotonic)
    watch = QueueWatch(query=squeue, sleep=nap)
    wait_for_jobs(queued, watch=watch, on_poll=lambda queue: progress.update(states(queue)))


def _simulate_watch(code, plan, squeue, clock, old_status) -> None:
    sweep_dir = plan.config.sweep_dir
    progress = Progress(title="simulated", stream=io.StringIO(), isatty=False, clock=clock.monotonic)
    if code == "today":
        states = sweep_states(plan, sweep_dir=sweep_dir, every_s=WATCH_ROUND_S, clock=clock.monotonic)
        watch(lambda: states(squeue()), progress=progress, interval_s=10.0, max_interval_s=WATCH_MAX_INTERVAL_S,
              until=lambda counts: False, sleep=clock.sleep)  # fmt: skip
    else:  # BASELINE's `status --watch`: squeue and every record every 10 s
        while True:
            queue = squeue()
            progress.update(old_status.sweep_status(plan, queue=queue, jobs_index=read_jobs_index(sweep_dir),
                                                    sweep_dir=sweep_dir))  # fmt: skip
            clock.sleep(10.0)


def time_status(config: Path, plan: Any, baseline_status: Any, repeats: int) -> dict[str, float]:
    """Median seconds of a status of every point (all recorded, queue empty), each way."""
    sweep_dir = plan.config.sweep_dir
    index = read_jobs_index(sweep_dir)
    cache = sweep_dir / CACHE_FILE
    cache.unlink(missing_ok=True)

    def warm() -> None:
        records = RecordCache.load(cache)
        sweep_status(plan, queue=[], jobs_index=index, sweep_dir=sweep_dir, records=records)
        records.save(cache)

    def cli() -> None:
        command = [str(BIN / "ddlbench"), "status", "--configfile", str(config), "--no-queue"]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0 or f"{len(plan.points)} points" not in done.stdout:
            sys.exit(f"scheduler_load: `ddlbench status` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def planning() -> None:
        for point in expand_sweep(load_sweep_config(config)).points:
            _ = point.point_id

    actions = {
        "baseline look": lambda: baseline_status.sweep_status(plan, queue=[], jobs_index=index, sweep_dir=sweep_dir),
        "today cold look": lambda: sweep_status(plan, queue=[], jobs_index=index, sweep_dir=sweep_dir),
        "today warm look": warm,
        "status CLI warm": cli,
        "planning alone": planning,
    }
    warm()  # the cache a first `ddlbench status` leaves
    times: dict[str, list[float]] = {label: [] for label in actions}
    for _ in range(repeats):  # round by round, so that a busy spell of a shared host slows each alike
        for label, action in actions.items():
            began = time.perf_counter()
            action()
            times[label].append(time.perf_counter() - began)
    figures = {label: statistics.median(seconds) for label, seconds in times.items()}
    return figures


def main_simulated(points: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ddlbench-load-") as tmp:
        began = time.perf_counter()
        config, plan = simulated_sweep(Path(tmp), points)
        baseline = baseline_code()
        print(f"simulated sweep: {points} points, records written in {time.perf_counter() - began:.1f} s; "
              f"{RUNNING} running at once; baseline {BASELINE}")  # fmt: skip
        results = [simulate(way, code, plan, baseline=baseline) for way in ("submit", "watch")
                   for code in ("baseline", "today")]  # fmt: skip
        timings = time_status(config, plan, baseline[0], repeats)
    minutes = {"churn": CHURN_S / 60, "settling": SETTLE_S / 60, "steady": (QUIET_S - SETTLE_S) / 60}
    print(f"{'road':<16} {'code':<9} " + " ".join(f"{w + ' calls/min':>20} {w + ' fs/pt/min':>20}" for w in minutes))
    for result in results:
        cells = " ".join(
            f"{result['calls'][w] / m:>20.2f} {result['files'][w] / points / m:>20.4f}" for w, m in minutes.items()
        )
        print(f"{result['way']:<16} {result['code']:<9} {cells}")
    for way in ("submit", "watch"):
        old, new = (next(r for r in results if r["way"] == way and r["code"] == c) for c in ("baseline", "today"))
        steady = minutes["steady"]
        calls = (old["calls"]["steady"] / steady, new["calls"]["steady"] / steady)
        files = (old["files"]["steady"] / points / steady, new["files"]["steady"] / points / steady)
        print(
            f"{way}: steady state {calls[1]:.2f} scheduler calls/min (baseline {calls[0]:.2f}; target <= 2), "
            f"{files[1]:.4f} fs ops per point per minute (baseline {files[0]:.4f}; target <= 1; "
            f"{files[0] / max(files[1], 1e-9):.0f}x fewer)"
        )
    print(f"status of {points} points, median of {repeats} run(s), seconds:")
    for label, seconds in timings.items():
        print(f"  {label:<16} {seconds:8.3f} s")
    print(
        f"  today's look / baseline's: cold {timings['today cold look'] / timings['baseline look']:.2f}, "
        f"warm {timings['today warm look'] / timings['baseline look']:.2f} (target: a look under 1 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200, help="cluster mode: points of each sweep (200)")
    parser.add_argument("--simulate", type=int, metavar="N", help="no cluster: a simulated sweep of N points")
    parser.add_argument("--repeats", type=int, default=3, help="with --simulate: runs of each status timing (3)")
    parser.add_argument("--no-baseline", action="store_true", help="cluster mode: today's code only")
    args = parser.parse_args()
    if args.simulate is not None:
        main_simulated(args.simulate, args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="ddlbench-load-") as tmp:
        folder = Path(tmp)
        log = folder / "calls.log"
        make_shims(folder / "shims", log)
        runs = []
        codes = ["today"] if args.no_baseline else ["today", "baseline"]
        for code in codes:
            root = REPO if code == "today" else baseline_tree(folder / "baseline-tree")
            runs += cluster_roads(code, root, folder / code, log, args.points)
    subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False, capture_output=True)
    print(f"scheduler calls for a {args.points}-point sweep (login node; calls from inside jobs in brackets); "
          f"baseline: {BASELINE}")  # fmt: skip
    print(f"{'way':<46} {'wall s':>7} " + " ".join(f"{c:>13}" for c in COMMANDS))
    for result in runs:
        cells = " ".join(f"{result['login'][c]:>6} [{result['jobs'][c]:>4}]" for c in COMMANDS)
        print(f"{result['label']:<46} {result['wall_s']:>7.1f} {cells}")
    for result in runs:
        per_point = {c: round(result["login"][c] / args.points, 2) for c in ("sbatch", "squeue", "sacct")}
        print(f"{result['label']}: per point on the login node {per_point}; records {result['records']}")
    for result in runs:
        print(f"{result['label']}: inside the jobs {dict(sorted(result['in_jobs'].items()))}")
    for result in runs:
        minutes = result["wall_s"] / 60
        login = result["login"]
        status = (login["squeue"] + login["sacct"]) / args.points / minutes
        every = sum(login.values()) / args.points / minutes
        print(
            f"{result['label']}: {status:.4f} status queries and {every:.4f} scheduler calls per point per minute "
            f"({args.points} points in {minutes:.1f} min; target <= 0.05); "
            f"{sum(login.values()) / minutes:.2f} login-node scheduler calls a minute for the whole sweep"
        )


def baseline_tree(folder: Path) -> Path:
    """BASELINE's code, checked out (git worktree, detached) into `folder`: its package goes first on
    PYTHONPATH and its Snakefile is run, with today's venv."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(folder), BASELINE],
                   check=True, capture_output=True)  # fmt: skip
    return folder


def cluster_roads(code: str, root: Path, folder: Path, log: Path, points: int) -> list[dict]:
    """The two roads over a `points`-point sweep each, with the code at `root` (REPO, or BASELINE's tree)."""
    folder.mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{log.parent / 'shims'}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(folder / "xdg"),
        # each code's own results database: a database today's code has upgraded is refused by the baseline's
        # (an inherited DDLBENCH_HISTORY, as under pytest, would be shared by both)
        "DDLBENCH_HISTORY": str(folder / "history.sqlite"),
    }
    if root != REPO:  # the jobs inherit it (sbatch exports the environment)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    subprocess.run(
        [BIN / "ddlbench", "profile", "slurm", "--partition", "cpu", "--mem-per-rank-mb", "600",
         "--time-margin-s", "60", "--no-exclusive"],
        env=env, check=True, capture_output=True, cwd=root,
    )  # fmt: skip
    return [
        run(
            f"snakemake --profile slurm ({code})",
            [str(BIN / "snakemake"), "--profile", "slurm", "--configfile", str(sweep_file(folder, "smk", points))],
            env,
            log,
            folder / "results" / "smk",
            cwd=root,
        ),
        run(
            f"ddlbench submit (submitit arrays) ({code})",
            [str(BIN / "ddlbench"), "submit", "--configfile", str(sweep_file(folder, "sub", points))],
            env,
            log,
            folder / "results" / "sub",
            cwd=root,
        ),
    ]


if __name__ == "__main__":
    main()
