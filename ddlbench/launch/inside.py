"""A sweep's points packed into the allocation this runs in (`ddlbench run-packed --configfile S` inside
`salloc`/`sbatch`; Snakemake with DDLBENCH_PACK=1 calls it, workflow/rules/points.smk).

One engine runs packed points, whoever asks: the dispatcher of ddlbench.launch.allocation, on a plan of
ddlbench.launch.packing. `submit --pack` plans allocations on the login node and asks SLURM for them;
here the allocation is held already, so its points are planned in it, by the same rule:

- the points of the sweep without a record, as `submit --pack` takes them (ddlbench.launch.packed.tasks_for:
  limit = timeout + launch allowance; expected times from the sweep's machine file where it has one);
- packed on the allocation's nodes (ddlbench.launch.packing.pack_into: widest first, then longest,
  greedy with backfill; a pinned point on its node) up to SLURM's end time for the job, read where the
  dispatcher reads it (SLURM_JOB_END_TIME, else `scontrol show job`), less the site's margin; the
  points that do not fit that time come last in the plan and start only where time is left, else get
  the dispatcher's "not started:" record (`ddlbench rerun --status unrun` runs them again);
- with `slurm.pinned_one_at_a_time` and a pinned point, the whole plan runs one point at a time (pinned
  and free points share this allocation's nodes);
- written as `<sweep>/packed/inside-<job>.plan.json`, in the format `submit --pack` writes
  (ddlbench.launch.packed.build_plan), and run by the same dispatcher: its records, watchdog, deadline,
  KillWait and summary `<sweep>/packed/allocation-<job>.json` are those of a packed allocation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.records import record_path

log = logging.getLogger(__name__)

PACK_VAR = "DDLBENCH_PACK"  # "1": Snakemake inside an allocation hands the sweep's points to run-packed
INSIDE = "inside"  # <sweep>/packed/inside-<digest>.json: what one Snakemake run's run-packed ran
_RUN_NAME = re.compile(rf"{INSIDE}-[0-9a-f]{{12}}\.json")


def packing_enabled(environ: Mapping[str, str]) -> bool:
    """Whether Snakemake runs inside an allocation whose points the dispatcher is to pack."""
    return environ.get(PACK_VAR) == "1" and bool(environ.get("SLURM_JOB_ID"))


def run_inside(
    config: Any,
    *,
    margin_s: float,
    out: Path | None = None,
    environ: Mapping[str, str] | None = None,
    **dispatch: Any,
) -> int:
    """Plan the sweep's points without a record into this allocation and run them with the dispatcher;
    its exit status (0, 3 when some point was left unrun, 128 + a signal's number). `out`: a copy of the
    dispatcher's summary (a file for Snakemake to wait on). `dispatch`: ddlbench.launch.allocation.run_allocation's
    options (a runner command, poll and watchdog times)."""
    from ddlbench.launch.allocation import allocation_end, describe_allocation, run_allocation
    from ddlbench.launch.packed import PACKED_DIR, build_plan, describe, expected_times, tasks_for
    from ddlbench.launch.packing import Packing, pack_into
    from ddlbench.launch.slurm import allocation_hosts
    from ddlbench.launch.submission import remember_jobs
    from ddlbench.sweep import expand_sweep

    environ = dict(os.environ if environ is None else environ)
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise DdlbenchError(
            "run-packed --configfile runs inside a SLURM allocation (salloc, sbatch): SLURM_JOB_ID is not set; "
            "from a login node, `ddlbench submit --pack N` asks SLURM for allocations"
        )
    sweep_dir = Path(config.sweep_dir).resolve()
    points = [point for point in expand_sweep(config).points if not record_path(sweep_dir, point.point_id).exists()]
    if not points:
        log.info("every point of sweep %r has a record: nothing to run", config.name)
        if out is not None:
            write_text_atomic(out, json.dumps({"job_id": job_id, "state": "done", "points": []}, indent=1) + "\n")
        return 0
    hosts = allocation_hosts(environ)
    described = describe_allocation(job_id, environ)
    now = time.time()
    end_wall, source = allocation_end(environ, described[1], fallback=math.inf)
    budget = None if math.isinf(end_wall) else end_wall - now - margin_s
    expected, expected_from = expected_times(points, config.machine_path, sweep_dir=sweep_dir)
    tasks = tasks_for(points, expected_s=expected)
    serial = bool(config.slurm_pinned_one_at_a_time) and any(task.node for task in tasks)
    allocation, deferred = pack_into(tasks, hosts, max_time_s=budget, serial=serial)
    packing = Packing(nodes=len(hosts), max_time_s=budget, allocations=(allocation,))
    for line in [*describe(packing), expected_from]:
        log.info("%s", line)
    if budget is None:  # no end known: every point may start; the plan's limit only for the dispatcher's fallback
        time_limit_s = math.ceil(allocation.worst.makespan_s + margin_s)
    else:
        time_limit_s = max(math.floor(end_wall - now), 0)
        log.info(
            "the allocation ends in %d s (from %s); %d point(s) may not fit it", time_limit_s, source, len(deferred)
        )
    plan = build_plan(
        [*allocation.order, *deferred],
        {point.point_id: point for point in points},
        sweep_dir=sweep_dir,
        serial=serial,
        time_limit_s=time_limit_s,
        margin_s=margin_s,
        kill_wait_s=kill_wait_s(),
    )
    plan_path = sweep_dir / PACKED_DIR / f"{INSIDE}-{job_id}.plan.json"
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan_path, json.dumps(plan, indent=1) + "\n")
    remember_jobs(sweep_dir, {point.point_id: job_id for point in points})  # `ddlbench status` finds them
    code = run_allocation(plan_path, environ=environ, described=described, **dispatch)
    if out is not None:
        summary = sweep_dir / PACKED_DIR / f"allocation-{job_id}.json"
        write_text_atomic(out, summary.read_text())
    return code


def site_margin_s() -> float:
    """The site's time margin (the site file `ddlbench profile slurm` wrote), else its default."""
    from dataclasses import fields

    from ddlbench.launch.profile import default_site_file
    from ddlbench.launch.resources import Site, load_site

    path = default_site_file()
    if path.exists():
        return float(load_site(path).time_margin_s)
    return float(next(field.default for field in fields(Site) if field.name == "time_margin_s"))


def pass_on_profile_site() -> None:
    """Inside an allocation the user holds, the runners' launchers bind GPUs and set the network variables
    as the profile's site file says (ddlbench.launch.placement), unless settings were passed on already;
    an allocation that holds no GPU gets no GPU options, whatever the site's gpus_per_rank."""
    from dataclasses import replace

    from ddlbench.launch.placement import LAUNCH_VAR, pass_on
    from ddlbench.launch.profile import default_site_file
    from ddlbench.launch.resources import load_site
    from ddlbench.launch.slurm import current_allocation

    path = default_site_file()
    if os.environ.get(LAUNCH_VAR) or not path.exists():
        return
    site = load_site(path)
    if site.gpus_per_rank:
        job = current_allocation(os.environ)
        if job is not None and not job.num_gpus:
            log.info("allocation %s holds no GPU: its points' steps bind none", job.job_id)
            site = replace(site, gpus_per_rank=0)
    pass_on(site)


def kill_wait_s() -> float:
    """The cluster's KillWait (one `scontrol show config`; the dispatcher's default where it does not say)."""
    from ddlbench.launch.allocation import DEFAULT_KILL_WAIT_S
    from ddlbench.launch.slurm import SlurmError, parse_config, run_slurm

    try:
        text = parse_config(run_slurm(["scontrol", "show", "config"])).get("KillWait", "")
    except SlurmError as exc:
        log.warning("cannot read KillWait (%s); assuming %g s", exc, DEFAULT_KILL_WAIT_S)
        return DEFAULT_KILL_WAIT_S
    number = text.split(" ")[0]
    return float(number) if number.isdigit() else DEFAULT_KILL_WAIT_S


@dataclass(frozen=True, kw_only=True)
class InsideTargets:
    """What the Snakefile names in an allocation with DDLBENCH_PACK=1 (workflow/rules/common.smk)."""

    output: str | None  # this run's run-packed output; None when every point has a record
    log: str | None  # its log
    runs: tuple[str, ...]  # every run's output, this one's included: what the report waits on


def inside_targets(sweep_dir: Path, point_ids: Iterable[str]) -> InsideTargets:
    """The output `<sweep>/packed/inside-<digest>.json` of this Snakemake run's `run-packed`: a short
    sha256 of the points without a record and of the earlier runs' outputs, so that a new name comes
    whenever a point is missing (a record deleted again after an earlier run names a new file too), and
    none when none is. The records are no job's outputs (Snakemake would delete a failed job's, and with
    them measured records); the report waits on every run's output instead, the same files from one run to
    the next while nothing is missing, so that a second run has nothing to do."""
    folder = Path(sweep_dir) / "packed"
    earlier = sorted(path.name for path in folder.glob(f"{INSIDE}-*.json") if _RUN_NAME.fullmatch(path.name))
    missing = sorted(point_id for point_id in point_ids if not record_path(sweep_dir, point_id).exists())
    runs = [str(folder / name) for name in earlier]
    if not missing:
        return InsideTargets(output=None, log=None, runs=tuple(runs))
    digest = hashlib.sha256("\n".join([*missing, "", *earlier]).encode()).hexdigest()[:12]
    output = str(folder / f"{INSIDE}-{digest}.json")
    log_path = str(Path(sweep_dir) / "logs" / "run_inside_allocation" / f"{INSIDE}-{digest}.log")
    return InsideTargets(output=output, log=log_path, runs=(*runs, output))
