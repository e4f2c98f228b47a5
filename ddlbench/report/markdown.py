"""The report's summary as Markdown (report.md beside report.html), for terminals and tickets: the best
strategy per model × dataset × scale, failed points by cause, the machine's health, and a short
provenance. Headings come from the same mapping as the page's (ddlbench.report.columns).

Every name from a config, a record or a certificate goes through `md_text`, which backslash-escapes the
characters Markdown reads as markup (CommonMark lets any ASCII punctuation be escaped so) and writes
&, < and > as entities, so a model, reason or figure name shows as text and never as a link, an image,
HTML or a broken table.
"""

from __future__ import annotations

import re
from typing import Any

from ddlbench.report.columns import title
from ddlbench.report.figures import number
from ddlbench.report.health import health_lines

MARKUP = set("\\`*_[]|~")  # inline markup anywhere in a line
ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}  # no raw HTML, even for renderers that ignore escapes
LEADING = re.compile(r"^([#+=-]|\d+[.)])")  # block markup at a line's start: heading, list, setext line
MAX_ROWS = 100  # rows of a table before the rest is left to report.html


def md_text(value: Any, *, line_start: bool = False) -> str:
    """`value` as literal Markdown text on one line; `line_start`: it begins a line (or a list item), where
    a leading '#', '-', '+', '=' or '1.' would start a block."""
    text = "".join(
        ENTITIES.get(char) or (f"\\{char}" if char in MARKUP else char) for char in " ".join(str(value).split())
    )
    found = LEADING.match(text) if line_start else None
    return f"{text[: found.end() - 1]}\\{text[found.end() - 1 :]}" if found else text


def _table(keys: list[str], rows: list[list[str]], *, more: str = "") -> list[str]:
    out = ["| " + " | ".join(md_text(title(key)) for key in keys) + " |", "|" + "---|" * len(keys)]
    shown = rows[:MAX_ROWS]
    out += ["| " + " | ".join(cells) + " |" for cells in shown]
    if len(rows) > MAX_ROWS:
        out.append("")
        out.append(f"{len(rows) - MAX_ROWS} more rows {more}".rstrip() + ".")
    return out


def render_markdown(context: dict[str, Any]) -> str:
    """The summary from the report's context (ddlbench.report.render)."""
    config = context["config"]
    counts = ", ".join(f"{status} {n}" for status, n in context["counts"].items())
    lines = [
        f"# ddlbench report: {md_text(config.name)}",
        "",
        f"{context['total']} points ({counts}), {context['configurations']} configurations with figures. "
        f"Generated {context['generated']} by ddlbench {md_text(context['version'])}; "
        f"config hash {md_text(context['config_hash'][:16])}; measurement version {context['measurement_version']}.",
        "",
        "## Machine health",
        "",
        *(md_text(line, line_start=True) for line in health_lines(context["health"])),
    ]
    health = context["health"]
    if health.get("exists") and not health.get("error") and health["failing"]:
        keys = ["figure_name", "node", "status", "value", "band", "deviation"]
        lines += ["", *_table(keys, [[md_text(row[k]) for k in keys] for row in health["failing"]])]
    if health.get("exists") and not health.get("error") and health["regressions"]:
        keys = ["name", "value", "previous_value", "change", "previous_run"]
        rows = [[md_text(row[k]) for k in keys] for row in health["regressions"]]
        lines += ["", "Regressions:", "", *_table(["figure_name", *keys[1:]], rows)]
    lines += ["", "## Best strategy", ""]
    if context.get("one_host"):
        lines += [f"Note: {md_text(context['one_host_note'])}.", ""]
    if context.get("left_out"):
        lines += [f"Left out of best strategy: {md_text(', '.join(context['left_out']))}.", ""]
    for head in context["headlines"]:
        lines.append(f"- {_headline(head)}")
    if context["best"]:
        keys = ["model", "dataset", "scale", "winner", "samples_per_s", "runner_up", "margin", "verdict"]
        rows = [_best_cells(row) for row in context["best"]]
        lines += ["", *_table([*keys, "cost_node_h", "basis"], rows, more="in report.html")]
        lines += ["", md_text(context["family_note"])]
    elif not context["headlines"]:
        lines.append("No configuration has figures yet.")
    lines += ["", "## Failed points by cause", ""]
    if context["failures"]:
        keys = ["status", "cause", "count", "examples"]
        rows = [
            [md_text(r["status"]), md_text(r["cause"]), str(r["count"]), md_text(", ".join(r["examples"]))]
            for r in context["failures"]
        ]
        lines += _table(keys, rows, more="in report.html")
    else:
        lines.append("None: every point ran to the end.")
    lines += ["", "## Provenance", ""]
    lines += [f"- {md_text(key, line_start=True)}: {md_text(value)}" for key, value in context["provenance"].items()]
    return "\n".join(lines) + "\n"


def _headline(head: dict[str, Any]) -> str:
    """The model × dataset's answer: the cells each strategy won, then one line per cell (who is fastest
    there, with the launches' verdict, or that they cannot tell); names escaped, figures as they are."""
    text = f"{md_text(head['model'], line_start=True)} on {md_text(head['dataset'])}: {md_text(head['tally'])}"
    return text + "." + "".join(f"\n  - {md_text(line)}." for line in head["answers"])


def _best_cells(row: dict[str, Any]) -> list[str]:
    """A row of the best-strategy table; names escaped, figures (ours, numbers only) as they are."""
    winner, runner = row["winner"], row["runner_up"]
    return [
        md_text(row["model"]),
        md_text(row["dataset"]),
        row["scale"],
        (md_text(winner.label) if row["strategies"] > 1 else f"only {md_text(winner.label)}") if winner else "",
        winner.text if winner else "",
        f"{md_text(runner.label)}: {runner.text}" if runner else "—",
        f"{row['margin']:.3g}" if row["margin"] else "—",
        md_text(row["verdict"]),
        number(row["cost_node_h"]),
        row["basis"],
    ]
