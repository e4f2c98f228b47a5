"""On SLURM: `ddlbench profile slurm` (the Snakemake profile and the site's settings), `ddlbench submit`
(a sweep's points as SLURM jobs through submitit, without Snakemake) and `ddlbench rerun` (the points
whose records say they failed).

None of these commands needs torch on the login node (tests/test_login_no_torch.py runs them with torch
unimportable): the predicted times of the progress line and of packing, and the predictions made when the
sweep is finished, read the model tables shipped with the package (every model and dataset at default
options) or left in the sweep's folder by its points (ddlbench.analysis.analytic.table_cache). Torch is
imported only to build a table found in neither, where it can be; where it cannot, those predictions are
left out and say why. The ranks import torch, on the compute nodes (or here, for `rerun --local`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from ddlbench.cli.common import add_sweep_options, read_sweep
from ddlbench.errors import DdlbenchError

SECTION = "On SLURM"
# `unrun`: points a packed allocation ended before they ran (status timeout, ddlbench.launch.allocation.left_unrun)
RERUN_STATUSES = ("failed", "oom", "timeout", "missing", "unrun")


def add_commands(commands: Any) -> None:
    profile = commands.add_parser(
        "profile",
        section=SECTION,
        summary="write the Snakemake profile `slurm` and the site's settings",
        description="Write the Snakemake profile named slurm (what `snakemake --profile slurm` and "
        "`ddlbench certify --profile slurm` run with) and the site file beside it: partition, account, "
        "memory and time margins that every SLURM job of a sweep gets. The queue limit of the profile stays "
        "under the user's submit limits, as SLURM reports them now.",
        example="ddlbench profile slurm --partition gpu --account myproject --gpus-per-rank 1",
    )
    profile.add_argument("kind", choices=("slurm",), help="the scheduler (only slurm)")
    _add_site_options(profile)
    profile.add_argument("--jobs", type=int, default=100, help="most jobs in the queue at once (default 100)")
    profile.add_argument(
        "--status-wait",
        type=int,
        default=20,
        help="seconds between status checks after a job ends (growing +10 s while none does; plugin default: 40)",
    )
    profile.add_argument(
        "--status-command",
        choices=("sacct", "squeue"),
        default="squeue",
        help="how job states are read (default squeue: the plugin misreads sacct's 'CANCELLED by UID')",
    )
    profile.add_argument("--dest", type=Path, help="profile folder (default: $XDG_CONFIG_HOME/snakemake/slurm)")
    profile.add_argument("--force", action="store_true", help="replace a profile ddlbench did not write")
    profile.set_defaults(handler=_profile)

    submit = commands.add_parser(
        "submit",
        section=SECTION,
        summary="submit a sweep's points to SLURM with submitit, wait, report",
        description="Submit the points of a sweep that have no record yet as SLURM jobs (job arrays through "
        "submitit, within the user's limits), wait for them, then aggregate and render the report: a sweep on "
        "SLURM without Snakemake. With --pack, the points run as job steps inside a few allocations instead.",
        example=[
            "ddlbench submit --configfile sweep.yaml",
            "ddlbench submit --configfile sweep.yaml --pack auto --no-wait",
        ],
    )
    add_sweep_options(submit)
    _add_submission_options(submit)
    submit.add_argument("--all", action="store_true", help="also points that already have a record")
    submit.add_argument(
        "--pack",
        metavar="N",
        help="run the points as job steps inside allocations of N nodes (auto: the widest point's; all: as many "
        "as the points are pinned to), within your limits, not as a job each; `ddlbench plan --pack N` shows "
        "the packing first",
    )
    submit.set_defaults(handler=lambda args: _submit(args, read_sweep(args)))

    rerun = commands.add_parser(
        "rerun",
        section=SECTION,
        summary="run again the points whose records have the given statuses",
        description="Run again the points of a sweep whose records say failed, oom or timeout (or that have no "
        "record: missing; that a packed allocation ended before they ran: unrun), on SLURM or here with "
        "--local, with more memory or time if asked; each earlier "
        "record is kept aside (points/<id>/previous/). The table and report are then made again.",
        example="ddlbench rerun --configfile sweep.yaml --status oom,timeout --mem-factor 2",
    )
    add_sweep_options(rerun)
    rerun.add_argument(
        "--status",
        default="failed,oom,timeout",
        help=f"comma-separated statuses to rerun, of: {', '.join(RERUN_STATUSES)} (default failed,oom,timeout)",
    )
    _add_submission_options(rerun)
    rerun.add_argument("--mem-factor", type=float, default=1.0, help="multiply each point's memory request")
    rerun.add_argument("--time-factor", type=float, default=1.0, help="multiply each point's timeout and time limit")
    rerun.add_argument("--local", action="store_true", help="run the points here, one after the other, not on SLURM")
    rerun.set_defaults(handler=lambda args: _rerun(args, read_sweep(args)))


def _add_site_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partition", help="SLURM partition (required for `profile`)")
    parser.add_argument("--account", help="SLURM account to charge")
    parser.add_argument("--qos", help="SLURM quality of service")
    parser.add_argument("--constraint", help="SLURM node constraint (features)")
    parser.add_argument("--gpus-per-rank", type=int, help="GPUs per rank: 1 on GPU partitions (default 0)")
    parser.add_argument(
        "--mem-per-rank-mb",
        type=int,
        help="memory per rank in MB (default: the partition's DefMemPerGPU or DefMemPerCPU, else a node's memory "
        "shared by its ranks)",
    )
    parser.add_argument(
        "--exclusive",
        action=argparse.BooleanOptionalAction,
        help="whole nodes for every point (default: on; --no-exclusive lets points share nodes with other jobs)",
    )
    parser.add_argument("--time-margin-s", type=int, help="added to each point's timeout for its time limit (300)")
    parser.add_argument(
        "--controller-patience-s",
        type=int,
        help="how long every scheduler call keeps trying while the controller does not answer (1800)",
    )
    parser.add_argument("--require-account", action="store_true", help="refuse to submit without an account")
    parser.add_argument(
        "--gpu-bind",
        help="how the ranks' srun step binds one GPU to each task with --gpus-per-rank 1: srun's --gpu-bind "
        "(single:1 by default; closest, per_task:N, map_gpu:LIST, mask_gpu:LIST, none)",
    )
    parser.add_argument(
        "--network-env",
        action="append",
        metavar="NAME=VALUE",
        help="a network variable for every rank (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GLOO_SOCKET_IFNAME…); repeat it",
    )


def _add_submission_options(parser: argparse.ArgumentParser) -> None:
    _add_site_options(parser)
    parser.add_argument("--site", type=Path, help="site file (default: the one `ddlbench profile slurm` wrote)")
    parser.add_argument("--no-wait", action="store_true", help="submit and return; `ddlbench status` follows up")
    parser.add_argument("--max-requeues", type=int, default=2, help="requeues after preemption or time limit (2)")


SITE_OPTIONS = (
    "partition",
    "account",
    "qos",
    "constraint",
    "gpus_per_rank",
    "mem_per_rank_mb",
    "time_margin_s",
    "exclusive",
    "controller_patience_s",
    "gpu_bind",
)


def _site_overrides(args: argparse.Namespace) -> dict:
    given = {key: getattr(args, key) for key in SITE_OPTIONS if getattr(args, key) is not None}
    if args.require_account:
        given["require_account"] = True
    if args.network_env:
        pairs = [item.partition("=") for item in args.network_env]
        bad = [name for name, sign, _ in pairs if not sign or not name]
        if bad:
            raise DdlbenchError(f"--network-env {bad[0]!r}: give NAME=VALUE, e.g. NCCL_SOCKET_IFNAME=ib0")
        given["network_env"] = {name: value for name, _, value in pairs}
    return given


def _site(args: argparse.Namespace):
    from dataclasses import replace

    from ddlbench.launch.profile import load_default_site
    from ddlbench.launch.resources import load_site, site_from_mapping

    overrides = _site_overrides(args)
    if args.site:
        base = load_site(args.site)
    elif "partition" in overrides:
        return site_from_mapping(overrides, source="the command line")
    else:
        base = load_default_site()
    if "network_env" in overrides:  # added to the site's, name by name
        overrides["network_env"] = {**base.network_env, **overrides["network_env"]}
    return site_from_mapping(replace(base, **overrides).to_dict(), source="the site file and the command line")


def _profile(args: argparse.Namespace) -> int:
    from ddlbench.launch.limits import read_limits
    from ddlbench.launch.profile import ProfileOptions, write_profile
    from ddlbench.launch.resources import site_from_mapping
    from ddlbench.launch.slurm import SlurmError, query_cluster

    site = site_from_mapping(_site_overrides(args), source="the command line")
    try:  # the profile's `jobs` stays under the user's submit limits, as read now
        limits = read_limits(query_cluster(), account=site.account, qos=site.qos, partition=site.partition)
        limit = min(limits.submit, key=lambda each: each.value, default=None)
    except SlurmError as exc:
        print(f"(SLURM's limits not read: {exc}; jobs stays {args.jobs})")
        limit = None
    options = ProfileOptions(
        jobs=args.jobs, status_wait_s=args.status_wait, status_command=args.status_command, queue_limit=limit
    )
    config = write_profile(site, options, directory=args.dest, force=args.force)
    print(f"profile: {config}")
    if limit is not None and limit.value < args.jobs:
        print(f"jobs: {limit.value}, not {args.jobs}: {limit.name} is {limit.value}")
    print("run from the repository root:  snakemake --profile slurm [--configfile SWEEP.yaml]")
    return 0


def _check_factors(args: argparse.Namespace) -> None:
    for name in ("mem_factor", "time_factor"):
        value = getattr(args, name, 1.0)
        if not value > 0:
            raise DdlbenchError(f"--{name.replace('_', '-')} {value} is not accepted; give a number > 0")
    if args.max_requeues < 0:
        raise DdlbenchError(f"--max-requeues {args.max_requeues} is not accepted; give an integer >= 0")


def _submit_and_wait(args, config, points, *, mem_factor: float = 1.0, time_factor: float = 1.0) -> int:
    import shlex

    from ddlbench.launch.admission import check_submission
    from ddlbench.launch.submission import lost_before_running, plan_resources, submit_points, wait_for
    from ddlbench.records import record_path

    site = _site(args)
    planned = plan_resources(points, site, sweep=config, mem_factor=mem_factor, time_factor=time_factor)
    check_submission(list(planned.items()), account_required=True if site.require_account else None)
    jobs = submit_points(
        points,
        planned,
        sweep_dir=config.sweep_dir,
        name=config.name,
        timeout_factor=time_factor,
        max_requeues=args.max_requeues,
    )
    for point, job in zip(points, jobs, strict=True):
        print(f"{point.point_id}\tjob {job.job_id}")
    if args.no_wait:
        return 0
    progress, states = _progress(config, points)
    wait_for(jobs, on_poll=lambda queue: progress.update(states(queue)))
    lost = lost_before_running(points, jobs, config.sweep_dir)
    if lost:  # once: a job that failed before its point ran is not the point's failure
        named = ", ".join(f"{point.point_id} ({state})" for point, state in lost)
        print(f"{len(lost)} point(s) whose job failed before the point ran, submitted once more: {named}")
        again = [point for point, _ in lost]
        kept = dict(zip((point.point_id for point in points), jobs, strict=True))
        retried = submit_points(again, planned, sweep_dir=config.sweep_dir, name=config.name,
                                timeout_factor=time_factor, max_requeues=args.max_requeues)  # fmt: skip
        for point, job in zip(again, retried, strict=True):
            print(f"{point.point_id}\tjob {job.job_id} (was {kept[point.point_id].job_id})")
        wait_for(retried, on_poll=lambda queue: progress.update(states(queue)))
    progress.close()
    code = _refresh_outputs(config)
    missing = [point.point_id for point in points if not record_path(config.sweep_dir, point.point_id).exists()]
    if missing:
        sweep = f"--configfile {shlex.quote(str(args.configfile))}" if args.configfile else "--config-json …"
        print(f"{len(missing)} point(s) have no record (their job ended before they ran): {', '.join(missing)}")
        print(f"run exactly them again with:  ddlbench rerun {sweep} --status missing")
        return 3
    return code


def _progress(config, points):
    """A progress line for `points` of the sweep (ddlbench.launch.progress), and the queue → their states."""
    from ddlbench.launch.progress import Progress, predicted_durations, sweep_states
    from ddlbench.sweep import expand_sweep

    progress = Progress(title=f"sweep {config.name!r}", predicted_s=predicted_durations(config, points))
    states = sweep_states(expand_sweep(config), sweep_dir=config.sweep_dir, only={p.point_id for p in points})
    return progress, states


def _submit(args: argparse.Namespace, config) -> int:
    from ddlbench.records import record_path
    from ddlbench.sweep import expand_sweep

    _check_factors(args)
    plan = expand_sweep(config)
    points = [p for p in plan.points if args.all or not record_path(config.sweep_dir, p.point_id).exists()]
    if not points:
        print(f"every point of sweep {config.name!r} has a record; --all submits them again")
        return _refresh_outputs(config)
    if args.pack:
        return _submit_packed(args, config, points)
    return _submit_and_wait(args, config, points)


def _submit_packed(args: argparse.Namespace, config, points) -> int:
    """The points as steps of few allocations (ddlbench.launch.packed): plan, check, submit, wait, report.
    Exits 3 when an allocation ended before some of its points ran (their records say so: status timeout,
    reason "not started: …" or "stopped: the allocation ended …") or left some without a record, naming
    them and the command that runs them again."""
    import shlex

    from ddlbench.launch.allocation import left_unrun
    from ddlbench.launch.packed import submit_packed_sweep
    from ddlbench.records import RecordError, read_record, record_path
    from ddlbench.sweep import expand_sweep

    if args.no_wait:
        submit_packed_sweep(config, points, _site(args), args.pack, wait=False)
        return 0
    progress, states = _progress(config, points)
    submit_packed_sweep(config, points, _site(args), args.pack, on_poll=lambda queue: progress.update(states(queue)))
    progress.close()
    code = _refresh_outputs(config)
    statuses: dict[str, tuple[str, bool]] = {}  # every point of the sweep: its status, and whether left unrun
    for point in expand_sweep(config).points:
        path = record_path(config.sweep_dir, point.point_id)
        try:
            record = read_record(path) if path.exists() else None
        except RecordError:
            continue
        statuses[point.point_id] = ("missing", True) if record is None else (record.status, left_unrun(record.reason))
    unrun = [point.point_id for point in points if statuses.get(point.point_id, ("", False))[1]]
    if not unrun:
        return code
    # exactly these: unrun (a record saying so) and missing (none) select no other point
    wanted = sorted({"missing" if statuses[p][0] == "missing" else "unrun" for p in unrun}, key=RERUN_STATUSES.index)
    sweep = f"--configfile {shlex.quote(str(args.configfile))}" if args.configfile else "--config-json …"
    print(f"{len(unrun)} point(s) not run: their allocation ended first, or they have no record:")
    for point_id in unrun:
        print(f"  {point_id}\t{statuses[point_id][0]}")
    print(f"run exactly them again with:  ddlbench rerun {sweep} --status {','.join(wanted)}")
    return 3


def _rerun(args: argparse.Namespace, config) -> int:
    from ddlbench.records import RecordError, read_record, record_path
    from ddlbench.sweep import expand_sweep

    _check_factors(args)
    wanted = [status.strip() for status in args.status.split(",") if status.strip()]
    unknown = [status for status in wanted if status not in RERUN_STATUSES]
    if unknown or not wanted:
        raise DdlbenchError(
            f"--status {args.status!r}: {', '.join(unknown) or 'nothing'} is not accepted; "
            f"choose from: {', '.join(RERUN_STATUSES)}"
        )
    from ddlbench.launch.allocation import left_unrun

    chosen = []
    for point in expand_sweep(config).points:
        path = record_path(config.sweep_dir, point.point_id)
        try:
            record = read_record(path) if path.exists() else None
            status = record.status if record else "missing"
            unrun = record is not None and left_unrun(record.reason)
        except RecordError:
            status, unrun = "failed", False  # an unreadable record is not a measurement
        if status in wanted or (unrun and "unrun" in wanted):
            chosen.append(point)
            if path.exists():
                _keep_previous(path)
    print(f"{len(chosen)} point(s) of sweep {config.name!r} with status {', '.join(wanted)} to run again")
    if not chosen:
        return 0
    if args.local:
        from ddlbench.launch.progress import Progress, predicted_durations
        from ddlbench.launch.runner import run_point

        states = {point.point_id: "not started" for point in chosen}
        progress = Progress(title=f"sweep {config.name!r}", predicted_s=predicted_durations(config, chosen))
        for point in chosen:
            states[point.point_id] = "running"
            progress.update(states)
            record = run_point(
                point,
                out=record_path(config.sweep_dir, point.point_id),
                launcher="local",
                timeout_s=point.timeout_s * args.time_factor,
            )
            states[point.point_id] = record.status
            progress.update(states)
        progress.close()
        for point in chosen:
            print(f"{point.point_id}: {states[point.point_id]}")
        return _refresh_outputs(config)
    return _submit_and_wait(args, config, chosen, mem_factor=args.mem_factor, time_factor=args.time_factor)


def _keep_previous(path: Path) -> Path:
    """Copy a record aside before its point runs again: nothing measured is lost."""
    folder = path.parent / "previous"
    folder.mkdir(exist_ok=True)
    number = len(list(folder.glob("record-*.json"))) + 1
    kept = folder / f"record-{number}.json"
    shutil.copy2(path, kept)
    return kept


def _refresh_outputs(config) -> int:
    """Finish the sweep from its records, as every road does (ddlbench.finish)."""
    from ddlbench.finish import finish_sweep

    finished = finish_sweep(config)
    for note in finished.notes:
        print(note)
    print(finished.summary())
    return 0
