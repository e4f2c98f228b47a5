"""A model × dataset's samples per joule against nodes, a line per series as its throughput chart has; or,
where no point could read its energy, the records' note saying why ("not measurable here: no NVML, no RAPL").

Each configuration's mark is its median repetition's samples_per_j (ddlbench.analysis.energy: global samples
of the measured window ÷ the GPUs' energy over it), its bar ± samples_per_j_uncertainty (the counters'
update period at both ends of the window, not a confidence interval).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from markupsafe import Markup

from ddlbench.report.charts import Axis, Line, Mark, colour, line_chart
from ddlbench.report.figures import missing, number

NOT_READ = "not measured: records from before energy was read"
LOG_SPAN = 4.0  # node counts spanning this factor or more get a logarithmic axis (as ddlbench.report.sections)


def energy_block(lines: list[tuple[str, list[dict[str, Any]]]], points: pd.DataFrame, node_label: str) -> dict:
    """{"svg": the chart or None, "note": the records' energy notes}. `lines`: (label, configuration rows
    sorted by nodes) per drawn series (ddlbench.report.sections); `points`: the model × dataset's points."""
    drawn = []
    for index, (label, rows) in enumerate(lines):
        marks = tuple(_mark(row, label) for row in rows if not missing(row.get("samples_per_j")))
        drawn.append(Line(label=label, colour=colour(index), marks=marks))
    note = energy_notes(points)
    if not any(line.marks for line in drawn):
        return {"svg": None, "note": note}
    nodes = [m.x for line in drawn for m in line.marks]
    x_log = max(nodes) / min(nodes) >= LOG_SPAN
    x_axis = Axis(label=node_label, log=x_log, base=2, from_zero=False, ticks_at_values=not x_log)
    svg = line_chart(drawn, title="Samples per joule", x=x_axis, y=Axis(label="samples/J"))
    return {"svg": Markup(svg), "note": note}


def energy_notes(points: pd.DataFrame) -> str:
    """The distinct energy notes of the ok points, '; '-joined; NOT_READ where their records hold none."""
    if "energy_note" not in points.columns:
        return NOT_READ
    ok = points[points["status"] == "ok"]
    notes = sorted({str(note) for note in ok["energy_note"] if not missing(note) and str(note)})
    return "; ".join(notes) if notes else NOT_READ


def _mark(row: dict[str, Any], label: str) -> Mark:
    value = float(row["samples_per_j"])
    spread = row.get("samples_per_j_uncertainty")
    low, high = (None, None) if missing(spread) else (value - float(spread), value + float(spread))
    nodes = int(row["nodes"])
    text = f"{number(value)} ± {number(spread)}" if low is not None else number(value)
    return Mark(x=float(nodes), y=value, low=low, high=high, note=f"{label}, {nodes} node(s): {text} samples/J")
