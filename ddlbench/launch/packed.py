"""A sweep in few allocations (`ddlbench submit --pack N`, `ddlbench plan --pack N`): the login node's side.

The points are packed (ddlbench.launch.packing) into allocations of N nodes; each allocation is one
sbatch of a job script written into the sweep's `packed/` folder, whose only command execs the
dispatcher (`ddlbench run-packed`, ddlbench.launch.allocation) on the plan written beside it.

What each allocation asks of SLURM: N nodes (and the pinned points' nodes by name), as many CPUs, GPUs
and as much memory per node as its largest point's (ddlbench.launch.resources, as for a point on its
own), whole nodes unless the site says otherwise (then memory for every runner that may run at once on
the first node is added), and a time limit of the packing's worst case (every point at its timeout plus
LAUNCH_ALLOWANCE_S) plus DISPATCH_SLACK_S and the site's margin, in whole minutes. Torch-free.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlbench.analysis.analytic.foresight import EXPECTED_LAUNCH_S, expected_seconds
from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.packing import Allocation, Packing, Task, pack
from ddlbench.launch.resources import LAUNCHER_MEM_MB, Resources, Site
from ddlbench.launch.slurm import SlurmError
from ddlbench.point import Point
from ddlbench.records import record_path

log = logging.getLogger(__name__)

# a point's runner beyond its timeout: interpreter start, the step's start, judging and writing the record
LAUNCH_ALLOWANCE_S = 30
# from the allocation's start to the dispatcher's first start of a point: the batch script, the interpreter,
# reading the plan and the node list (1–2 s on the test cluster; a slow shared filesystem takes longer)
DISPATCH_SLACK_S = 60
PACKED_DIR = "packed"
# what may stand in an #SBATCH line: a value with a space, quote or newline would change the script
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,:+=@%/\[\]|&*!-]+")


def tasks_for(points: Sequence[Point], *, expected_s: Mapping[str, float] | None = None) -> list[Task]:
    """Each point's limit (timeout plus the runner's allowance) and expected time
    (`expected_s` where given, e.g. predicted from a machine file; else its limit)."""
    expected_s = expected_s or {}
    tasks = []
    for point in points:
        limit = point.timeout_s + LAUNCH_ALLOWANCE_S
        tasks.append(
            Task(
                key=point.point_id,
                nodes=point.nodes,
                limit_s=limit,
                expected_s=min(limit, expected_s.get(point.point_id, limit)),
                node=point.node,
            )
        )
    return tasks


# a point's time outside its steps when predicted: interpreter, torch, the step's start, the process group,
# the record. 3.3 s measured for a local launch on a 2-core host (docs/empirical.md, the sampling loop's
# o_L); srun's step start and a shared filesystem add to it. An assumption, printed with every plan.


def expected_times(
    points: Sequence[Point], machine_file: Path | None, *, sweep_dir: Path | None = None
) -> tuple[dict[str, float], str]:
    """Each point's expected time from a machine file (ddlbench.analysis.analytic: (warm-up + steps) ×
    the predicted step time + EXPECTED_LAUNCH_S), and a line saying where the expected times come from.
    The model tables are the shipped ones, else those the sweep's points left in `sweep_dir`
    (ddlbench.analysis.analytic.table_cache): no torch on the login node."""
    if machine_file is None or not machine_file.exists():
        return {}, "expected times: none predicted (no machine file): every point at its limit"
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict_all, sweep_tables

    try:
        predictions = predict_all(
            [Setting.of_point(p) for p in points], MachineModel.from_file(machine_file), tables=sweep_tables(sweep_dir)
        )
    except DdlbenchError as exc:
        return {}, f"expected times: not predicted ({exc}): every point at its limit"
    times = {
        point.point_id: expected_seconds(point, prediction.step_time_s)
        for point, prediction in zip(points, predictions, strict=True)
    }
    return times, (
        f"expected times: predicted on {machine_file} as (warm-up + steps + 2 × replay steps) × step time + "
        f"{EXPECTED_LAUNCH_S:g} s "
        "of launch (assumed), at most the point's limit"
    )


def pack_width(points: Sequence[Point], pack_arg: str) -> int:
    """--pack N; `auto`: the sweep's widest point (per-node certification: its nodes chunk by chunk,
    each allocation as wide as the widest point, so none waits for the whole partition to drain);
    `all`: as many nodes as the points are pinned to, if more (the whole partition in one allocation)."""
    widest = max((point.nodes for point in points), default=1)
    if pack_arg == "auto":
        return widest
    if pack_arg == "all":
        return max(widest, len({point.node for point in points if point.node}))
    try:
        width = int(pack_arg)
    except ValueError:
        raise DdlbenchError(f"--pack {pack_arg!r} is not accepted; give a number of nodes >= 1, auto or all") from None
    if width < 1:
        raise DdlbenchError(f"--pack {width} is not accepted; give a number of nodes >= 1, auto or all")
    return width


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """How wide and how long the allocations may be under the user's limits, and why."""

    width: int
    max_time_s: float | None
    notes: tuple[str, ...] = ()


