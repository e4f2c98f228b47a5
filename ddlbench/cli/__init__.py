"""The `ddlbench` command: its parser, assembled from one module per group of commands, and `main`.

    sweep     plan, status, report                      (Run a sweep)
    slurm     profile, submit, rerun                    (On SLURM)
    predict   calibrate, predict, oracle, model-table   (Predict: the analytic model)
    scaling   fit                                       (Scaling models: empirical)
    certify   certify                                   (Certify)
    history   history, compare                          (History)
    internal  run-point, run-group, run-packed, sample: what the workflows call

`ddlbench --help` lists the user's commands by section; the internal ones are runnable and each has its
help, but stay off that list. Every command that needs a sweep takes it as a YAML file (--configfile, the
embedded default when absent) or as resolved JSON (--config-json, what the Snakefile passes). Handlers
import what they need when they run, so that building the parser, planning and reporting never import
torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import ddlbench
from ddlbench.cli import certify, history, internal, predict, scaling, slurm, sweep
from ddlbench.cli.common import INTERNAL, LAUNCHERS, CommandParser, HelpFormatter
from ddlbench.errors import DdlbenchError

__all__ = ["LAUNCHERS", "build_parser", "main"]

DESCRIPTION = """\
ddlbench measures distributed deep-learning training. A sweep (a YAML file: models, datasets, strategies,
node counts, batch sizes) expands into points; each point trains for a few steps on local processes or on
SLURM nodes and writes a versioned record, and the records become a table and an HTML report. Around the
measurements, ddlbench predicts step time and memory from a calibrated machine file (the analytic model),
fits empirical scaling models to what was measured, certifies a partition against reference figures, and
keeps every run in a results database to compare. A sweep usually runs through Snakemake (`snakemake
--cores 2` here, `snakemake --profile slurm` on a cluster), which calls these commands in turn."""

# the sections of `ddlbench --help`, in order; each command module names its own
SECTIONS = (
    sweep.SECTION,
    slurm.SECTION,
    predict.SECTION,
    scaling.SECTION,
    certify.SECTION,
    history.SECTION,
)
GROUPS = (sweep, slurm, predict, scaling, certify, history, internal)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddlbench", usage="%(prog)s [-h] [--version] [-q] COMMAND ...", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"ddlbench {ddlbench.__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    commands = parser.add_subparsers(
        prog="ddlbench", required=True, metavar="COMMAND", parser_class=CommandParser, help=argparse.SUPPRESS
    )
    for group in GROUPS:
        group.add_commands(commands)
    parsers: dict[str, CommandParser] = commands.choices
    unknown = sorted({p.section for p in parsers.values()} - {*SECTIONS, INTERNAL})
    if unknown:
        raise RuntimeError(f"commands in sections ddlbench --help does not show: {unknown}")
    parser.description = f"{DESCRIPTION}\n\n{_sections_text(parsers)}"
    internals = ", ".join(name for name, p in parsers.items() if p.section == INTERNAL)
    parser.epilog = (
        f"Internal commands (the steps the workflows run; each has its --help): {internals}.\n\n"
        "`ddlbench COMMAND --help` says what a command does, with an example."
    )
    return parser


def _sections_text(parsers: dict[str, CommandParser]) -> str:
    width = max(len(name) for name in parsers) + 2
    blocks = []
    for section in SECTIONS:
        lines = [f"  {name:<{width}}{p.summary}" for name, p in parsers.items() if p.section == section]
        blocks.append("\n".join([f"{section}:", *lines]))
    return "\n\n".join(blocks)
