"""Certify: `ddlbench certify` runs a certification suite on a partition (or judges the records of one
that ran) against reference figures, checks it against the last passing certificate, stores it in the
results database and writes the certificate (JSON and HTML).

    ddlbench certify --system NAME --partition P --references refs.yaml [--suite suite.yaml]
                     [--from-records DIR] [--json out.json] [--html out.html] [--write-references new.yaml]
                     [--profile slurm] [--cores N] [--nodes N] [--db history.sqlite]

Exit status: 0 when every referenced figure passes, 1 when any is slow, failed or missing (or nothing is
referenced), 2 for bad input (one line naming the key and the problem).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

from ddlbench.errors import DdlbenchError

log = logging.getLogger("ddlbench")

SECTION = "Certify"
LEVELS = ("quick", "standard", "burn-in")
NODE_LEVELS = {"quick": "quick", "burn-in": "burn-in"}  # level -> the figure family it judges


def add_commands(commands: Any) -> None:
    certify = commands.add_parser(
        "certify",
        section=SECTION,
        summary="run a certification suite and judge it against reference figures",
        description="Run a certification suite (a small sweep with a calibration) on a partition, here or "
        "through a Snakemake profile or packed SLURM allocations, or judge the records of one that ran "
        "(--from-records); compare every figure with its reference band for this system:partition and with "
        "the last passing certificate, store the run in the results database and write the certificate. Exit "
        "status 0 when every referenced figure passes, 1 when any is slow, failed or missing, 2 for bad input. "
        "--write-references proposes a reference file from this run.",
        example=[
            "ddlbench certify --system mycluster --partition gpu --references refs.yaml --profile slurm",
            "ddlbench certify --system laptop --partition local --write-references refs.yaml",
        ],
    )
    certify.add_argument(
        "--level",
        choices=LEVELS,
        default="standard",
        help="quick: this node's readiness in seconds (GPU health, a short GEMM per precision and a memory copy per "
        "device, judged against the references' quick/ bands; one line and an exit status for a prolog or Slurm's "
        "HealthCheckProgram; nothing stored); standard (default): the whole suite; burn-in: this node loaded for "
        "--duration, each figure judged at its worst (5th percentile) against burn-in/ bands, with health and "
        "replays across rounds, stored in the results database",
    )
    certify.add_argument(
        "--duration",
        help="with --level burn-in: how long to load the node (90s, 30m, 2h; a number is seconds)",
    )
    certify.add_argument("--system", required=True, help="the system's name, as the reference file names it")
    certify.add_argument("--partition", required=True, help="the partition certified (SLURM's name; any name locally)")
    certify.add_argument("--references", type=Path, help="reference file (YAML, per system:partition)")
    certify.add_argument(
        "--suite", type=Path, help="certification suite (a sweep; default workflow/certify/default.yaml)"
    )
    certify.add_argument(
        "--from-records", type=Path, metavar="DIR", help="judge the records of this sweep folder instead of running"
    )
    certify.add_argument("--json", type=Path, help="also write the certificate's JSON here")
    certify.add_argument("--html", type=Path, help="the certificate's HTML (default: <sweep folder>/certificate.html)")
    certify.add_argument("--write-references", type=Path, metavar="NEW", help="propose a reference file from this run")
    certify.add_argument(
        "--min-tolerance",
        type=float,
        default=0.10,
        help="with --write-references: the narrowest band proposed, ± this fraction (default 0.10)",
    )
    certify.add_argument(
        "--spread-limit",
        type=float,
        default=0.10,
        help="the widest spread, (max − min) ÷ max, a figure may have across the GPUs of a node or the nodes of "
        "the partition before its spread check fails (default 0.10)",
    )
    certify.add_argument("--profile", help="Snakemake profile to run the suite with (e.g. slurm); default: locally")
    certify.add_argument(
        "--pack",
        metavar="N",
        help="run the suite's points as job steps of SLURM allocations of N nodes (auto: as wide as the widest "
        "point, so no allocation waits for the whole partition; all: the whole partition at once for per-node "
        "points), within your limits, with the site of `ddlbench profile slurm`, not as a job each",
    )
    certify.add_argument("--cores", type=int, default=2, help="cores for a local run (default 2)")
    certify.add_argument(
        "--nodes", type=int, default=2, help="nodes of a local 'partition' (default 2; SLURM: the partition's)"
    )
    certify.add_argument(
        "--db", type=Path, help="results database (default: $DDLBENCH_HISTORY, else <results folder>/history.sqlite)"
    )
    certify.set_defaults(handler=_certify)


def _certify(args: argparse.Namespace) -> int:
    if not 0 <= args.spread_limit < 1:
        raise DdlbenchError(f"--spread-limit: {args.spread_limit} is not a fraction in [0, 1)")
    if args.level != "burn-in" and args.duration is not None:
        raise DdlbenchError(f"--duration: only with --level burn-in, not {args.level}")
    if args.level in NODE_LEVELS:
        return _certify_node(args)
    return _certify_suite(args)


def _certify_node(args: argparse.Namespace) -> int:
    """--level quick or burn-in: measure this node here, judge its family's references (quick/ or burn-in/)
    and the checks (health, replays), print one line; burn-in also stores its certificate."""
    from ddlbench.atomic import write_text_atomic
    from ddlbench.certify.certificate import build_certificate, family
    from ddlbench.certify.propose import propose_references, references_text
    from ddlbench.certify.quick import quick_line
    from ddlbench.certify.references import load_references
    from ddlbench.certify.spread import spread_figures

    level = args.level
    for option in ("from_records", "profile", "pack", "suite"):
        if getattr(args, option) is not None:
            raise DdlbenchError(
                f"--{option.replace('_', '-')}: not with --level {level}, which measures this node itself"
            )
    duration_s = parse_duration(args.duration) if level == "burn-in" else None
    if args.references is None and args.write_references is None:
        raise DdlbenchError("--references: give a reference file (or --write-references NEW to propose one)")
    references = None
    if args.references is not None:
        every = load_references(args.references).for_partition(args.system, args.partition)
        references = {name: ref for name, ref in every.items() if family(name) == NODE_LEVELS[level]}
    began = time.perf_counter()
    if level == "quick":
        from ddlbench.certify.quick import quick_figures

        figures, device = quick_figures()
    else:
        from ddlbench.certify.burnin import burn_in

        figures, device = (done := burn_in(duration_s, say=log.info)).figures, done.device
    figures += spread_figures(figures, args.spread_limit)  # across the node's GPUs (ddlbench.certify.spread)
    certificate = build_certificate(
        figures,
        references,
        system=args.system,
        partition=args.partition,
        suite=level,
        config_hash=level,
        references_path=str(args.references) if args.references else None,
        device_name=device if device != "cpu" else None,
    )
    certificate["host"] = socket.gethostname()
    if level == "burn-in":  # an acceptance step: kept in the results database for change detection
        from ddlbench.history.db import history_path
        from ddlbench.history.store import store_certificate

        certificate["notes"] = [f"{done.rounds} round(s) in {done.seconds:.0f} s on {certificate['host']}"]
        run_id, _ = store_certificate(certificate, source=certificate["host"], db=history_path(args.db))
        certificate["history_run"] = run_id
    text = json.dumps(certificate, indent=1, allow_nan=False)
    if args.json:
        write_text_atomic(args.json, text + "\n")
    if args.html:
        write_text_atomic(args.html, render_certificate(certificate))
    if args.write_references:
        proposal = propose_references(
            figures, system=args.system, partition=args.partition, min_tolerance=args.min_tolerance
        )
        source = f"ddlbench certify --level {level} on {certificate['host']} ({certificate['date']})"
        write_text_atomic(
            args.write_references, references_text(proposal, source=source, min_tolerance=args.min_tolerance)
        )
    print(quick_line(certificate, time.perf_counter() - began, level=level))
    return 0 if certificate["passed"] else 1


def parse_duration(text: str | None) -> float:
    """Seconds of a burn-in's --duration: 90, 90s, 30m or 2h; refused, naming the forms, when it is none."""
    if text is None:
        raise DdlbenchError("--duration: --level burn-in needs one (90s, 30m, 2h; a number is seconds)")
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise DdlbenchError(f"--duration: {text!r} is not a positive duration (90s, 30m, 2h; a number is seconds)")
    return seconds


