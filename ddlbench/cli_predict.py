"""`ddlbench predict` and `ddlbench oracle`: the analytical model's figures before anything runs.

Both read a machine file (`ddlbench calibrate`'s, or a datasheet one for hardware not owned yet) and
build each model's table from the real model on torch's meta device (no memory, no arithmetic).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlbench.errors import DdlbenchError


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


def add_commands(
    commands: Any, add_sweep_options: Callable[[argparse.ArgumentParser], None], read_sweep: Callable
) -> None:
    predict = commands.add_parser(
        "predict", help="predict every point of a sweep (or some): step time and its parts, samples/s, memory per rank"
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
    predict.set_defaults(handler=lambda args: _predict(args, read_sweep))

    oracle = commands.add_parser("oracle", help="rank the strategies for a model at each node count and recommend one")
    oracle.add_argument("--model", required=True)
    oracle.add_argument("--dataset", required=True)
    oracle.add_argument("--machine", type=Path, required=True)
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
    oracle.add_argument("--out", type=Path)
    oracle.set_defaults(handler=_oracle)


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    """Columns of text, left-aligned to the widest cell (plan, history, compare)."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def emit_text(text: str, out: Path | None) -> None:
    """A command's output: to standard output, or atomically to `out` (shared by predict, oracle and fit)."""
    if out is None:
        print(text, end="")
        return
    from ddlbench.atomic import write_text_atomic

    write_text_atomic(out, text)
    print(f"written: {out}")


def _predict(args: argparse.Namespace, read_sweep: Callable) -> int:
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
