"""Predict with the analytic model: `ddlbench calibrate` (measure a machine into a machine file),
`ddlbench predict` (a sweep's points from a machine file, before anything runs), `ddlbench oracle` (rank
the strategies for a model) and `ddlbench model-table` (what a model is, layer by layer, the tables the
model reads).

These are the analytic model only; the empirical scaling models of measured figures are `ddlbench fit`
(ddlbench.cli.scaling). The machine file is `ddlbench calibrate`'s, or a datasheet one for hardware not
owned yet (workflow/machines/). Torch is imported, where a command needs it, only inside its handler.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ddlbench.cli.common import LAUNCHERS, add_sweep_options, emit_text, read_sweep
from ddlbench.errors import DdlbenchError

log = logging.getLogger(__name__)

SECTION = "Predict (analytic model)"
TABLE_FORMATS = ("table", "csv", "net", "json")


def add_commands(commands: Any) -> None:
    _add_calibrate(commands)
    _add_predict(commands)
    _add_oracle(commands)
    _add_model_table(commands)


def _add_calibrate(commands: Any) -> None:
    calibrate = commands.add_parser(
        "calibrate",
        section=SECTION,
        summary="measure this machine into a machine file (FLOP/s, bandwidth, α–β of collectives)",
        description="Measure this machine (or the allocation's nodes) with a calibration suite of "
        "microbenchmarks: matrix products and convolutions per precision, memory bandwidth, collectives over "
        "message sizes, layer timings of whole models and generic operators. The figures are fitted into a "
        "machine file (YAML) that `ddlbench predict` and `ddlbench oracle` read, with an HTML report of the "
        "curves against their fits.",
        example=[
            "ddlbench calibrate --out machine.yaml",
            "ddlbench calibrate --configfile workflow/calibration/layer_timings.yaml --out machine.yaml",
        ],
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
    calibrate.add_argument(
        "--like",
        type=Path,
        metavar="SWEEP",
        help="with --submit: calibrate where this sweep's points run (its `slurm:` partition and memory per rank)",
    )
    calibrate.add_argument("--out", type=Path, required=True, help="the machine file to write (YAML)")
    calibrate.add_argument("--report", type=Path, help="HTML report (default: beside the suite's records)")
    calibrate.add_argument(
        "--launcher",
        default="auto",
        choices=LAUNCHERS,
        help="as for run-point: srun inside a SLURM allocation, else local (mpirun for MPI points)",
    )
    calibrate.add_argument("--cores", type=int, help="cores granted (a local point needing more is refused)")
    calibrate.set_defaults(handler=_calibrate)


def _add_predict(commands: Any) -> None:
    predict = commands.add_parser(
        "predict",
        section=SECTION,
        summary="predict a sweep's points with the analytic model: step time, samples/s, memory",
        description="Predict, with the analytic model, every point of a sweep (or those given): step time and "
        "its parts (compute, exposed communication, pipeline bubble), samples/s and peak memory per rank, from "
        "a machine file and each model's layer table; nothing runs and nothing measured is read. This is the "
        "analytic model only: for empirical scaling models fitted to measured figures, see `ddlbench fit`.",
        example="ddlbench predict --configfile workflow/config/default.yaml "
        "--machine workflow/machines/dgx_h100_4ndr.yaml",
    )
    add_sweep_options(predict)
    predict.add_argument(
        "--machine", type=Path, required=True, help="machine file (ddlbench calibrate --out, or workflow/machines/)"
    )
    predict.add_argument(
        "--point", action="append", default=[], metavar="ID", help="only this point of the sweep (repeatable)"
    )
    predict.add_argument("--format", choices=("table", "csv", "json"), default="table")
    predict.add_argument("--out", type=Path, help="write here (atomically) instead of standard output")
    predict.add_argument(
        "--memory-per-device", type=_bytes, help="memory one rank may use (default: the machine file's)"
    )
    predict.set_defaults(handler=_predict)


def _add_oracle(commands: Any) -> None:
    oracle = commands.add_parser(
        "oracle",
        section=SECTION,
        summary="rank the strategies for a model at each node count and recommend one",
        description="Rank every strategy (or those given) for one model and dataset at each node count by the "
        "analytic model's predicted samples/s, leave out those that do not fit in memory, and recommend one; "
        "nothing runs.",
        example="ddlbench oracle --model resnet50 --dataset imagenet --machine workflow/machines/dgx_h100_4ndr.yaml "
        "--nodes 1,2,4,8",
    )
    oracle.add_argument("--model", required=True, help="a model of the catalog, e.g. resnet50")
    oracle.add_argument("--dataset", required=True, help="a dataset whose inputs the model takes, e.g. imagenet")
    oracle.add_argument("--machine", type=Path, required=True, help="machine file (ddlbench calibrate --out)")
    oracle.add_argument("--nodes", type=_node_list, default=[1], help="node counts, comma-separated (default 1)")
    oracle.add_argument("--ranks-per-node", type=int, help="default: the machine's devices per node")
    oracle.add_argument(
        "--global-batch",
        type=int,
        help="samples per step of the whole job (default: the model's default batch × ranks)",
    )
    oracle.add_argument("--threads", type=int, default=1, help="threads per rank (CPU machines)")
    oracle.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"))
    oracle.add_argument(
        "--memory-per-device", type=_bytes, help="memory one rank may use (default: the machine file's)"
    )
    oracle.add_argument("--strategy", action="append", default=[], help="only these strategies (repeatable)")
    oracle.add_argument("--format", choices=("table", "json"), default="table")
    oracle.add_argument("--out", type=Path, help="write here (atomically) instead of standard output")
    oracle.set_defaults(handler=_oracle)


def _add_model_table(commands: Any) -> None:
    parser = commands.add_parser(
        "model-table",
        section=SECTION,
        summary="a model's layers: shapes, parameters, FLOPs, saved activations (per sample)",
        description="Build the model on the meta device (no memory, no arithmetic) and probe one training step: "
        "per layer and per block (the top-level children pipelines cut at) the shapes, parameters, forward and "
        "backward FLOPs (torch's FlopCounterMode) and bytes saved for backward, per sample: what the analytic "
        "model reads of a model.",
        example=[
            "ddlbench model-table resnet8 cifar10",
            "ddlbench model-table resnet8 cifar10 --option norm=group --format csv",
        ],
    )
    parser.add_argument("model", help="a model of the catalog, e.g. resnet8")
    parser.add_argument("dataset", help="a dataset whose inputs the model takes, e.g. cifar10")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a model option (repeatable), e.g. norm=group; unset options take their defaults",
    )
    parser.add_argument(
        "--format",
        choices=TABLE_FORMATS,
        default="table",
        help="table: fixed-width text; csv: one row per layer; net: ParaDL's .net layer file; json: the whole "
        "table (what `ddlbench.catalog.model_table.ModelTable.from_json` reads)",
    )
    parser.add_argument("--out", type=Path, help="write here (atomically) instead of to standard output")
    parser.set_defaults(handler=_model_table)


def _bytes(text: str) -> int:
    """'80e9', '80GB', '16GiB', '512MiB' → bytes."""
    units = {
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
        "kb": 1e3,
        "mb": 1e6,
        "gb": 1e9,
        "tb": 1e12,
        "b": 1,
    }
    lowered = text.strip().lower()
    number, factor = lowered, 1.0
    for unit, size in units.items():
        if lowered.endswith(unit):
            number, factor = lowered[: -len(unit)], size
            break
    try:
        value = float(number) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write bytes (8e10) or with a unit (80GB, 16GiB)"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a memory size must be positive")
    return int(value)


def _node_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give node counts as integers, e.g. 1,2,4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: node counts must be ≥ 1")
    return values


def parse_options(pairs: list[str]) -> dict[str, str]:
    """`--option KEY=VALUE` arguments as a mapping; a malformed or repeated one is an error."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DdlbenchError(f"--option {pair!r}: expected KEY=VALUE, e.g. norm=group")
        if key in options:
            raise DdlbenchError(f"--option {key} given twice ({options[key]!r} and {value!r})")
        options[key] = value
    return options