def _certify_suite(args: argparse.Namespace) -> int:
    from ddlbench.atomic import write_text_atomic
    from ddlbench.certify.certificate import build_certificate, check_reference_names
    from ddlbench.certify.health import record_health_figures
    from ddlbench.certify.propose import propose_references, references_text
    from ddlbench.certify.references import load_references
    from ddlbench.certify.replay import replay_figures
    from ddlbench.certify.run import (
        folder_records,
        read_machine,
        records_config_hash,
        records_table,
        run_suite,
        run_suite_packed,
        suite_records,
        suite_table,
    )
    from ddlbench.certify.spread import spread_figures
    from ddlbench.certify.suite import load_suite, local_partition, resolve_suite, slurm_partition
    from ddlbench.history.compare import provenance_changes, regressions
    from ddlbench.history.db import history_path, last_passing_certificate
    from ddlbench.history.figures import machine_figures, training_figures
    from ddlbench.history.store import run_provenance, store_certificate

    if args.references is None and args.write_references is None:
        raise DdlbenchError("--references: give a reference file (or --write-references NEW to propose one)")
    references = None
    if args.references is not None:
        references = load_references(args.references).for_partition(args.system, args.partition)
    notes: list[str] = []
    config = None
    if args.from_records is not None:
        if args.suite is not None or args.profile is not None or args.pack is not None:
            raise DdlbenchError("--from-records: judges records that exist; --suite, --profile and --pack run new ones")
        folder = args.from_records
        records = folder_records(folder)
        table, machine = records_table(records), read_machine(folder)
        suite_name, config_hash = folder.name, records_config_hash(folder, table)
    else:
        if args.pack is not None and args.profile is not None:
            raise DdlbenchError("--pack submits the suite itself; give --pack or --profile, not both")
        on_slurm = args.profile is not None or args.pack is not None
        nodes = slurm_partition(args.partition) if on_slurm else local_partition(args.nodes)
        config = resolve_suite(load_suite(args.suite), system=args.system, partition=args.partition, nodes=nodes)
        folder, suite_name, config_hash = config.sweep_dir, config.name, config.config_hash()
        if references:  # names the plan fixes are checked before anything runs
            planned = [name for name in references if not name.startswith("machine/")]
            check_reference_names({name: references[name] for name in planned}, training_figures(suite_table(config)))
        history = history_path(args.db, results_dir=config.results_dir)
        with _suite_progress(config):
            if args.pack is not None:
                status, log_file = run_suite_packed(config, pack=args.pack, history=history)
            else:
                status, log_file = run_suite(config, cores=args.cores, profile=args.profile, history=history)
        if status != 0:
            notes.append(f"the workflow exited with status {status} (log: {log_file}); judged on the records there are")
        table = suite_table(config)
        machine = read_machine(folder) if config.calibrate else None
        records = suite_records(config)
    # the replay check (ddlbench.certify.replay) judges itself: its figures need no reference
    figures = (machine_figures(machine) if machine else []) + training_figures(table) + replay_figures(records)
    figures += record_health_figures(records)  # each rank's GPU around its point (ddlbench.certify.health)
    figures += spread_figures(figures, args.spread_limit)  # across the partition's nodes (ddlbench.certify.spread)
    unmeasured: dict[str, str] = {}
    if references:
        check_reference_names(references, figures, unknown_prefixes=() if machine else ("machine/",))
        produced = {figure.name for figure in figures}
        # a calibration that wrote no machine file failed: its figures are `failed`; any other referenced figure
        # the run did not produce is `missing` (ddlbench.certify.certificate)
        unmeasured = {
            name: "the suite's calibration wrote no machine file"
            for name in references
            if name not in produced and name.startswith("machine/") and not machine
        }
    certificate = build_certificate(
        figures,
        references,
        system=args.system,
        partition=args.partition,
        suite=suite_name,
        config_hash=config_hash,
        references_path=str(args.references) if args.references else None,
        unmeasured=unmeasured,
        device_name=((machine or {}).get("device") or {}).get("name"),
    )
    if not references:
        checks = " but the checks that need none (replay, health, spread)" if any(f.check for f in figures) else ""
        notes.append(f"no reference file: nothing is certified{checks} (see --write-references)")
    db = history_path(args.db, results_dir=folder.parent)
    version = certificate["measurement_version"]
    previous = last_passing_certificate(
        args.system, args.partition, suite=suite_name, measurement_version=version, db=db
    )
    if previous is not None:
        certificate["regressions"] = regressions(previous, certificate["figures"])
        certificate["compared_with"] = previous.id
        if changes := provenance_changes(previous.provenance, run_provenance(table)):
            notes.append(f"the software and cards changed since run {previous.id}: {'; '.join(changes)}")
    else:
        notes.append(
            f"no regression check: {db} holds no passing certificate of suite {suite_name} at measurement "
            f"version {version} for {args.system}:{args.partition}"
        )
    certificate["notes"] = notes
    certificate["provenance"] = run_provenance(table)  # the software and cards, for the next comparison
    run_id, _ = store_certificate(certificate, source=str(folder), db=db)
    certificate["history_run"] = run_id
    certificate["change_points"] = _change_points(certificate, db)
    text = json.dumps(certificate, indent=1, allow_nan=False)
    write_text_atomic(folder / "certificate.json", text + "\n")
    if args.json:
        write_text_atomic(args.json, text + "\n")
    html_path = args.html or folder / "certificate.html"
    write_text_atomic(html_path, render_certificate(certificate))
    if args.write_references:
        if not 0 <= args.min_tolerance < 1:
            raise DdlbenchError(f"--min-tolerance: {args.min_tolerance} is not a fraction in [0, 1)")
        proposal = propose_references(
            figures, system=args.system, partition=args.partition, min_tolerance=args.min_tolerance
        )
        source = f"{folder} ({certificate['date']})"
        write_text_atomic(
            args.write_references, references_text(proposal, source=source, min_tolerance=args.min_tolerance)
        )
        print(f"proposed references: {args.write_references}")
    if (folder / "suite.yaml").exists() and (folder / "table.parquet").exists():  # a suite certify ran
        _rerender_report(folder)
    _print_summary(certificate, html_path)
    return 0 if certificate["passed"] else 1


