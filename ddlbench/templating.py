"""Where the jinja2 templates live, and the environment that renders them (reports, SLURM profiles)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import jinja2

import ddlbench


def templates_dir() -> Path:
    """The repository's templates/ in a checkout; the copy packed into the wheel otherwise."""
    checkout = Path(ddlbench.__file__).resolve().parents[1] / "templates"
    return checkout if checkout.is_dir() else Path(str(files("ddlbench") / "_templates"))


def template_environment(*, autoescape: bool) -> jinja2.Environment:
    """HTML templates escape every value; YAML templates quote values themselves with `tojson`."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
