"""`ddlbench calibrate`: measure this machine (or the allocation's nodes) into a machine file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ddlbench.errors import DdlbenchError


def add_commands(commands: Any, launchers: tuple[str, ...]) -> None:
    calibrate = commands.add_parser(
        "calibrate", help="run a calibration suite and write the machine file (FLOP/s, bandwidth, α–β of collectives)"
    )
    suite = calibrate.add_mutually_exclusive_group()
    suite.add_argument(
        "--configfile", type=Path, help="calibration suite YAML (default: workflow/calibration/default.yaml)"
    )
    suite.add_argument("--config-json", help="the suite as JSON (what workflow/calibrate.smk passes)")
    calibrate.add_argument(
        "--from-records",
        action="store_true",
        help="run nothing: fit the records the suite's points wrote (after `snakemake -s workflow/calibrate.smk`)",
    )
    calibrate.add_argument(
        "--submit",
        action="store_true",
        help="submit the points as SLURM jobs (submitit, the profile's site as `ddlbench submit` uses), wait, fit",
    )
    calibrate.add_argument("--site", type=Path, help="with --submit: a site file instead of the profile's")
    calibrate.add_argument("--out", type=Path, required=True, help="the machine file to write (YAML)")
    calibrate.add_argument("--report", type=Path, help="HTML report (default: beside the suite's records)")
    calibrate.add_argument(
        "--launcher",
        default="auto",
        choices=launchers,
        help="as for run-point: srun inside a SLURM allocation, else local (mpirun for MPI points)",
    )
    calibrate.add_argument("--cores", type=int, help="cores granted (a local point needing more is refused)")
    calibrate.set_defaults(handler=_calibrate)


def _link_text(link: dict[str, Any]) -> str:
    bandwidth = link["bandwidth_bytes_per_s"]
    per_byte = f"{bandwidth / 1e9:.3g} GB/s" if bandwidth else "no size-dependent term fitted (β = 0)"
    return f"α {link['alpha_s'] * 1e6:.3g} µs, {per_byte}"


def _calibrate(args: argparse.Namespace) -> int:
    from ddlbench.calibrate import calibrate

    raw = None
    if args.config_json:
        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise DdlbenchError(f"--config-json is not valid JSON: {exc}") from None
    if args.submit:
        from ddlbench.calibrate import submit_suite

        submit_suite(args.configfile, raw=raw, site_path=args.site)
    machine = calibrate(
        args.configfile,
        raw=raw,
        out=args.out,
        launcher=args.launcher,
        cores=args.cores,
        report=args.report,
        from_records=args.from_records or args.submit,
    )
    failed = machine.get("failed_points", [])
    links = ", ".join(f"{name}: {_link_text(link)}" for name, link in machine["links"].items())
    print(f"machine file: {args.out.resolve()} ({links or 'no link measured'})")
    for point in failed:  # failures are data: listed in the machine file too
        print(f"not measured: {point['point_id']} ({point['status']}): {point['reason']}")
    return 0