def _change_points(certificate: dict[str, Any], db: Path) -> list[dict[str, Any]]:
    """The change points of this suite's certificates on this partition, this one included (their figures at
    one measurement version): ddlbench.history.changepoints."""
    from ddlbench.history.changepoints import series_change_points
    from ddlbench.history.db import list_runs

    runs = list_runs(db=db, system=certificate["system"], partition=certificate["partition"], kind="certificate")
    same = [
        run
        for run in runs
        if run.name == certificate["suite"] and run.measurement_version == certificate["measurement_version"]
    ]
    return series_change_points(same, db=db)


def _suite_progress(config):
    """Points done, failed, running and not started while the suite runs, from its records and logs
    (ddlbench.launch.progress.watching; on SLURM a point shows as running once its job started)."""
    import time

    from ddlbench.launch.disk_status import states_on_disk, sweep_files
    from ddlbench.launch.progress import Progress, predicted_durations, watching
    from ddlbench.sweep import expand_sweep

    points = expand_sweep(config).points
    records, logs = sweep_files(config.sweep_dir, [p.point_id for p in points])
    began = time.time() - 2  # the clock of a shared filesystem may lag a little
    progress = Progress(title=f"suite {config.name!r}", predicted_s=predicted_durations(config, points))
    return watching(lambda: states_on_disk(records, logs, since=began), progress=progress)


