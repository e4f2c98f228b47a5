"""Inside a packed allocation: run its points as job steps on nodes of their own (`ddlbench run-packed`).

The batch script of a packed job (ddlbench.launch.packed) execs this dispatcher on the allocation's
first node. It carries out the packing's rule (ddlbench.launch.packing) with the points' real ends:
whenever nodes free up, the first waiting points in the plan's order that fit them start, each as
`ddlbench run-point --launcher srun` with $DDLBENCH_STEP_NODES naming its nodes, so that its ranks are
one `srun --exclusive` step there and its record is a per-point record plus the job and step ids.

- A point that fails, times out or is killed (`scancel JOB.STEP`) ends its own step; its runner writes
  its record (failed, timeout) and the others go on.
- A point starts only while its limit (timeout) still fits before the allocation's end, so SLURM's time
  limit does not cut it; the points that do not fit stay unrun, with no record.
- When the allocation ends early (scancel, the time limit, preemption), SLURM signals every process:
  the runners of the points in flight stop without a record (ddlbench.launch.runner.Interrupted), the
  points never started have none either, so `ddlbench rerun --status missing`, `ddlbench submit` or
  Snakemake runs exactly those again.

What ran where and when is written, after every start and end, to the allocation's summary
(`<sweep>/packed/allocation-<job>.json`): each point's step nodes, span and exit code, and the
allocation's busy and idle node-seconds as measured.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.claims import allocation_hosts
from ddlbench.launch.launchers import STEP_NODES_VAR, STEP_PORT_VAR
from ddlbench.launch.rendezvous import step_port

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(kw_only=True)
class Entry:
    """One point of the plan file, as the dispatcher runs it."""

    point_id: str
    spec: str  # the point as JSON (run-point --spec)
    out: str  # its record
    log: str  # its runner's output
    nodes: int
    node: str  # "" or the node it is pinned to
    limit_s: float  # the longest it may run, launch included
    steps: dict[str, Any] = field(default_factory=dict)  # what happened: filled as it runs


def read_plan(path: Path) -> dict[str, Any]:
    try:
        plan = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DdlbenchError(f"cannot read the packed plan {path}: {exc}") from None
    missing = {"sweep_dir", "time_limit_s", "margin_s", "points"} - set(plan)
    if missing:
        raise DdlbenchError(f"packed plan {path} lacks {', '.join(sorted(missing))}")
    return plan


def run_allocation(plan_path: Path, *, environ: dict[str, str] | None = None, poll_s: float = POLL_S) -> int:
    """Run the plan's points in this allocation; 0 when every point started, 3 when some could not."""
    environ = dict(os.environ if environ is None else environ)
    began_wall, began = time.time(), time.monotonic()
    plan = read_plan(plan_path)
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise DdlbenchError("run-packed runs inside a SLURM allocation: SLURM_JOB_ID is not set")
    hosts = allocation_hosts(environ)
    entries = [Entry(**point) for point in plan["points"]]
    missing = sorted({e.node for e in entries if e.node} - set(hosts))
    if missing:
        raise DdlbenchError(f"points pinned to {', '.join(missing)}: not in this allocation ({','.join(hosts)})")
    deadline = began + float(plan["time_limit_s"]) - float(plan["margin_s"])
    summary_path = Path(plan["sweep_dir"]) / "packed" / f"allocation-{job_id}.json"
    stopping = {"signal": None}

    def stop(signum, _frame):
        stopping["signal"] = signum

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    free = list(hosts)
    waiting = list(entries)
    running: dict[subprocess.Popen, Entry] = {}
    sequence = 0
    unrun: list[Entry] = []

    def write_summary(state: str) -> None:
        _write_summary(
            summary_path,
            job_id=job_id,
            hosts=hosts,
            began_wall=began_wall,
            began=began,
            entries=entries,
            unrun=unrun,
            state=state,
        )

    changed = True  # the summary is written when a point starts or ends, not every poll
    while True:
        if stopping["signal"] is not None:
            break
        now = time.monotonic()
        for entry in list(waiting):
            if plan.get("serial") and running:
                break  # one point at a time: the plan's nodes share what the points measure
            if now + entry.limit_s > deadline:
                waiting.remove(entry)  # later starts end later still
                unrun.append(entry)
                log.warning("point %s not started: its limit of %.0f s no longer fits", entry.point_id, entry.limit_s)
                continue
            if entry.node:
                if entry.node not in free:
                    continue
                taken = [entry.node]
            else:
                if entry.nodes > len(free):
                    continue
                taken = free[: entry.nodes]
            for host in taken:
                free.remove(host)
            waiting.remove(entry)
            running[_start(entry, taken, job_id, sequence, environ, began)] = entry
            sequence += 1
            changed = True
        if changed and (running or waiting):
            write_summary("running")
            changed = False
        if not running:
            break
        time.sleep(poll_s)
        for process, entry in list(running.items()):
            code = process.poll()
            if code is None:
                continue
            del running[process]
            changed = True
            entry.steps.update(end_s=round(time.monotonic() - began, 3), returncode=code)
            free.extend(entry.steps["nodes"])
            free.sort(key=hosts.index)
            log.info("point %s ended (exit %d) on %s", entry.point_id, code, ",".join(entry.steps["nodes"]))
    if stopping["signal"] is not None:
        log.warning(
            "allocation stopping (signal %d): %d point(s) in flight, %d not started",
            stopping["signal"],
            len(running),
            len(waiting),
        )
        for process in running:
            _signal_group(process, signal.SIGTERM)
        for process, entry in running.items():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
            entry.steps.update(end_s=round(time.monotonic() - began, 3), returncode=process.poll(), stopped=True)
        unrun.extend(waiting)
        write_summary("stopped")
        return 128 + stopping["signal"]
    unrun.extend(waiting)
    write_summary("done")
    return 3 if unrun else 0


