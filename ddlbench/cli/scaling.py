"""Scaling models (empirical): `ddlbench fit`, Extra-P's normal form fitted to a sweep's measured figures
or to any CSV, with prediction bands, extrapolated to unmeasured scales.

Three uses:
- a sweep's records: `ddlbench fit [--configfile F | --table T] [--over nodes[,batch_size]]
  [--extrapolate-to nodes=8,16]` models every series of every figure and prints (or writes, --out) the
  models with their bands;
- any measurements: `ddlbench fit --x COL [--x COL2] --y COL [X ...] < data.csv` fits y over x from a CSV
  on standard input (rows with the same x are repetitions) and prints one prediction per line for each X
  (comma-separated for several x columns); the model and its band go to standard error;
- the cheapest configuration: `--cheapest --target samples_per_s>=5000` (or step_time_s<=0.5,
  epoch_time_s<=600) over the candidates of --extrapolate-to and the measured scales, by node-hours per epoch.

These models are fitted to measurements; `ddlbench predict` is the analytic model (ddlbench.cli.predict).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from ddlbench.cli.common import Renamed, add_sweep_options, emit_text, read_sweep
from ddlbench.errors import DdlbenchError

SECTION = "Scaling models (empirical)"


def add_commands(commands: Any) -> None:
    fit = commands.add_parser(
        "fit",
        section=SECTION,
        summary="fit scaling models to measured figures (a sweep's or a CSV's), with bands, extrapolated",
        description="Fit empirical scaling models (Extra-P's performance-model normal form) to measured figures: "
        "every series of a sweep's aggregated table (step time, samples/s, speedup, efficiency, cost per "
        "epoch over nodes or batch size), or a column of any CSV on standard input. Each model comes with its "
        "leave-one-out error and a 95 % prediction band, evaluated at the measured scales and extrapolated to "
        "unmeasured ones (--extrapolate-to); --cheapest picks the cheapest configuration that meets a target. "
        "These models are fitted to measurements: `ddlbench predict` is the analytic model, which needs none.",
        example=[
            "ddlbench fit --configfile sweep.yaml --over nodes --extrapolate-to nodes=64,128",
            "ddlbench fit --configfile sweep.yaml --cheapest --target samples_per_s>=5000",
            "ddlbench fit --x nodes --y samples_per_s 64 128 < measured.csv",
        ],
    )
    add_sweep_options(fit)
    fit.add_argument("--table", type=Path, help="the sweep's aggregated table (default: the sweep's table.parquet)")
    fit.add_argument(
        "--over", help="parameters to model over, comma-separated (default: the sweep's scaling.over, else nodes)"
    )
    fit.add_argument(
        "--figure",
        action="append",
        help="figures to model (repeatable; default: step_time_s samples_per_s speedup efficiency "
        "cost_node_h_per_epoch, and cost_per_epoch when priced)",
    )
    fit.add_argument(
        "--extrapolate-to",
        action="append",
        default=[],
        metavar="NAME=V,...",
        help="evaluate the models at these (unmeasured) scales: nodes=8,16 (repeatable, one per parameter; "
        "default: the sweep's scaling.at, else 2x and 4x the largest measured value of one parameter)",
    )
    fit.add_argument("--at", action=Renamed, new="--extrapolate-to")
    fit.add_argument("--epoch-samples", type=int, help="samples in an epoch (default: the dataset's training set)")
    fit.add_argument("--price-per-node-hour", type=float, help="price of a node-hour (default: the site file's)")
    fit.add_argument("--site", type=Path, help="a site file (`ddlbench profile slurm`) to take the price from")
    fit.add_argument("--method", choices=("ddlbench", "extrap"), help="model search (default: ddlbench)")
    fit.add_argument(
        "--allow-none",
        action="store_true",
        help="no series to model is not an error: write an empty model list saying why (the workflow's use)",
    )
    fit.add_argument("--format", choices=("table", "json"), default="table")
    fit.add_argument("--out", type=Path, help="write here instead of standard output")
    fit.add_argument("--x", action="append", dest="x_columns", help="CSV mode: a parameter column (repeatable)")
    fit.add_argument("--y", dest="y_column", help="CSV mode: the measured column")
    fit.add_argument(
        "--kind",
        choices=("throughput", "per_device", "amdahl_time", "time", "other"),
        default="other",
        help="CSV mode: what y is, for ddlbench's search: throughput (over the devices, Amdahl's law), "
        "per_device (a rate per device or an efficiency), amdahl_time (p/R-like: linear), time (positive), "
        "other (default)",
    )
    fit.add_argument("values", nargs="*", help="CSV mode: where to predict (e.g. 64 128, or 8,256 for two x)")
    fit.add_argument("--cheapest", action="store_true", help="the cheapest configuration meeting --target")
    fit.add_argument("--target", help="samples_per_s>=N, step_time_s<=S or epoch_time_s<=S")
    fit.set_defaults(handler=_fit)


def _fit(args: argparse.Namespace) -> int:
    if args.x_columns or args.y_column:
        return _fit_csv(args)
    if args.values:
        raise DdlbenchError(
            f"positional values {args.values} are for CSV mode (--x COL --y COL); use --extrapolate-to here"
        )
    import pandas as pd

    from ddlbench.analysis.empirical.modelling import model_series
    from ddlbench.analysis.empirical.series import series_from_table
    from ddlbench.analysis.empirical.sweep_models import DEFAULT_FIGURES, beyond

    sweep = read_sweep(args) if (args.configfile or args.config_json or not args.table) else None
    scaling = sweep.to_dict()["scaling"] if sweep else {}
    over = tuple(
        name.strip() for name in (args.over or ",".join(scaling.get("over", ["nodes"]))).split(",") if name.strip()
    )
    method = args.method or scaling.get("method", "ddlbench")
    table_path = args.table or sweep.sweep_dir / "table.parquet"
    if not table_path.exists():
        raise DdlbenchError(f"no table at {table_path}: run the sweep (or `ddlbench report`) first")
    table = pd.read_parquet(table_path) if table_path.suffix == ".parquet" else pd.read_csv(table_path)
    price = _price(args) or scaling.get("price_per_node_hour")
    epoch_samples = args.epoch_samples or scaling.get("epoch_samples")
    figures = tuple(args.figure or ()) or (*DEFAULT_FIGURES, *(("cost_per_epoch",) if price else ()))
    series = series_from_table(
        table, over=over, figures=figures, epoch_samples=epoch_samples, price_per_node_hour=price
    )
    if not series:
        why = (
            f"no series over {', '.join(over)} with 2 or more measured points in {table_path}; "
            "a sweep needs several values of the parameter, each with a successful record"
        )
        if not args.allow_none:
            raise DdlbenchError(why)
        emit_text(json.dumps({"over": list(over), "models": [], "why": why}, indent=2) + "\n", args.out)
        return 0
    at_specs = args.extrapolate_to or [
        f"{name}={','.join(str(v) for v in values)}" for name, values in scaling.get("at", {}).items()
    ]
    at = _scales(at_specs, over)
    if args.cheapest:
        from ddlbench.analysis.empirical.cheapest import cheapest, parse_target

        target = parse_target(args.target)
        answer = cheapest(series, target, at=at, method=method, epoch_samples=epoch_samples)
        emit_text(json.dumps(answer, indent=2) + "\n" if args.format == "json" else _cheapest_text(answer), args.out)
        return 0 if answer["choices"] else 1
    models = [model_series(s, method=method, at=at or beyond(s)) for s in series]
    if args.format == "json":
        emit_text(json.dumps({"over": list(over), "models": models}, indent=2) + "\n", args.out)
    else:
        emit_text(_models_text(models), args.out)
    return 0


def _price(args: argparse.Namespace) -> float | None:
    if args.price_per_node_hour is not None:
        if not args.price_per_node_hour > 0:
            raise DdlbenchError(f"--price-per-node-hour {args.price_per_node_hour} must be positive")
        return args.price_per_node_hour
    if args.site:
        from ddlbench.launch.resources import load_site

        return load_site(args.site).price_per_node_hour
    return None


def _scales(specs: list[str], over: tuple[str, ...]) -> list[tuple[float, ...]]:
    """--extrapolate-to nodes=8,16 [--extrapolate-to batch_size=64,128] → every combination, in `over`'s order."""
    import itertools

    if not specs:
        return []
    given: dict[str, list[float]] = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        name = name.strip()
        if name not in over:
            raise DdlbenchError(f"--extrapolate-to {spec!r}: {name!r} is not modelled; --over is {', '.join(over)}")
        try:
            given[name] = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise DdlbenchError(f"--extrapolate-to {spec!r}: give numbers, e.g. {name}=8,16") from None
        if not given[name] or min(given[name]) <= 0:
            raise DdlbenchError(f"--extrapolate-to {spec!r}: give positive numbers, e.g. {name}=8,16")
    missing = [name for name in over if name not in given]
    if missing:
        raise DdlbenchError(f"--extrapolate-to gives no value of {', '.join(missing)}; give each of {', '.join(over)}")
    return list(itertools.product(*(given[name] for name in over)))


