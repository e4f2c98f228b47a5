"""One section per model × dataset: throughput, speedup, efficiency and memory per rank against nodes,
samples per joule against nodes or why energy was not measured (ddlbench.report.energy),
throughput against the study's axes (threads, ranks per node, batch per replica) where the sweep varies
them, and views of the configurations' tables (figures, phases, stragglers).

A line is a series: a configuration over nodes, every other setting fixed (ddlbench.analysis.keys).
With at most MAX_LINES series every one is drawn; with more, each strategy's best series: the one with
the highest throughput at its largest node count (the tables below list them all). Axes are logarithmic
where the data span a factor of 4 or more (log2 for nodes and the study axes). A chart draws one level
of statistics for all its marks (ddlbench.report.summary.basis): over repetitions when every
configuration of the model × dataset has ≥ 6, else over steps; speedup and efficiency are the table's,
from medians over repetitions, drawn over the series a reader compares (equal global batch over nodes where
the sweep kept one, else equal per-replica batch: ddlbench.analysis.configurations.add_scaling), a line per
such series with two node counts or more; with none, they are left out and the section says why.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from markupsafe import Markup

from ddlbench.analysis.keys import describe, varying_fields
from ddlbench.report.charts import Axis, Line, Mark, colour, line_chart
from ddlbench.report.data import OVERVIEW, PHASE_VIEW, STRAGGLER_VIEW
from ddlbench.report.energy import energy_block
from ddlbench.report.figures import missing, number
from ddlbench.report.summary import BASIS_TEXT, basis, throughput
from ddlbench.report.tables import view

MAX_LINES = 8
LOG_SPAN = 4.0  # data spanning this factor or more get a logarithmic axis
STUDY_AXES = {"threads": "threads per rank", "ranks_per_node": "ranks per node", "batch_size": "batch per replica"}
GREY = "#888888"


ONE_HOST_NODES = "nodes (processes on one host)"


def pair_section(
    model: str,
    dataset: str,
    pair: pd.DataFrame,
    *,
    start: int,
    stop: int,
    points: pd.DataFrame,
    table_keys: set[str],
    one_host: bool = False,
) -> dict[str, Any]:
    """The section's context: its lead, charts and legend, study charts and table views. `pair`: its rows of
    the configurations' table (ddlbench.report.data.configurations_frame), rows [start, stop) of it.
    `one_host`: every point ran on one host, so the node axis says its nodes are processes there."""
    node_label = ONE_HOST_NODES if one_host else "nodes"
    statuses = points["status"].value_counts().to_dict()
    failed = sum(n for status, n in statuses.items() if status != "ok")
    section: dict[str, Any] = {
        "title": f"{model} on {dataset}",
        "model": model,
        "dataset": dataset,
        "points": len(points),
        "failed": failed,
        "configurations": len(pair),
        "strategies": sorted({str(s) for s in pair["strategy"]}) if len(pair) else [],
        "charts": [],
        "legend": [],
        "study": [],
        "views": [],
        "basis": "",
        "selection": "",
        "drawings": [],
        "predicted": None,
        "scaling": None,
        "energy": None,
    }
    if pair.empty:
        nodes = Axis(label=node_label, from_zero=False)
        section["charts"] = [Markup(line_chart([], title="Throughput", x=nodes, y=Axis(label="samples/s")))]
        return section
    level = basis(pair)
    section["basis"] = BASIS_TEXT[level]
    lines, note = _series(pair, level)
    section["selection"] = note
    section["legend"] = [{"label": label, "colour": colour(i)} for i, (label, _) in enumerate(lines)]
    section["charts"] = [Markup(svg) for svg in _node_charts(lines, level, node_label)]
    section["scaling_note"] = scaling_note(pair)
    section["energy"] = energy_block(lines, points, node_label)  # samples per joule, or why not measured
    section["study"] = _study_charts(pair, level)

    def shown(keys: list[str]) -> list[str]:
        return [key for key in keys if key in table_keys]

    section["views"].append(("Configurations", view("configs", shown(OVERVIEW), start=start, stop=stop)))
    if "phase_forward_s" in table_keys and pair["phase_forward_s_median"].notna().any():
        section["views"].append(("Inside the steps", view("configs", shown(PHASE_VIEW), start=start, stop=stop)))
    if "straggler_rank" in table_keys and pair["straggler_rank"].notna().any():
        section["views"].append(("Stragglers", view("configs", shown(STRAGGLER_VIEW), start=start, stop=stop)))
    return section


def _prefix(level: str) -> str:
    return "rep_samples_per_s" if level == "repetitions" else "samples_per_s"


def _series(pair: pd.DataFrame, level: str) -> tuple[list[tuple[str, list[dict[str, Any]]]], str]:
    """(label, rows sorted by nodes) per drawn series, and a sentence saying which series are drawn."""
    prefix = _prefix(level)
    by_series: dict[str, list[dict[str, Any]]] = {}
    for row in pair.to_dict("records"):
        by_series.setdefault(str(row["series_key"]), []).append(row)
    groups = [sorted(rows, key=lambda r: float(r["nodes"])) for rows in by_series.values()]
    # labels name what tells the pair's series apart, drawn or not
    fields = [
        "strategy",
        *varying_fields([rows[0] for rows in groups], leave_out=("model", "dataset", "nodes", "strategy")),
    ]
    note = "every series (configuration over nodes) is drawn"
    if len(groups) > MAX_LINES:
        best: dict[str, tuple[tuple[float, float], list[dict[str, Any]]]] = {}
        for rows in groups:
            last = rows[-1]
            value = last[f"{prefix}_median"]
            rank = (float(last["nodes"]), -1.0 if missing(value) else float(value))
            strategy = str(last["strategy"])
            if strategy not in best or rank > best[strategy][0]:
                best[strategy] = (rank, rows)
        note = (
            f"{len(best)} of {len(groups)} series drawn: each strategy's series with the highest throughput at its "
            "largest node count (the tables below have every configuration)"
        )
        groups = [rows for _, rows in best.values()]
    firsts = [rows[0] for rows in groups]
    labelled = sorted(((_label(first, rows, fields), rows) for first, rows in zip(firsts, groups, strict=True)),
                      key=lambda item: item[0])  # fmt: skip

    return labelled, note


def _label(first: dict[str, Any], rows: list[dict[str, Any]], fields: list[str]) -> str:
    oversubscribed = any(not missing(r.get("any_oversubscribed")) and bool(r["any_oversubscribed"]) for r in rows)
    return describe(first, fields) + (" (oversubscribed)" if oversubscribed else "")


def _span(values: list[float]) -> float:
    positive = [v for v in values if v is not None and v == v and v > 0]
    return max(positive) / min(positive) if positive else 1.0


def _figure_mark(row: dict[str, Any], level: str, x: float, label: str, what: str) -> Mark:
    figure = throughput(row, level, label)
    noisy = row.get(f"{_prefix(level)}_noisy")
    hollow = figure.low is not None and not missing(noisy) and bool(noisy)
    return Mark(x=x, y=figure.value, low=figure.low, high=figure.high, hollow=hollow,
                note=f"{label}, {what}: {figure.text} samples/s")  # fmt: skip


def _node_charts(lines: list[tuple[str, list[dict[str, Any]]]], level: str, node_label: str) -> list[str]:
    nodes = [float(r["nodes"]) for _, rows in lines for r in rows]
    x_log = _span(nodes) >= LOG_SPAN
    x_axis = Axis(label=node_label, log=x_log, base=2, from_zero=False, ticks_at_values=not x_log)
    prefix = _prefix(level)
    throughput_lines, speedup_lines, efficiency_lines, memory_lines = [], [], [], []
    for index, (label, records) in enumerate(lines):
        tint = colour(index)
        marks = [
            _figure_mark(r, level, float(r["nodes"]), label, _nodes(r["nodes"]))
            for r in records
            if not missing(r[f"{prefix}_median"])
        ]
        throughput_lines.append(Line(label=label, colour=tint, marks=tuple(marks)))
        if len(marks) > 1:  # ideal: proportional to nodes from the series' smallest count
            base = marks[0]
            ideal = tuple(Mark(x=m.x, y=base.y * m.x / base.x) for m in marks)
            ideal_line = Line(label=f"{label}: ideal", colour=tint, marks=ideal, dashed=True, dots=False, width=1)
            throughput_lines.append(ideal_line)
        memory_lines.append(_plain_line(records, "tensor_peak_mib", label, tint, "MiB"))
    # speedup and efficiency over the series a reader compares (ddlbench.analysis.configurations.add_scaling:
    # equal global batch where the sweep kept one over nodes), a line per such series with two node counts
    for index, (label, records) in enumerate(_scaling_lines(lines)):
        tint = colour(index)
        speedup_lines.append(_plain_line(records, "speedup", label, tint, "speedup ×"))
        efficiency_lines.append(_plain_line(records, "scaling_efficiency", label, tint, "efficiency"))
    charts = [
        line_chart(
            throughput_lines,
            title="Throughput",
            x=x_axis,
            y=Axis(label="samples/s", log=_span([m.y for ln in throughput_lines for m in ln.marks]) >= LOG_SPAN),
        )
    ]
    if len(set(nodes)) > 1 and speedup_lines:
        low, high = min(nodes), max(nodes)
        ends = (Mark(x=low, y=1.0), Mark(x=high, y=high / low))
        ideal = Line(label="ideal", colour=GREY, marks=ends, dashed=True, dots=False)
        speedup_axis = Axis(label="× smallest node count", log=x_log, base=2)
        charts.append(line_chart([*speedup_lines, ideal], title="Speedup", x=x_axis, y=speedup_axis))
        one = Line(label="ideal", colour=GREY, marks=(Mark(x=low, y=1.0), Mark(x=high, y=1.0)), dashed=True, dots=False)
        charts.append(
            line_chart([*efficiency_lines, one], title="Scaling efficiency", x=x_axis, y=Axis(label="speedup ÷ nodes"))
        )
    if any(line.marks for line in memory_lines):
        memory = [m.y for ln in memory_lines for m in ln.marks]
        charts.append(
            line_chart(
                memory_lines,
                title="Peak tensor memory per rank",
                x=x_axis,
                y=Axis(label="MiB", log=_span(memory) >= LOG_SPAN),
            )
        )
    return charts


def _nodes(count: Any) -> str:
    return f"{int(count)} node{'s' if int(count) != 1 else ''}"


def _scaling_lines(lines: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The drawn configurations regrouped by the series their speedup is over (`scaling_key`), those with two
    node counts or more, each labelled by what tells it apart and the batch it holds equal."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for _, records in lines:
        for row in records:
            if not missing(row.get("scaling_key")) and not missing(row.get("speedup")):
                groups.setdefault(str(row["scaling_key"]), []).append(row)
    series = [sorted(rows, key=lambda r: float(r["nodes"])) for rows in groups.values()]
    series = [rows for rows in series if len({row["nodes"] for row in rows}) > 1]
    leave = ("model", "dataset", "nodes", "strategy", "batch_size", "global_batch_size")
    fields = ["strategy", *varying_fields([rows[0] for rows in series], leave_out=leave)]
    out = []
    for rows in series:
        first = rows[0]
        held = first.get("scaling_held")
        batch = first.get("global_batch_size") if held == "global batch" else first.get("batch_size")
        label = describe(first, fields)
        out.append((f"{label} ({held} {number(batch)})" if not missing(batch) else label, rows))
    return out


def scaling_note(pair: pd.DataFrame) -> str:
    """Why a section draws no speedup or efficiency, or ""."""
    if pair.empty or pair["nodes"].nunique() < 2:
        return ""
    if "scaling_key" in pair.columns and pair["scaling_key"].notna().any():
        return ""
    return (
        "Speedup and scaling efficiency are not drawn: no configuration ran at two node counts or more with the "
        "same global batch or the same per-replica batch, so each would be its own baseline (a speedup of 1)"
    )


def _plain_line(records: list[dict[str, Any]], column: str, label: str, tint: str, unit: str) -> Line:
    marks = tuple(
        Mark(x=float(r["nodes"]), y=float(r[column]), note=f"{label}, {_nodes(r['nodes'])}: {number(r[column])} {unit}")
        for r in records
        if not missing(r.get(column))
    )
    return Line(label=label, colour=tint, marks=marks)


def _study_charts(pair: pd.DataFrame, level: str) -> list[dict[str, Any]]:
    """Throughput against each study axis the model × dataset varies, a line per setting of the others."""
    charts = []
    prefix = _prefix(level)
    records = pair.to_dict("records")
    for axis, name in STUDY_AXES.items():
        if pair[axis].nunique() < 2:
            continue
        others = [f for f in varying_fields(records, leave_out=("model", "dataset", axis)) if f != "repetition"]
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in records:
            if not missing(row[f"{prefix}_median"]):
                groups.setdefault(tuple(str(row.get(f)) for f in others), []).append(row)
        chosen = list(groups.values())
        if len(chosen) > MAX_LINES:
            best: dict[str, list[dict[str, Any]]] = {}
            for rows in chosen:
                top = max(float(r[f"{prefix}_median"]) for r in rows)
                strategy = str(rows[0]["strategy"])
                if strategy not in best or top > max(float(r[f"{prefix}_median"]) for r in best[strategy]):
                    best[strategy] = rows
            chosen = list(best.values())
        fields = ["strategy", *[f for f in others if f != "strategy"]]
        labelled = sorted((describe(rows[0], fields), sorted(rows, key=lambda r: r[axis])) for rows in chosen)
        lines = [
            Line(
                label=label,
                colour=colour(i),
                marks=tuple(_figure_mark(r, level, float(r[axis]), label, f"{name} {r[axis]}") for r in rows),
            )
            for i, (label, rows) in enumerate(labelled)
        ]
        xs = [float(v) for v in pair[axis]]
        x_log = _span(xs) >= LOG_SPAN
        svg = line_chart(
            lines,
            title=f"Throughput against {name}",
            x=Axis(label=name, log=x_log, base=2, from_zero=False, ticks_at_values=not x_log),
            y=Axis(label="samples/s", log=_span([m.y for ln in lines for m in ln.marks]) >= LOG_SPAN),
        )
        note = "" if len(chosen) == len(groups) else f"{len(chosen)} of {len(groups)} lines: each strategy's fastest"
        legend = [{"label": label, "colour": colour(i)} for i, (label, _) in enumerate(labelled)]
        charts.append({"svg": Markup(svg), "legend": legend, "note": note})
    return charts