def packing_bounds(
    points: Sequence[Point], planned: Mapping[str, Resources], site: Site, pack_arg: str, *, limits: Any, partition: Any
) -> Bounds:
    """--pack's width and the allocations' longest time, under what the user may hold
    (ddlbench.launch.admission.caps): the partition's MaxNodes and MaxTime, the QOS' and association's
    MaxWall and per-job TRES. A width over the cap is lowered to it, saying which limit set it."""
    from ddlbench.launch.admission import caps

    members = list(planned.values())
    exclusive = any(r.exclusive for r in members)
    cap = caps(
        limits,
        partition,
        cpus_per_node=max(r.cpus_per_node for r in members),
        gpus_per_node=max(r.gpus_per_node for r in members),
        mem_per_node_mb=None if exclusive else max(r.mem_per_node_mb for r in members),
    )
    width = pack_width(points, pack_arg)
    notes = []
    if cap.nodes is not None and width > cap.nodes:
        notes.append(f"allocations of {cap.nodes} node(s), not {width}: {cap.nodes_by} allows no more to one job")
        width = max(cap.nodes, 1)
    budget = None
    if cap.time_min is not None:
        budget = cap.time_min * 60 - site.time_margin_s - DISPATCH_SLACK_S
        notes.append(f"each allocation at most {cap.time_min} min ({cap.time_by})")
    return Bounds(width=width, max_time_s=budget, notes=tuple(notes))


@dataclass(frozen=True, kw_only=True)
class Request:
    """What one allocation asks of sbatch."""

    options: tuple[tuple[str, str], ...]  # (option, value) pairs; value "" for a flag
    time_limit_s: int
    margin_s: int

    def lines(self) -> list[str]:
        return [f"#SBATCH --{key}={value}" if value else f"#SBATCH --{key}" for key, value in self.options]


def request_for(allocation: Allocation, planned: Mapping[str, Resources], site: Site, *, name: str) -> Request:
    members = [planned[task.key] for task in allocation.order]
    first = members[0]
    partitions = {r.partition for r in members}
    if len(partitions) > 1:
        raise DdlbenchError(f"packed points must share one partition; these use {', '.join(sorted(partitions))}")
    margin = site.time_margin_s
    # SLURM's limit is whole minutes; the dispatcher starts a point only while it fits before limit − margin
    time_limit_s = 60 * math.ceil((allocation.worst.makespan_s + DISPATCH_SLACK_S + margin) / 60)
    options: list[tuple[str, str]] = [
        ("job-name", name),
        ("partition", first.partition),
        ("nodes", str(allocation.nodes)),
        ("ntasks-per-node", "1"),
        ("cpus-per-task", str(max(r.cpus_per_node for r in members))),
        ("time", _minutes(time_limit_s)),  # whole minutes already
        ("signal", f"B:TERM@{first.signal_delay_s}"),
    ]
    if first.exclusive:
        options += [("exclusive", ""), ("mem", "0")]  # whole nodes, all their memory
    else:
        runners = max(_concurrent(allocation) - 1, 0)
        options.append(("mem", f"{max(r.mem_per_node_mb for r in members) + runners * LAUNCHER_MEM_MB}M"))
    gpus = max(r.gpus_per_node for r in members)
    if gpus:
        options.append(("gres", f"gpu:{gpus}"))
    if allocation.named:
        options.append(("nodelist", ",".join(allocation.named)))
    for key, value in (("account", first.account), ("qos", first.qos), ("constraint", first.constraint)):
        if value:
            options.append((key, value))
    for key, value in options:
        if value and not _SAFE_VALUE.fullmatch(value):
            raise DdlbenchError(f"SLURM {key} {value!r} cannot go into a job script: use letters, digits and _.,:+=-")
    return Request(options=tuple(options), time_limit_s=time_limit_s, margin_s=margin)


def _concurrent(allocation: Allocation) -> int:
    """The most points the plan runs at once in the allocation."""
    events = sorted(
        [(p.start_s, 1) for p in allocation.worst.placements] + [(p.end_s, -1) for p in allocation.worst.placements],
        key=lambda e: (e[0], e[1]),
    )
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