def _fit_csv(args: argparse.Namespace) -> int:
    import numpy as np

    from ddlbench.analysis.empirical.modelling import describe_fit, predict, search

    if not args.x_columns or not args.y_column:
        raise DdlbenchError("CSV mode needs both --x COL (one or more) and --y COL")
    reader = csv.DictReader(sys.stdin)
    columns = reader.fieldnames or []
    for name in (*args.x_columns, args.y_column):
        if name not in columns:
            raise DdlbenchError(f"column {name!r} not in the CSV on standard input; its columns: {', '.join(columns)}")
    grouped: dict[tuple[float, ...], list[float]] = {}
    for line, row in enumerate(reader, start=2):
        try:
            key = tuple(float(row[name]) for name in args.x_columns)
            value = float(row[args.y_column])
        except (TypeError, ValueError):
            raise DdlbenchError(
                f"line {line}: {[row.get(n) for n in (*args.x_columns, args.y_column)]} are not numbers"
            ) from None
        if not all(math.isfinite(v) for v in (*key, value)) or min(key) <= 0:
            raise DdlbenchError(f"line {line}: parameters must be positive and values finite")
        grouped.setdefault(key, []).append(value)
    if len(grouped) < 2:
        raise DdlbenchError(f"{len(grouped)} distinct x in the CSV: a model needs at least 2")
    keys = sorted(grouped)
    x = np.asarray(keys, dtype=float)
    names = tuple(args.x_columns)
    method = args.method or "ddlbench"
    fit = search(names, x, [grouped[k] for k in keys], method, args.kind)
    at = []
    for text in args.values:
        try:
            at.append(tuple(float(v) for v in text.split(",")))
        except ValueError:
            raise DdlbenchError(f"{text!r} is not a point: give numbers, comma-separated for several x") from None
        if len(at[-1]) != len(names):
            raise DdlbenchError(f"{text!r} has {len(at[-1])} values; give one per --x ({', '.join(names)})")
    summary = describe_fit(fit)
    print(
        f"model ({method}): {args.y_column} = {summary['formula']}  [{summary['points']} points, "
        f"{summary['observations']} observations, LOO SMAPE {_pct(summary['cv_smape_percent'])}, "
        f"s = {_num(summary['residual_sd'])}; band: {_band_text(summary)}]",
        file=sys.stderr,
    )
    for prediction in predict(fit, x, at):
        band = (
            "" if prediction.low is None and prediction.high is None else f" {_g(prediction.low)} {_g(prediction.high)}"
        )
        print(f"{','.join(f'{v:g}' for v in prediction.x)} {prediction.value:.6g}{band}")
    return 0


