"""Run a sweep: `ddlbench plan` (its points), `ddlbench status` (how far it got) and `ddlbench report`
(finish it from its records: ddlbench.finish)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ddlbench.cli.common import add_sweep_options, print_table, read_sweep
from ddlbench.config import AXES
from ddlbench.errors import DdlbenchError

SECTION = "Run a sweep"
# `status --watch`: the longest pause between looks (as submit's wait: ddlbench.launch.waves.QueueWatch),
# and the seconds in which every record not announced by the queue is looked at once
WATCH_MAX_INTERVAL_S = 120.0
WATCH_ROUND_S = 120.0
# `status` is a look, not a wait: while the controller does not answer it tries squeue this long (the site's
# patience, 30 min by default, is for the commands that must get through) and then reports from the records
STATUS_PATIENCE_S = 20.0


def add_commands(commands: Any) -> None:
    plan = commands.add_parser(
        "plan",
        section=SECTION,
        summary="print the points of a sweep and their count",
        description="Expand a sweep into its points: one per combination of its axes and repetition, with the "
        "combinations that cannot run (and why) listed apart. Nothing runs; torch is not imported. With --pack, "
        "print instead how the points would be packed into SLURM allocations (what `ddlbench submit --pack` "
        "submits).",
        example=[
            "ddlbench plan --configfile workflow/config/default.yaml",
            "ddlbench plan --pack auto --max-time 60",
        ],
    )
    add_sweep_options(plan)
    plan.add_argument("--format", choices=("table", "ids", "json"), default="table")
    plan.add_argument("--report-path", action="store_true", help="print only the path of the sweep's report")
    plan.add_argument("--no-skipped", action="store_true", help="do not list the combinations that cannot run")
    plan.add_argument(
        "--pack", metavar="N", help="print the packing of the points into allocations of N nodes (or auto) instead"
    )
    plan.add_argument(
        "--max-time", type=float, metavar="MIN", help="with --pack: the longest an allocation may run, in minutes"
    )
    plan.set_defaults(handler=_plan)

    status = commands.add_parser(
        "status",
        section=SECTION,
        summary="done, failed (by cause), running and pending points of a sweep",
        description="Count a sweep's points by state from their records (ok, failed, oom, timeout) and, where "
        "squeue answers, from the SLURM queue (running, pending); list the points that are not ok. With "
        "--watch, follow a running sweep (Snakemake's, locally or on SLURM, or its adaptive sweep) on one "
        "line: done, failed, running and pending points and an estimate of the time left (predicted where "
        "the sweep has a machine file, else from the rate points end), until every point has ended.",
        example=[
            "ddlbench status --configfile workflow/config/default.yaml --points",
            "ddlbench status --configfile my-sweep.yaml --watch --interval 30",
        ],
    )
    add_sweep_options(status)
    status.add_argument("--no-queue", action="store_true", help="read the records only, do not ask squeue")
    status.add_argument("--points", action="store_true", help="list every point with its state and job ids")
    status.add_argument("--watch", action="store_true", help="follow the sweep until every point has ended")
    status.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="S",
        help="with --watch: seconds between looks while points end (10); while none does, the pause grows "
        "×1.5 up to 120 s, as submit's wait",
    )
    status.set_defaults(handler=lambda args: _status(args, read_sweep(args)))

    report = commands.add_parser(
        "report",
        section=SECTION,
        summary="finish a sweep from its records: table, predictions, scaling models, history, report",
        description="Finish a sweep from the records on disk, as every road does (Snakemake's last rule, "
        "`submit`, `rerun`, `certify`): the table (table.parquet, table.csv), the predictions of every point "
        "where the sweep knows its machine (predictions.csv), the scaling models (models.json), the sweep in "
        "the results database, and the HTML report with its Markdown summary. Nothing is measured; run it "
        "again after a point ran again. With --table, only render the report from that table (predictions and "
        "models stamped for another table or configuration are then refused, and the report says so).",
        example=[
            "ddlbench report --configfile workflow/config/default.yaml",
            "ddlbench report --configfile my-sweep.yaml --table results/my-sweep/table.parquet --out /tmp/r.html",
        ],
    )
    add_sweep_options(report)
    report.add_argument("--table", type=Path, help="only render the report, from this Parquet table")
    report.add_argument("--out", type=Path, help="the HTML report (default: <sweep dir>/report.html)")
    report.add_argument("--markdown", type=Path, help="the summary as Markdown (default: report.md beside --out)")
    report.add_argument(
        "--history",
        type=Path,
        help="results database for the sweep's figures (default: $DDLBENCH_HISTORY, else <results_dir>/history.sqlite)",
    )
    report.add_argument("--no-history", action="store_true", help="do not store the sweep in the results database")
    report.add_argument(
        "--include-other-versions",
        action="store_true",
        help="compare records of another measurement version too (they are left out by default)",
    )
    report.add_argument(
        "--include-host-copied",
        action="store_true",
        help="let Horovod whose CUDA gradients went through the host (no NCCL) compete for best strategy",
    )
    report.set_defaults(handler=_report)


def _plan(args: argparse.Namespace) -> int:
    from ddlbench.launch.status import other_versions_note, sweep_status
    from ddlbench.sweep import expand_sweep

    config = read_sweep(args)
    if args.report_path:
        print(config.report_path)
        return 0
    plan = expand_sweep(config)
    if args.pack:
        return _plan_packed(config, plan.points, args)
    if args.max_time is not None:
        raise DdlbenchError("--max-time goes with --pack")
    if args.format == "ids":
        print("\n".join(point.point_id for point in plan.points))
    elif args.format == "json":
        points = [point.to_dict() | {"point_id": point.point_id} for point in plan.points]
        skipped = [point.to_dict() | {"point_id": point.point_id, "reason": why} for point, why in plan.skipped]
        print(json.dumps({"points": points, "skipped": skipped}, indent=1))
    else:
        columns = ["point_id", *AXES.values(), "repetition"]
        print_table(columns, [[str(_column(point, c)) for c in columns] for point in plan.points])
        if plan.skipped and not args.no_skipped:
            print(f"\nskipped: {len(plan.skipped)} combinations cannot run")
            print_table(["point_id", "reason"], [[point.point_id, why] for point, why in plan.skipped])
    if args.format != "ids":  # predicted before running (ddlbench.analysis.analytic.foresight)
        from ddlbench.preflight import foresee_misfits

        stream = sys.stderr if args.format == "json" else sys.stdout
        foresee_misfits(plan, on_slurm=True, say=lambda line: print(line, file=stream), write=False)
    excluded = f", {len(plan.excluded)} excluded" if plan.excluded else ""
    skipped = f", {len(plan.skipped)} skipped" if plan.skipped else ""
    versions = other_versions_note(sweep_status(plan, queue=[], jobs_index={}, sweep_dir=config.sweep_dir))
    print(
        f"{len(plan.points)} points{excluded}{skipped} in sweep {config.name!r}{versions}",
        file=sys.stderr if args.format != "table" else sys.stdout,
    )
    return 0


def _column(point, column: str):
    return point.point_id if column == "point_id" else getattr(point, column)


def _plan_packed(config, points, args: argparse.Namespace) -> int:
    """`plan --pack N`: the allocations, their time limits, predicted makespans and idle node-seconds."""
    from ddlbench.launch.packed import describe, expected_times, pack_width, tasks_for
    from ddlbench.launch.packing import pack

    if args.max_time is not None and not args.max_time > 0:
        raise DdlbenchError(f"--max-time {args.max_time:g} is not accepted; give minutes > 0")
    expected, source = expected_times(points, config.machine_path, sweep_dir=config.sweep_dir)
    width, max_time_s, notes = pack_width(points, args.pack), args.max_time * 60 if args.max_time else None, []
    if args.max_time is None:  # sized under the cluster's limits where the profile's site and SLURM can say
        bounds, why = _packing_bounds(config, points, args.pack)
        if bounds is not None:
            width, max_time_s, notes = bounds.width, bounds.max_time_s, list(bounds.notes)
        else:
            notes = [f"not sized under the cluster's limits ({why}); --max-time sets the longest allocation"]
    packing = pack(tasks_for(points, expected_s=expected), width, max_time_s=max_time_s)
    if args.format == "json":
        allocations = [
            {
                "nodes": a.nodes,
                "named": list(a.named),
                "time_limit_s": a.worst.makespan_s,
                "makespan_s": a.expected.makespan_s,
                "idle_share": a.idle_share,
                "placements": [
                    {"point_id": p.key, "start_s": p.start_s, "end_s": p.end_s, "slots": list(p.slots)}
                    for p in a.expected.placements
                ],
            }
            for a in packing.allocations
        ]
        print(json.dumps({"allocations": allocations, "idle_share": packing.idle_share}, indent=1))
        return 0
    print("\n".join([*describe(packing), *notes, source]))
    return 0


def _packing_bounds(config, points, pack_arg: str):
    """(Bounds under the user's limits, None), or (None, why not): no profile, or no cluster answering
    within a few seconds (plan reads; it does not wait out an outage)."""
    from ddlbench.launch.limits import read_limits
    from ddlbench.launch.packed import packing_bounds
    from ddlbench.launch.patience import PATIENCE_VAR
    from ddlbench.launch.profile import load_default_site
    from ddlbench.launch.slurm import SlurmError, query_cluster
    from ddlbench.launch.submission import plan_resources

    try:
        site = load_default_site()
    except DdlbenchError:
        return None, "no site: `ddlbench profile slurm` writes one"
    saved = os.environ.get(PATIENCE_VAR)
    try:
        os.environ[PATIENCE_VAR] = "10"
        facts = query_cluster()
        planned = plan_resources(points, site, sweep=config, facts=facts)
        os.environ[PATIENCE_VAR] = "10"  # again: plan_resources gave this process the site's
        first = next(iter(planned.values()))
        limits = read_limits(facts, account=first.account, qos=first.qos, partition=first.partition)
        partition = facts.partitions.get(first.partition)
        return packing_bounds(points, planned, site, pack_arg, limits=limits, partition=partition), ""
    except (SlurmError, DdlbenchError) as exc:
        return None, f"SLURM did not say: {exc}"
    finally:
        if saved is None:
            os.environ.pop(PATIENCE_VAR, None)
        else:
            os.environ[PATIENCE_VAR] = saved


def _report(args: argparse.Namespace) -> int:
    config = read_sweep(args)
    out = args.out or config.report_path
    markdown = args.markdown or out.with_suffix(".md")
    if args.table is None:
        from ddlbench.finish import finish_sweep

        finished = finish_sweep(
            config,
            history=args.history,
            store_history=not args.no_history,
            include_other_versions=args.include_other_versions,
            include_host_copied=args.include_host_copied,
            report_path=out,
            markdown_path=markdown,
        )
        for note in finished.notes:
            print(note)
        print(finished.summary())
        return 0
    import pandas as pd

    from ddlbench.atomic import write_text_atomic
    from ddlbench.report.render import render_reports

    if not args.table.exists():
        raise DdlbenchError(f"--table {args.table}: no such file; without --table, `ddlbench report` makes it")
    html, summary = render_reports(
        config,
        pd.read_parquet(args.table),
        include_other_versions=args.include_other_versions,
        include_host_copied=args.include_host_copied,
        report_dir=out.parent,
    )
    write_text_atomic(out, html)
    write_text_atomic(markdown, summary)
    print(f"report: {out.resolve()}  summary: {markdown.resolve()}")
    return 0


def _status(args: argparse.Namespace, config) -> int:
    from ddlbench.launch.patience import Patience
    from ddlbench.launch.planned import planned_point_ids
    from ddlbench.launch.slurm import SlurmError, query_queue
    from ddlbench.launch.status import CACHE_FILE, RecordCache, summarize, sweep_status
    from ddlbench.launch.submission import read_jobs_index

    if args.watch:
        return _watch(args, config)
    queue = []
    if not args.no_queue and shutil.which("squeue"):
        try:
            queue = query_queue(patience=Patience(patience_s=STATUS_PATIENCE_S, source="a status's look"))
        except SlurmError as exc:
            print(f"(queue not read: {exc}; points in SLURM jobs show by their records alone)")
    # what the records said at the last status, kept in the sweep folder: a record is read again only
    # when it changed, so a status of a large sweep costs a stat per record, not a read
    records = RecordCache.load(config.sweep_dir / CACHE_FILE)
    statuses = sweep_status(
        planned_point_ids(config),  # kept in the sweep folder: a status does not expand the sweep again
        queue=queue,
        jobs_index=read_jobs_index(config.sweep_dir),
        sweep_dir=config.sweep_dir,
        records=records,
    )
    if config.sweep_dir.is_dir():
        records.save(config.sweep_dir / CACHE_FILE)
    print(f"sweep {config.name!r}: {summarize(statuses)}")
    for status in statuses:
        if args.points or status.state not in ("ok", "not started") or status.other_version:
            jobs = ",".join(status.job_ids) or "-"
            reason = f"  {status.reason}" if status.reason else ""
            version = f"  [measurement version {status.measurement_version}]" if status.other_version else ""
            print(f"{status.state:<12} {status.point_id}  jobs {jobs}{reason}{version}")
    return 0


def _watch(args: argparse.Namespace, config) -> int:
    """`status --watch`: the sweep's progress line until every point ended (ddlbench.launch.progress).
    On SLURM from the queue and the records; else from the files alone: a point whose log was written
    within the longest timeout and has no newer record is running (ddlbench.launch.disk_status).
    It polls as submit's wait does: every --interval seconds while points end, the pause growing ×1.5 up
    to 120 s while none does; each look re-reads only the records that may have changed."""
    import time

    from ddlbench.launch.disk_status import DiskWatch, adaptive_files, sweep_files
    from ddlbench.launch.progress import Progress, predicted_durations, sweep_states, watch
    from ddlbench.launch.slurm import query_queue
    from ddlbench.sweep import expand_sweep

    if not args.interval > 0:
        raise DdlbenchError(f"--interval {args.interval}: give a positive number of seconds")
    plan = expand_sweep(config)
    adaptive = (config.sweep_dir / "adaptive" / "rounds").is_dir()
    since = time.time() - max((point.timeout_s for point in plan.points), default=0.0)
    disk = DiskWatch(since=since, every_s=WATCH_ROUND_S)
    if adaptive:  # the points of the rounds planned so far; the total grows round by round
        progress = Progress(title=f"adaptive sweep {config.name!r} (rounds so far)")

        def poll():
            return disk(*adaptive_files(config.sweep_dir))

    else:
        progress = Progress(title=f"sweep {config.name!r}", predicted_s=predicted_durations(config, plan.points))
        if not args.no_queue and shutil.which("squeue"):
            states = sweep_states(plan, sweep_dir=config.sweep_dir, every_s=WATCH_ROUND_S)

            def poll():
                return states(query_queue())

        else:
            records, logs = sweep_files(config.sweep_dir, [point.point_id for point in plan.points])

            def poll():
                return disk(records, logs)

    watch(poll, progress=progress, interval_s=args.interval, max_interval_s=max(args.interval, WATCH_MAX_INTERVAL_S))
    return 0