def _predict(args: argparse.Namespace) -> int:
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict_all
    from ddlbench.analysis.analytic.render import predictions_csv, predictions_json, predictions_table
    from ddlbench.sweep import expand_sweep

    config = read_sweep(args)
    machine = MachineModel.from_file(args.machine)
    points = list(expand_sweep(config).points)
    if args.point:
        known = {p.point_id: p for p in points}
        unknown = [pid for pid in args.point if pid not in known]
        if unknown:
            sample = ", ".join(list(known)[:5]) + (" …" if len(known) > 5 else "")
            raise DdlbenchError(f"--point {unknown[0]!r} is not a point of sweep {config.name!r}; its points: {sample}")
        points = [known[pid] for pid in args.point]
    predictions = predict_all([Setting.of_point(p) for p in points], machine, memory_per_device=args.memory_per_device)
    if args.format == "csv":
        text = predictions_csv(predictions)
    elif args.format == "json":
        text = predictions_json(predictions, machine=machine.name)
    else:
        text = predictions_table(predictions, machine=machine.name)
    emit_text(text, args.out)
    return 0


def _oracle(args: argparse.Namespace) -> int:
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.oracle import consult
    from ddlbench.analysis.analytic.render import verdicts_json, verdicts_table
    from ddlbench.catalog import DATASETS, MODELS, STRATEGIES

    MODELS.get(args.model)  # unknown names fail here with the list of known ones
    DATASETS.get(args.dataset)
    for name in args.strategy:
        STRATEGIES.get(name)
    if MODELS.get(args.model).input_kind != DATASETS.get(args.dataset).input_kind:
        raise DdlbenchError(
            f"{args.model} takes {MODELS.get(args.model).input_kind} input; "
            f"{args.dataset} gives {DATASETS.get(args.dataset).input_kind}"
        )
    machine = MachineModel.from_file(args.machine)
    verdicts = consult(
        args.model, args.dataset, machine, nodes=args.nodes, ranks_per_node=args.ranks_per_node,
        global_batch=args.global_batch, threads=args.threads, precision=args.precision,
        memory_per_device=args.memory_per_device, strategies=args.strategy or None,
    )  # fmt: skip
    if args.format == "json":
        text = verdicts_json(verdicts, machine=machine.name)
    else:
        text = verdicts_table(verdicts, model=args.model, dataset=args.dataset, machine=machine.name)
    emit_text(text, args.out)
    return 0


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
    if args.like is not None and not args.submit:
        raise DdlbenchError("--like goes with --submit: it says where the submitted points run")
    if args.submit:
        from ddlbench.calibrate import submit_suite

        like = None
        if args.like is not None:
            from ddlbench.config import load_sweep_config

            like = load_sweep_config(args.like)
        submit_suite(args.configfile, raw=raw, site_path=args.site, like=like)
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


def _model_table(args: argparse.Namespace) -> int:
    from ddlbench.analysis.analytic.layers import render_csv, render_net, render_table
    from ddlbench.catalog.model_table import resolve_request

    options = parse_options(args.option)
    resolve_request(args.model, args.dataset, options)  # a bad name or option fails before torch is imported

    from ddlbench.train.introspect import build_model_table

    table = build_model_table(args.model, args.dataset, options)
    if args.format == "json":
        text = json.dumps(table.to_json(), indent=1) + "\n"
    else:
        text = {"table": render_table, "csv": render_csv, "net": render_net}[args.format](table)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    from ddlbench.atomic import write_text_atomic

    write_text_atomic(args.out, text)
    log.info("model table of %s on %s (%s) -> %s", args.model, args.dataset, args.format, args.out)
    return 0