def _start(entry: Entry, nodes: list[str], job_id: str, sequence: int, environ: dict[str, str], began: float):
    Path(entry.log).parent.mkdir(parents=True, exist_ok=True)
    env = {**environ, STEP_NODES_VAR: ",".join(nodes), STEP_PORT_VAR: str(step_port(job_id, sequence))}
    command = [sys.executable, "-m", "ddlbench", "run-point", "--launcher", "srun"]
    command += ["--spec", entry.spec, "--out", entry.out]
    with open(entry.log, "w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    entry.steps = {"nodes": nodes, "start_s": round(time.monotonic() - began, 3)}
    log.info("point %s started on %s", entry.point_id, ",".join(nodes))
    return process


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _write_summary(
    path: Path,
    *,
    job_id: str,
    hosts: list[str],
    began_wall: float,
    began: float,
    entries: list[Entry],
    unrun: list[Entry],
    state: str,
) -> None:
    """The allocation as it ran so far: busy node-seconds = Σ step nodes × (end − start) of the points,
    allocated = nodes × seconds since the dispatcher started (the batch script's start-up before it is
    not counted)."""
    elapsed = time.monotonic() - began
    points = []
    busy = 0.0
    for entry in entries:
        if not entry.steps:
            continue
        end = entry.steps.get("end_s", elapsed)
        busy += len(entry.steps["nodes"]) * (end - entry.steps["start_s"])
        points.append({"point_id": entry.point_id, **entry.steps})
    allocated = len(hosts) * elapsed
    summary = {
        "job_id": job_id,
        "state": state,
        "nodes": hosts,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began_wall)),
        "elapsed_s": round(elapsed, 3),
        "allocated_node_s": round(allocated, 3),
        "busy_node_s": round(busy, 3),
        "idle_share": round(1 - busy / allocated, 4) if allocated > 0 else None,
        "points": points,
        "not_started": [entry.point_id for entry in unrun],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(summary, indent=1) + "\n")