def _minutes(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def build_plan(
    order: Sequence[Task],
    points: Mapping[str, Point],
    *,
    sweep_dir: Path,
    serial: bool,
    time_limit_s: float,
    margin_s: float,
    kill_wait_s: float,
) -> dict[str, Any]:
    """What the dispatcher (`ddlbench run-packed --plan`, ddlbench.launch.allocation) runs: the points in
    `order`, each with its record and log paths and its limit, and the allocation's time limit (counted
    from the dispatcher's start where SLURM's end time is not known), margin and KillWait."""
    sweep_dir = sweep_dir.resolve()
    return {
        "sweep_dir": str(sweep_dir),
        "time_limit_s": time_limit_s,
        "margin_s": margin_s,
        "serial": serial,
        "kill_wait_s": kill_wait_s,
        "points": [
            {
                "point_id": task.key,
                "spec": points[task.key].to_json(),
                "out": str(record_path(sweep_dir, task.key)),
                "log": str(sweep_dir / "logs" / "run_point" / f"{task.key}.log"),
                "nodes": task.nodes,
                "node": task.node,
                "limit_s": task.limit_s,
            }
            for task in order
        ],
    }


def write_allocation(
    allocation: Allocation,
    request: Request,
    points: Mapping[str, Point],
    *,
    sweep_dir: Path,
    stamp: str,
) -> Path:
    """The allocation's plan (build_plan) and job script in <sweep>/packed/; returns the script's path. The
    plan carries the cluster's KillWait: the dispatcher stops its points within it when the allocation ends."""
    from ddlbench.launch.allocation import cluster_kill_wait_s

    folder = sweep_dir.resolve() / PACKED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    base = f"{stamp}-{allocation.index}"
    plan_path = folder / f"{base}.plan.json"
    plan = build_plan(
        allocation.order,
        points,
        sweep_dir=sweep_dir,
        serial=allocation.serial,
        time_limit_s=request.time_limit_s,
        margin_s=request.margin_s,
        kill_wait_s=cluster_kill_wait_s(),
    )
    write_text_atomic(plan_path, json.dumps(plan, indent=1) + "\n")
    script = folder / f"{base}.sbatch"
    lines = [
        "#!/bin/bash",
        f"# written by `ddlbench submit --pack` at {stamp}: {len(allocation.order)} points in one allocation of "
        f"{allocation.nodes} nodes;",
        f"# planned makespan {allocation.expected.makespan_s:.0f} s expected, {allocation.worst.makespan_s:.0f} s "
        "if every point runs to its timeout",
        *request.lines(),
        f"#SBATCH --output={folder / (base + '-%j.out')}",
        "",
        f"exec {shlex.quote(sys.executable)} -m ddlbench run-packed --plan {shlex.quote(str(plan_path))}",
        "",
    ]
    if not _SAFE_VALUE.fullmatch(str(folder)):
        raise DdlbenchError(f"the sweep folder {folder} has characters an #SBATCH --output line cannot hold")
    write_text_atomic(script, "\n".join(lines))
    script.chmod(0o755)
    return script


def submit_allocations(
    packing: Packing,
    points: Sequence[Point],
    *,
    requests: Sequence[Request],
    limits: Any,
    sweep_dir: Path,
    watch: Any = None,
) -> list[tuple[Allocation, str]]:
    """Write every allocation's plan and job script, then sbatch them under the user's limits
    (ddlbench.launch.waves: as many as the room allows, the rest as earlier jobs end; a refusal for a
    limit is tried again, never a point's failure); (allocation, job id) in order. The jobs index records
    each point's allocation (ddlbench.launch.submission.remember_jobs). `requests`: each allocation's
    (request_for), `limits`: the user's (ddlbench.launch.limits.read_limits), both as checked already."""
    from ddlbench.launch.limits import is_limit_refusal
    from ddlbench.launch.submission import remember_jobs
    from ddlbench.launch.submit_once import submit_once
    from ddlbench.launch.waves import LimitRefusal, QueueWatch, submit_in_waves

    by_id = {point.point_id: point for point in points}
    stamp = time.strftime("%Y%m%dT%H%M%S")
    scripts = []
    for allocation, request in zip(packing.allocations, requests, strict=True):
        script = write_allocation(allocation, request, by_id, sweep_dir=sweep_dir, stamp=stamp)
        scripts.append((allocation, script))

    def submit(_key: object, items: list[tuple[Allocation, Path]]) -> list[str]:
        job_ids = []
        for allocation, script in items:
            try:  # tried again while the controller does not answer, never twice (submit_once)
                job_id = submit_once(["--parsable", str(script)]).strip().split(";")[0]
            except SlurmError as exc:
                message = " ".join(str(exc).split())
                if is_limit_refusal(message):  # those already in stay in: the rest wait for room
                    raise LimitRefusal(message, submitted=job_ids) from None
                raise
            remember_jobs(sweep_dir, {task.key: job_id for task in allocation.order})
            log.info("allocation %d: job %s, %d points on %d nodes", allocation.index, job_id,
                     len(allocation.order), allocation.nodes)  # fmt: skip
            job_ids.append(job_id)
        return job_ids

    watch = watch or QueueWatch()
    submitted = submit_in_waves([("packed", scripts)], submit, limits=lambda _key: limits, watch=watch)
    jobs = {allocation.index: job_id for job_id, (allocation, _) in submitted.items()}
    return [(allocation, jobs[allocation.index]) for allocation in packing.allocations]


def wait_for_allocations(job_ids: Sequence[str], *, watch: Any = None, on_poll: Any = None) -> None:
    """Until none of `job_ids` is queued or running: one squeue call per poll for all of them, at the
    interval of ddlbench.launch.waves.QueueWatch (growing while nothing ends); `on_poll` gets each poll's queue."""
    from ddlbench.launch.waves import QueueWatch, wait_for_jobs

    wait_for_jobs(job_ids, watch=watch or QueueWatch(), on_poll=on_poll)


def describe(packing: Packing) -> list[str]:
    """The packing in lines: per allocation and in total, with what each figure is."""
    lines = [
        f"{packing.points} points in {len(packing.allocations)} allocation(s) of up to {packing.nodes} node(s)"
        + (f", each at most {packing.max_time_s:.0f} s" if packing.max_time_s else "")
    ]
    lines.append(
        f"{'alloc':>5} {'nodes':>5} {'points':>6} {'limit s':>9} {'makespan s':>10} {'bound s':>9} "
        f"{'idle node-s':>11} {'idle':>6}"
    )
    for a in packing.allocations:
        idle = a.allocated_node_s - a.busy_node_s
        lines.append(
            f"{a.index:>5} {a.nodes:>5} {len(a.order):>6} {a.worst.makespan_s:>9.0f} {a.expected.makespan_s:>10.0f} "
            f"{a.lower_bound_s:>9.0f} {idle:>11.0f} {a.idle_share:>6.1%}"
        )
    idle = packing.allocated_node_s - packing.busy_node_s
    lines.append(
        f"total: predicted makespan {packing.makespan_s:.0f} s with the allocations one after another; "
        f"{idle:.0f} idle of {packing.allocated_node_s:.0f} allocated node-s ({packing.idle_share:.1%})"
    )
    lines.append(
        "limit s: every point at its timeout (+ launch allowance), which sets the time limit; makespan s, idle: "
        "every point at its expected time; bound s: max(longest point, node-s ÷ nodes), no packing ends sooner"
    )
    return lines


def submit_packed_sweep(
    config: Any, points: Sequence[Point], site: Site, pack_arg: str, *, wait: bool = True, say=print, on_poll=None
) -> list[tuple[Allocation, str]]:
    """Plan, check against the live cluster, write and submit the points' allocations; wait for them
    unless `wait` is false (`on_poll` gets each poll's queue). Each line of the plan and each job goes to `say`."""
    from ddlbench.launch.admission import check_allocations, check_submission
    from ddlbench.launch.limits import read_limits
    from ddlbench.launch.slurm import query_cluster
    from ddlbench.launch.submission import plan_resources

    planned = plan_resources(points, site, sweep=config)
    check_submission(list(planned.items()), account_required=True if site.require_account else None)
    first = next(iter(planned.values()))
    facts = query_cluster()
    partition = facts.partitions[first.partition]
    limits = read_limits(facts, account=first.account, qos=first.qos, partition=first.partition)
    bounds = packing_bounds(points, planned, site, pack_arg, limits=limits, partition=partition)
    serial = bool(getattr(config, "slurm_pinned_one_at_a_time", False))
    expected, source = expected_times(points, getattr(config, "machine_path", None), sweep_dir=config.sweep_dir)
    tasks = tasks_for(points, expected_s=expected)
    packing = pack(tasks, bounds.width, max_time_s=bounds.max_time_s, pinned_serial=serial)
    requests = [request_for(a, planned, site, name=f"ddlbench-{config.name}-packed") for a in packing.allocations]
    # each allocation as the N-node job it is, not point by point
    check_allocations(packing.allocations, requests, planned, facts=facts, limits=limits)
    for line in [*describe(packing), *bounds.notes, source]:
        say(line)
    submitted = submit_allocations(packing, points, requests=requests, limits=limits, sweep_dir=config.sweep_dir)
    for allocation, job_id in submitted:
        say(f"allocation {allocation.index}\tjob {job_id}\t{len(allocation.order)} points")
    if wait:
        wait_for_allocations([job_id for _, job_id in submitted], on_poll=on_poll)
    return submitted
