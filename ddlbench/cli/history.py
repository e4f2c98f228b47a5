"""History: `ddlbench history` lists the runs of the results database (sweeps and certificates) and
`ddlbench compare` puts two of them side by side, with a verdict per figure from their launches.

The database is found by the rule a sweep stores by (ddlbench/history/db.py): --db, else
$DDLBENCH_HISTORY, else history.sqlite in the sweep's results_dir.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ddlbench.analysis.verdicts import TEST
from ddlbench.cli.common import print_table

SECTION = "History"


def add_commands(commands: Any) -> None:
    history = commands.add_parser(
        "history",
        section=SECTION,
        summary="list the runs in the results database",
        description="List the runs of the results database, newest last: every aggregated sweep and every "
        "certificate, with its system:partition, configuration hash, ddlbench and measurement versions, and "
        "whether a certificate passed.",
        example="ddlbench history --configfile workflow/config/default.yaml --kind certificate",
    )
    _add_database_options(history)
    history.add_argument("--system", help="only runs of this system")
    history.add_argument("--partition", help="only runs of this partition")
    history.add_argument("--kind", choices=("sweep", "certificate"), help="only sweeps, or only certificates")
    history.add_argument("--json", action="store_true", help="print the runs as JSON")
    history.add_argument(
        "--changes",
        action="store_true",
        help="the change points of each figure instead: the run since which it changed, its p-value and size "
        "(E-divisive with a permutation test, per series of runs of one name, kind, place and measurement version)",
    )
    history.set_defaults(handler=_history)

    compare = commands.add_parser(
        "compare",
        section=SECTION,
        summary="two runs of the results database side by side",
        description="Put two runs of the results database side by side, figure by figure: each value with its "
        "95 % CI, the change, and where both runs have several launches the ratio over launches with its "
        "interval and a verdict (faster, slower, no difference) from a test over the launches; and what changed in "
        "the software and cards they ran with (driver, CUDA runtime, cuDNN, NCCL, GPU clocks and power limit).",
        example="ddlbench compare 3 7 --configfile workflow/config/default.yaml",
    )
    compare.add_argument("run_a", metavar="RUN_A", help="a run id (see `ddlbench history`)")
    compare.add_argument("run_b", metavar="RUN_B", help="the run to compare with RUN_A")
    _add_database_options(compare)
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.set_defaults(handler=_compare)


def _add_database_options(command: Any) -> None:
    """`history` and `compare` find the database by the rule a sweep stores by (ddlbench/history/db.py)."""
    command.add_argument(
        "--db",
        type=Path,
        help="results database (default: $DDLBENCH_HISTORY, else history.sqlite in the --configfile's "
        "results_dir, else results/history.sqlite: where the sweep stored its figures)",
    )
    command.add_argument(
        "--configfile",
        type=Path,
        metavar="SWEEP",
        help="the sweep (or certification suite) file whose results_dir holds the database",
    )


def _database(args: argparse.Namespace) -> Path:
    from ddlbench.history.db import history_path, results_dir_of

    return history_path(args.db, results_dir=results_dir_of(args.configfile))


def _history(args: argparse.Namespace) -> int:
    from ddlbench.history.db import list_runs

    db = _database(args)
    runs = list_runs(db=db, system=args.system, partition=args.partition, kind=args.kind)
    if args.changes:
        return _changes(runs, db, as_json=args.json)
    if args.json:
        print(json.dumps([run.__dict__ | {"figures": None} for run in runs], indent=1))
        return 0
    if not runs:
        print(f"no runs in {db} (another database: --configfile SWEEP, --db or $DDLBENCH_HISTORY)")
        return 0
    print(f"runs in {db}:")
    header = ["id", "kind", "date", "system:partition", "name", "config", "ddlbench", "measurement", "passed"]
    rows = [
        [
            str(run.id),
            run.kind,
            run.date,
            f"{run.system}:{run.partition}",
            run.name,
            run.config_hash[:12],
            run.ddlbench_version,
            str(run.measurement_version),
            "" if run.passed is None else ("yes" if run.passed else "no"),
        ]
        for run in runs
    ]
    print_table(header, rows)
    return 0


def _changes(runs: list[Any], db: Path, *, as_json: bool) -> int:
    """Change points per series of runs (one name, kind, system:partition and measurement version)."""
    from ddlbench.history.changepoints import MAX_PVALUE, series_change_points

    rows = series_change_points(runs, db=db)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no change point (p < {MAX_PVALUE:g}) in the {len(runs)} run(s) of {db}")
        return 0
    print(f"change points (E-divisive, permutation p < {MAX_PVALUE:g}) in {db}:")
    header = ["series", "figure", "node", "since run", "since", "before", "after", "change", "p", "runs"]
    body = [
        [row["series"], row["name"], row["node"] or "", str(row["since_run"]), row["since_date"],
         f"{row['before']:.4g}", f"{row['after']:.4g}", _percent(row["size"]), f"{row['p_value']:.3g}",
         str(row["runs"])]
        for row in rows
    ]  # fmt: skip
    print_table(header, body)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ddlbench.history.compare import compare_runs, provenance_changes
    from ddlbench.history.db import load_run

    db = _database(args)
    a, b = load_run(args.run_a, db=db), load_run(args.run_b, db=db)
    rows = compare_runs(a, b)
    changes = provenance_changes(a.provenance, b.provenance)
    if args.json:
        print(json.dumps({"a": a.id, "b": b.id, "provenance_changes": changes, "figures": rows}, indent=1))
        return 0
    print(f"A: {_describe(a)}")
    print(f"B: {_describe(b)}")
    if a.measurement_version != b.measurement_version:
        print("note: the runs measured with different measurement versions; their figures mean different things")
    if a.config_hash != b.config_hash:
        print("note: the runs' configurations differ (config hash); a change may come from the configuration")
    print(f"provenance: {_provenance_text(a, b, changes)}")
    header = ["figure", "node", "unit", "A [95 % CI]", "B [95 % CI]", "change", "B ÷ A over launches", "verdict"]
    body = [
        [
            row["name"],
            row["node"] or "",
            row.get("unit", ""),
            _with_ci(row["a"]),
            _with_ci(row["b"]),
            _percent(row["change"]),
            _ratio(row),
            row["verdict"],
        ]
        for row in rows
    ]
    print_table(header, body)
    print(f"verdicts from launches: {TEST} over the {len(rows)} figures (p < 0.05); one launch draws none")
    return 0


def _provenance_text(a: Any, b: Any, changes: list[str]) -> str:
    """What changed in the software and cards, or that nothing did, or which run kept none."""
    if changes:
        return "changed: " + "; ".join(changes)
    unknown = [f"run {run.id}" for run in (a, b) if not run.provenance]
    if unknown:
        return f"not kept for {' and '.join(unknown)} (stored before the database kept provenance)"
    return "the same (driver, CUDA runtime, cuDNN, NCCL, torch, GPUs and their clocks and power limit, CPU)"


def _ratio(row: dict[str, Any]) -> str:
    """'×0.77 [0.71, 0.83] p=0.002 (3+3)': the ratio of geometric means over launches, its 95 % CI, Holm's p."""
    if row.get("p") is None:
        return ""
    low, high = row["ratio_ci"]
    return f"×{row['ratio']:.3g} [{low:.3g}, {high:.3g}] p={row['p']:.2g} ({row['launches'][0]}+{row['launches'][1]})"


def _describe(run: Any) -> str:
    return (
        f"run {run.id} {run.kind} {run.name} {run.system}:{run.partition} {run.date} "
        f"(ddlbench {run.ddlbench_version}, measurement v{run.measurement_version})"
    )


def _with_ci(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return ""
    if figure["value"] is None:
        return "not measured"
    if figure["ci_low"] is None or figure["ci_high"] is None:
        return f"{_number(figure['value'])} (n={figure['n']}, no CI)"
    return f"{_number(figure['value'])} [{_number(figure['ci_low'])}, {_number(figure['ci_high'])}]"


def _number(value: Any) -> str:
    """Four significant digits; FLOP/s and bytes/s stay in scientific notation, which reads better there."""
    return "" if value is None else f"{value:.4g}"


def _percent(value: Any) -> str:
    return "" if value is None else f"{value * 100:+.1f} %"