def render_certificate(certificate: dict[str, Any]) -> str:
    from ddlbench.templating import template_environment

    env = template_environment(autoescape=True)
    share = lambda value: "" if value is None else f"{100 * value:.1f} %"  # noqa: E731 - a template filter
    return env.get_template("certificate.html.j2").render(c=certificate, fmt=_number, pct=_percent, share=share)


def _rerender_report(folder: Path) -> None:
    """The suite's report again, now that its certificate exists (its summary shows the machine's health)."""
    import pandas as pd

    from ddlbench.atomic import write_text_atomic
    from ddlbench.config import load_sweep_config
    from ddlbench.report.render import render_reports

    config = load_sweep_config(folder / "suite.yaml")
    html, summary = render_reports(config, pd.read_parquet(folder / "table.parquet"), report_dir=folder)
    write_text_atomic(config.report_path, html)
    write_text_atomic(config.report_path.with_suffix(".md"), summary)


def _print_summary(certificate: dict[str, Any], html: Path) -> None:
    counts = ", ".join(f"{status} {n}" for status, n in certificate["counts"].items())
    verdict = "PASSED" if certificate["passed"] else "FAILED"
    print(f"{certificate['system']}:{certificate['partition']}: {verdict} ({counts})")
    for entry in certificate["figures"]:
        if entry["passed"] is False:
            where = f" on {entry['node']}" if entry["node"] else ""
            band = f"[{_number(entry['lower'])}, {_number(entry['upper'])}]"
            if entry["value"] is None:  # failed (the cause) or missing (never produced)
                print(f"  {entry['status']}: {entry['name']}{where}: {entry['why_missing']}")
            elif entry.get("finding"):  # a check that found something (the replay: an odd rank)
                print(f"  {entry['status']}: {entry['name']}{where}: {entry['finding']}")
            else:
                value = f"{_number(entry['value'])} {entry['unit']}"
                print(f"  {entry['status']}: {entry['name']}{where}: {value} outside {band}")
    if certificate["nodes_outside"]:
        print(f"  nodes outside their band: {', '.join(certificate['nodes_outside'])}")
    for row in certificate["regressions"]:
        where = f" on {row['node']}" if row["node"] else ""
        print(
            f"  regression: {row['name']}{where}: {_number(row['value'])} vs {_number(row['previous_value'])} "
            f"({_percent(row['change'])}) in passing certificate run {row['previous_run']}"
        )
    for row in certificate.get("change_points") or []:
        where = f" on {row['node']}" if row["node"] else ""
        print(
            f"  change point: {row['name']}{where} since run {row['since_run']} ({row['since_date']}): "
            f"{_number(row['before'])} → {_number(row['after'])} ({_percent(row['size'])}, p={row['p_value']:.2g}, "
            f"{row['runs']} runs)"
        )
    for note in certificate["notes"]:
        print(f"  note: {note}")
    print(f"certificate: {html} (history run {certificate['history_run']})")


def _number(value: Any) -> str:
    """Four significant digits; FLOP/s and bytes/s stay in scientific notation, which reads better there."""
    return "" if value is None else f"{value:.4g}"


def _percent(value: Any) -> str:
    return "" if value is None else f"{value * 100:+.1f} %"
