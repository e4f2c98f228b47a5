"""`ddlbench model-table` (and the analytical model's other commands): what a model is, layer by layer.

Each command adds its parser in its own `_add_<command>` function, called from `add_commands`, and
imports torch, where it needs it, only inside its handler: `ddlbench --help` stays torch-free and fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ddlbench.errors import DdlbenchError

log = logging.getLogger(__name__)

TABLE_FORMATS = ("table", "csv", "net", "json")


def add_commands(commands: Any) -> None:
    """Register the analytical model's subcommands on the `ddlbench` parser's subparsers."""
    _add_model_table(commands)


def _add_model_table(commands: Any) -> None:
    parser = commands.add_parser(
        "model-table",
        help="per-layer shapes, parameters, FLOPs and saved activations of a model on a dataset (one sample)",
        description="Build the model on the meta device (no memory, no arithmetic) and probe one training step: "
        "per layer and per block (the top-level children pipelines cut at) the shapes, parameters, forward and "
        "backward FLOPs (torch's FlopCounterMode) and bytes saved for backward, per sample.",
    )
    parser.add_argument("model", help="a model of the zoo (see `ddlbench plan`'s config docs)")
    parser.add_argument("dataset", help="a dataset whose inputs the model takes")
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
        "table (what `ddlbench.analysis.analytic.layers.ModelTable.from_json` reads)",
    )
    parser.add_argument("--out", type=Path, help="write here (atomically) instead of to standard output")
    parser.set_defaults(handler=_model_table)


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


def _model_table(args: argparse.Namespace) -> int:
    from ddlbench.analysis.analytic.layers import render_csv, render_net, render_table, resolve_request

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
