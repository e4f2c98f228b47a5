"""What the command groups share: the parser class that carries a command's section and example, the
sweep options, and the table and file output of several commands.

Imports stay light (argparse, the config): building the parser must not import torch.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddlbench.config import DEFAULT_SWEEP, SweepConfig, load_sweep_config, sweep_config_from_mapping
from ddlbench.errors import DdlbenchError

# ddlbench.launch.launchers.LAUNCHERS, spelled out here so that building the parser imports no launcher
LAUNCHERS = ("auto", "local", "srun", "mpirun")
INTERNAL = "internal"  # the section of what the workflows call; kept out of `ddlbench --help`'s list


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Fills a description's paragraphs to the terminal's width and keeps indented lines (examples,
    command lists) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.strip("\n").split("\n\n"):
            if any(line.startswith(" ") for line in block.splitlines()):
                blocks.append("\n".join(indent + line for line in block.splitlines()))
            else:
                words = " ".join(block.split())
                blocks.append(
                    textwrap.fill(words, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)
                )
        return "\n\n".join(blocks)


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its one-line summary and its section in `ddlbench --help`, and an example
    invocation (or several) shown under its own help."""

    def __init__(
        self,
        *args: Any,
        section: str = "",
        summary: str = "",
        example: str | Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        examples = [example] if isinstance(example, str) else list(example)
        if examples:
            kwargs.setdefault("epilog", "example:\n" + "\n".join(f"  {line}" for line in examples))
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.section = section
        self.summary = summary


class Renamed(argparse.Action):
    """An option that was renamed: refused with one line naming the new spelling (exit status 2)."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        kwargs.setdefault("nargs", "?")
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.exit(2, f"{parser.prog}: error: {option} is now {self.new}\n")


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--configfile",
        type=Path,
        help=f"sweep YAML (default: {DEFAULT_SWEEP.relative_to(DEFAULT_SWEEP.parents[2])})",
    )
    group.add_argument("--config-json", help="the sweep as JSON (what the Snakefile passes)")


def read_sweep(args: argparse.Namespace) -> SweepConfig:
    """The sweep of --config-json, else of --configfile, else the embedded default."""
    if args.config_json:
        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise DdlbenchError(f"--config-json is not valid JSON: {exc}") from None
        return sweep_config_from_mapping(raw)
    return load_sweep_config(args.configfile or DEFAULT_SWEEP)


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
