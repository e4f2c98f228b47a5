"""The `ddlbench` command: plan a sweep, run one point, aggregate records, render the report (and, in
cli_slurm.py, write the SLURM profile, submit, rerun and follow a sweep; in cli_calibrate.py, measure the
machine).

Every subcommand that needs a sweep takes it as a YAML file (--configfile, the embedded default when
absent) or as resolved JSON (--config-json, what the Snakefile passes). Imports are deferred so that
planning and reporting never import torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import ddlbench
from ddlbench.config import AXES, DEFAULT_SWEEP, SweepConfig, load_sweep_config, sweep_config_from_mapping
from ddlbench.errors import DdlbenchError

log = logging.getLogger("ddlbench")

# ddlbench.launch.launchers.LAUNCHERS, spelled out here so that building the parser imports no launcher
LAUNCHERS = ("auto", "local", "srun", "mpirun")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if not args.quiet else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return args.handler(args)
    except DdlbenchError as exc:
        print(f"ddlbench: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddlbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ddlbench {ddlbench.__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    plan = commands.add_parser("plan", help="print the points of a sweep and their count")
    _add_sweep_options(plan)
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

    run = commands.add_parser("run-point", help="run one point of a sweep and write its record")
    run.add_argument("--spec", help="the point as JSON (as the Snakefile passes it)")
    run.add_argument("--point", help="a point id of the sweep given by --configfile (see `ddlbench plan`)")
    _add_sweep_options(run)
    run.add_argument("--out", type=Path, help="record path (default: the point's place in the sweep's folder)")
    run.add_argument(
        "--launcher",
        default="auto",
        choices=LAUNCHERS,
        help="auto (srun inside a SLURM allocation, mpirun inside a PBS job, else local), local, srun, mpirun",
    )
    run.add_argument(
        "--hostfile",
        type=Path,
        help="hosts for --launcher mpirun (default: $DDLBENCH_HOSTFILE, $PBS_NODEFILE, else this host)",
    )
    run.add_argument("--dump-params", type=Path, help="save the final full model state here (for checks)")
    run.add_argument(
        "--cores",
        type=int,
        help="cores granted to the point (Snakemake's {threads}); a local launch needing more is refused",
    )
    run.set_defaults(handler=_run_point)

    group = commands.add_parser(
        "run-group", help="run several points of one layout in one launch, each with its own record"
    )
    group.add_argument("--specs", required=True, help="the points as a JSON list of point specs")
    group.add_argument("--records-dir", required=True, type=Path, help="each record at DIR/<point id>/record.json")
    group.add_argument("--out", required=True, type=Path, help="the launch's record (what the launch cost)")
    group.add_argument("--launch-id", default="launch", help="the launch's name in its record")
    group.add_argument("--launcher", default="auto", choices=LAUNCHERS, help="as for run-point")
    group.add_argument("--cores", type=int, help="cores granted to the launch (Snakemake's {threads})")
    group.set_defaults(handler=_run_group)

    aggregate = commands.add_parser("aggregate", help="collect a sweep's records into one table")
    _add_sweep_options(aggregate)
    aggregate.add_argument("--parquet", type=Path, help="default: <sweep dir>/table.parquet")
    aggregate.add_argument("--csv", type=Path, help="default: <sweep dir>/table.csv")
    aggregate.add_argument(
        "--include-other-versions",
        action="store_true",
        help="compare records of another measurement version too (they are left out by default)",
    )
    aggregate.add_argument(
        "--history",
        type=Path,
        metavar="DB",
        help="results database for the sweep's figures (default: $DDLBENCH_HISTORY, else <results_dir>/history.sqlite)",
    )
    aggregate.add_argument("--no-history", action="store_true", help="do not store the sweep in the results database")
    aggregate.set_defaults(handler=_aggregate)

    report = commands.add_parser("report", help="render the HTML report of an aggregated sweep, and its summary")
    _add_sweep_options(report)
    report.add_argument("--table", type=Path, help="Parquet table (default: <sweep dir>/table.parquet)")
    report.add_argument("--out", type=Path, help="default: <sweep dir>/report.html")
    report.add_argument("--markdown", type=Path, help="the summary as Markdown (default: report.md beside --out)")
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

    from ddlbench.cli_analytic import add_commands as add_analytic
    from ddlbench.cli_calibrate import add_commands as add_calibrate
    from ddlbench.cli_certify import add_commands as add_certify
    from ddlbench.cli_fit import add_commands as add_fit
    from ddlbench.cli_predict import add_commands as add_predict
    from ddlbench.cli_sample import add_commands as add_sample
    from ddlbench.cli_slurm import add_commands

    add_commands(commands, _add_sweep_options, _sweep)
    add_calibrate(commands, LAUNCHERS)
    add_analytic(commands)
    add_predict(commands, _add_sweep_options, _sweep)
    add_fit(commands, _add_sweep_options, _sweep)
    add_sample(commands, _add_sweep_options, _sweep)
    add_certify(commands)
    return parser


def _add_sweep_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--configfile",
        type=Path,
        help=f"sweep YAML (default: {DEFAULT_SWEEP.relative_to(DEFAULT_SWEEP.parents[2])})",
    )
    group.add_argument("--config-json", help="the sweep as JSON")


def _sweep(args: argparse.Namespace) -> SweepConfig:
    if args.config_json:
        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise DdlbenchError(f"--config-json is not valid JSON: {exc}") from None
        return sweep_config_from_mapping(raw)
    return load_sweep_config(args.configfile or DEFAULT_SWEEP)


def _plan(args: argparse.Namespace) -> int:
    from ddlbench.cli_predict import print_table
    from ddlbench.launch.status import other_versions_note, sweep_status
    from ddlbench.sweep import expand_sweep

    config = _sweep(args)
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
    expected, source = expected_times(points, config.machine_path)
    packing = pack(tasks_for(points, expected_s=expected), pack_width(points, args.pack),
                   max_time_s=args.max_time * 60 if args.max_time else None)  # fmt: skip
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
    print("\n".join([*describe(packing), source]))
    return 0


def _run_point(args: argparse.Namespace) -> int:
    from ddlbench.launch.runner import Interrupted, run_point
    from ddlbench.point import Point
    from ddlbench.records import record_path
    from ddlbench.sweep import expand_sweep

    if args.spec:
        if args.point or args.configfile or args.config_json:
            raise DdlbenchError("give either --spec, or --point with a sweep config, not both")
        try:
            spec = json.loads(args.spec)
            if isinstance(spec, dict) and spec.get("kind") == "calibration":  # workflow/calibrate.smk's points
                return _run_calibration_point(spec, args)
            point = Point.from_dict(spec)
        except (json.JSONDecodeError, TypeError) as exc:
            raise DdlbenchError(f"--spec is not a point: {exc}") from None
        if args.out is None:
            raise DdlbenchError("--out is required with --spec")
        out = args.out
    elif args.point:
        config = _sweep(args)
        points = expand_sweep(config).by_id()
        if args.point not in points:
            raise DdlbenchError(
                f"no point {args.point!r} in sweep {config.name!r}; `ddlbench plan --format ids` lists them"
            )
        point = points[args.point]
        out = args.out or record_path(config.sweep_dir, point.point_id)
    else:
        raise DdlbenchError("run-point needs --spec JSON, or --point ID (with --configfile)")
    try:
        record = run_point(
            point,
            out=out,
            launcher=args.launcher,
            dump_params=args.dump_params,
            cores=args.cores,
            hostfile=args.hostfile,
        )
    except Interrupted as exc:
        log.error("point %s interrupted (%s); no record written", point.point_id, exc)
        return 143
    print(f"{record.point_id}: {record.status}{': ' + record.reason if record.reason else ''} -> {out}")
    return 0


def _run_group(args: argparse.Namespace) -> int:
    from ddlbench.launch.group import run_group
    from ddlbench.launch.runner import Interrupted
    from ddlbench.point import Point

    try:
        specs = json.loads(args.specs)
        if not isinstance(specs, list) or not all(isinstance(spec, dict) for spec in specs):
            raise TypeError(f"got {type(specs).__name__}, need a list of point mappings (Point.to_dict)")
        points = [Point.from_dict(spec) for spec in specs]
    except (json.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
        raise DdlbenchError(f"--specs is not a JSON list of points: {exc}") from None
    outs = [args.records_dir / point.point_id / "record.json" for point in points]
    try:
        launch = run_group(
            points, outs=outs, launch_out=args.out, launch_id=args.launch_id, launcher=args.launcher, cores=args.cores
        )
    except Interrupted as exc:
        log.error("group launch %s interrupted (%s); its launch record is not written", args.launch_id, exc)
        return 143
    for span in launch.points:
        print(f"{span.point_id}: {span.status}{' (run again alone)' if span.alone else ''}")
    print(f"launch {launch.launch_id}: {launch.wall_s:.1f} s wall, {launch.node_s:.1f} node-s -> {args.out}")
    return 0


def _run_calibration_point(spec: dict, args: argparse.Namespace) -> int:
    from ddlbench.calibrate.runner import run_calibration_point
    from ddlbench.calibrate.suite import CalibrationPoint

    if args.out is None:
        raise DdlbenchError("--out is required with --spec")
    record = run_calibration_point(
        CalibrationPoint.from_dict(spec), out=args.out, launcher=args.launcher, cores=args.cores
    )
    print(f"{record.point_id}: {record.status}{': ' + record.reason if record.reason else ''} -> {args.out}")
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    from ddlbench.analysis.aggregate import build_table, save_table
    from ddlbench.sweep import expand_sweep

    config = _sweep(args)
    table = build_table(expand_sweep(config), include_other_versions=args.include_other_versions)
    parquet = args.parquet or config.sweep_dir / "table.parquet"
    csv = args.csv or config.sweep_dir / "table.csv"
    save_table(table, parquet=parquet, csv=csv)
    counts = table["status"].value_counts().to_dict()
    print(f"{len(table)} points {counts} -> {parquet}, {csv}")
    if not args.no_history:
        from ddlbench.certify.run import read_machine
        from ddlbench.history.db import history_path
        from ddlbench.history.store import store_sweep

        machine = read_machine(config.sweep_dir) if config.calibrate else None
        db = history_path(args.history, results_dir=config.results_dir)
        run_id, new = store_sweep(config, table, machine=machine, db=db)
        print(f"history: run {run_id}{'' if new else ' (already stored)'} in {db}")
    return 0


def _report(args: argparse.Namespace) -> int:
    import pandas as pd

    from ddlbench.atomic import write_text_atomic
    from ddlbench.report.render import render_reports

    config = _sweep(args)
    table_path = args.table or config.sweep_dir / "table.parquet"
    if not table_path.exists():
        raise DdlbenchError(f"no table at {table_path}; run `ddlbench aggregate` first")
    out = args.out or config.report_path
    markdown = args.markdown or out.with_suffix(".md")
    table = pd.read_parquet(table_path)
    html, summary = render_reports(
        config,
        table,
        include_other_versions=args.include_other_versions,
        include_host_copied=args.include_host_copied,
        report_dir=out.parent,
    )
    write_text_atomic(out, html)
    write_text_atomic(markdown, summary)
    print(f"report: {out.resolve()}  summary: {markdown.resolve()}")
    return 0