def _models_text(models: list[dict[str, Any]]) -> str:
    lines = []
    for m in models:
        lines.append(
            f"{m['label']} — {m['figure']} ({m['unit'] or 'ratio'}) over {', '.join(m['parameters'])}: {m['formula']}"
        )
        lines.append(
            f"  {m['points']} points, {m['observations']} observations; SMAPE {_pct(m['smape_percent'])} in-sample, "
            f"{_pct(m['cv_smape_percent'])} leave-one-out; s = {_num(m['residual_sd'])}"
        )
        if m["measured"] and all(point["n"] < 2 for point in m["measured"]):
            lines.append("  one launch per configuration: the band is the model's misfit, not run-to-run")
        for p in m["predictions"]:
            band = (
                "no band (too few observations)"
                if p["low"] is None and p["high"] is None
                else f"95 % PI [{_num(p['low'])}, {'∞' if p['high'] is None else _num(p['high'])}]"
            )
            where = "" if p["beyond"] <= 1 else f", extrapolated ×{p['beyond']:.3g}"
            lines.append(f"  at {', '.join(f'{v:g}' for v in p['x'])}: {p['value']:.4g} {band}{where}")
    return "\n".join(lines) + "\n"


def _cheapest_text(answer: dict[str, Any]) -> str:
    lines = [f"target: {answer['target']}"]
    if answer.get("band"):
        lines.append(f"bands: {answer['band']}; nothing is claimed across a band without one")
    if not answer["choices"]:
        lines.append("no candidate meets the target: " + answer.get("why", ""))
    for choice in answer["choices"]:
        if choice["sure"]:
            verdict = "meets it across its band (95 % PI over launches)"
        elif choice["band"] != "95 % prediction interval over launches":
            verdict = f"meets it on the central value ({choice['band']})"
        else:
            verdict = "meets it on the central value only"
        lines.append(
            f"{choice['label']} at {choice['x']:g} (global batch {choice['global_batch_size']}): {choice['figure']} "
            f"{choice['value']:.4g} (95 % PI [{_num(choice['low'])}, {_num(choice['high'])}]), cost "
            f"{choice['cost_node_h_per_epoch']:.4g} node-h/epoch; {verdict}"
        )
    for refused in answer.get("refused", []):
        lines.append(f"{refused['label']} at {refused['x']:g}: not a configuration ({refused['why']})")
    return "\n".join(lines) + "\n"


def _g(value: float | None) -> str:
    return "nan" if value is None else f"{value:.6g}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} %"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _band_text(summary: dict) -> str:
    """What the printed band is: the 95 % prediction interval, and beyond the fitted scales that interval
    widened to at least ±spread of the prediction per doubling (ddlbench.analysis.empirical.selection
    calibrates the spread on held-out public series)."""
    spread = summary.get("band_spread")
    if not spread:
        return "95 % prediction interval"
    return (
        f"95 % prediction interval; beyond the fitted scales at least ×(1 ± {spread:g}) per doubling, "
        "calibrated to hold 95 % of held-out public measurements"
    )
