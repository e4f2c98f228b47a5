"""The report's view inside the steps: per point, where a step's time goes, how much communication hid
under computation, the gap between weight updates and the straggler; per configuration, one step of
every rank drawn; and throughput against the study's axes (threads, ranks per node, batch per rank).

Figures come from the sweep table (ddlbench.anatomy.figures defines them); the drawings from the
records, which keep each rank's last measured step (ddlbench.anatomy.timeline).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from ddlbench.analysis.keys import describe, varying_fields
from ddlbench.anatomy.figures import rank_medians
from ddlbench.records import RecordError, read_record, record_path
from ddlbench.report.figures import Cell, figure_cell, missing, number
from ddlbench.report.plots import svg_text
from ddlbench.statistics import percentile

MS = 1e3
# (column heading, phase figure): each a median over kept steps of the mean over ranks, in ms
PHASE_COLUMNS = (
    ("data", "data_s"),
    ("forward", "forward_s"),
    ("backward", "backward_s"),
    ("update", "update_s"),
    ("other", "other_s"),
    ("comm exposed", "comm_exposed_s"),
    ("comm hidden", "comm_hidden_s"),
    ("p2p wait", "exposed_p2p_s"),
)
COLOURS = {"data": "#9e9e9e", "forward": "#4c78a8", "backward": "#f58518", "update": "#54a24b"}
MAX_DRAWINGS = 24
STUDY_AXES = ("threads", "ranks_per_node", "batch_size")


def inside_rows(table: pd.DataFrame, *, report_dir: Path | None, sweep_dir: Path) -> list[dict[str, Cell]]:
    """One row per ok point that recorded its phases."""
    if "phase_forward_s_median" not in table.columns:
        return []
    rows = []
    for row in table[(table["status"] == "ok") & table["phase_forward_s_median"].notna()].to_dict("records"):
        cells: dict[str, Cell] = {"point_id": Cell(text=row["point_id"], is_text=True)}
        for heading, figure in PHASE_COLUMNS:
            cells[heading] = _ms_cell(row, f"phase_{figure}")
        cells["overlap"] = figure_cell(row, "comm_overlap", unit="steps", n_column="comm_overlap_n")
        cells["update gap (ms)"] = _ms_cell(row, "update_gap_s")
        cells["straggler"] = Cell(text=_straggler_text(row), is_text=True)
        cells["wait for it (ms)"] = _ms_cell(row, "straggler_wait_s")
        cells["wait share"] = figure_cell(row, "straggler_wait_share", unit="steps", n_column="straggler_wait_share_n")
        link = _trace_link(row, report_dir, sweep_dir)
        cells["trace"] = Cell(text="trace" if link else "", href=link, title=link, is_text=True)
        rows.append(cells)
    return rows


INSIDE_COLUMNS = [
    "point_id",
    *(heading for heading, _ in PHASE_COLUMNS),
    "overlap",
    "update gap (ms)",
    "straggler",
    "wait for it (ms)",
    "wait share",
    "trace",
]


def _ms_cell(row: dict[str, Any], prefix: str) -> Cell:
    median = row.get(f"{prefix}_median")
    if missing(median):
        return Cell(text="")
    low, high = row.get(f"{prefix}_ci_low"), row.get(f"{prefix}_ci_high")
    interval = "" if missing(low) or missing(high) else f" [{number(low * MS)}, {number(high * MS)}]"
    return Cell(text=f"{number(median * MS)}{interval}", title=f"median over {number(row.get('step_time_s_n'))} steps")


def _straggler_text(row: dict[str, Any]) -> str:
    rank = row.get("straggler_rank")
    if missing(rank):
        return ""
    return (
        f"rank {int(rank)} on {row.get('straggler_host')} "
        f"(slowest in {int(row['straggler_slowest_steps'])} of {int(row['straggler_steps'])} steps)"
    )


def _trace_link(row: dict[str, Any], report_dir: Path | None, sweep_dir: Path) -> str:
    trace = row.get("trace_file")
    if missing(trace) or not trace:
        return ""
    target = sweep_dir / str(trace)
    if report_dir is None:
        return str(target)
    return os.path.relpath(target.resolve(), report_dir.resolve())


def step_drawings(configs: pd.DataFrame, table: pd.DataFrame, sweep_dir: Path) -> list[dict[str, Any]]:
    """For each configuration (its median repetition's point; at most MAX_DRAWINGS), the last measured step
    of every rank drawn from its record: phases as bars, waits on communication in red over them, and
    collectives in flight as thin lines below."""
    drawings = []
    ok = table[table["status"] == "ok"]
    for config in configs.to_dict("records")[:MAX_DRAWINGS]:
        members = ok[ok["config_key"] == config["config_key"]]
        if members.empty:
            continue
        chosen = members[members["repetition"] == config.get("median_repetition")]
        point_id = (chosen if len(chosen) else members).iloc[0]["point_id"]
        try:
            record = read_record(record_path(sweep_dir, point_id))
        except RecordError:
            continue
        if not any(rank.timeline for rank in record.ranks):
            continue
        drawings.append({"point_id": point_id, "svg": _step_svg(record), "ranks": _rank_rows(record)})
    return drawings


RANK_COLUMNS = (
    "rank", "host", "steps", "busy", "forward", "backward", "update", "comm exposed", "p2p wait", "bubble share",
)  # fmt: skip


def _rank_rows(record: Any) -> list[dict[str, str]]:
    """Per rank, medians over the kept steps (ms): its busy time and phases; bubble share = p2p wait ÷ its
    step (a pipeline stage's idle share waiting for its neighbours)."""
    dropped = record.metrics.warmup_dropped_steps if record.metrics else 0
    rows = []
    for rank in sorted(record.ranks, key=lambda r: r.rank):
        medians = rank_medians(rank, dropped)
        if "busy_s" not in medians:
            continue
        shares = [
            w / s
            for w, s in zip(rank.anatomy["exposed_p2p_s"][dropped:], rank.anatomy["step_s"][dropped:], strict=True)
            if s > 0
        ]
        share = percentile(sorted(shares), 50) if shares else None
        rows.append(
            {
                "rank": str(rank.rank),
                "host": rank.hostname,
                "steps": str(len(rank.anatomy["step_s"]) - dropped),  # n of every median in the row
                **{
                    heading: number(medians[figure] * MS)
                    for heading, figure in (
                        ("busy", "busy_s"),
                        ("forward", "forward_s"),
                        ("backward", "backward_s"),
                        ("update", "update_s"),
                        ("comm exposed", "comm_exposed_s"),
                        ("p2p wait", "exposed_p2p_s"),
                    )
                },
                "bubble share": number(share),
            }
        )
    return rows


def _step_svg(record: Any) -> str:
    ranks = sorted(record.ranks, key=lambda r: r.rank)
    events = [event for rank in ranks for event in rank.timeline]
    origin = min(event["start"] for event in events)
    figure, axes = plt.subplots(figsize=(7.2, 0.6 + 0.45 * len(ranks)))
    for row, rank in enumerate(ranks):
        for event in rank.timeline:
            start, width = (event["start"] - origin) * MS, (event["end"] - event["start"]) * MS
            if event["cat"] == "phase":
                axes.barh(row, width, left=start, height=0.5, color=COLOURS.get(event["name"], "#bbb"))
            elif event["cat"] == "wait":
                axes.barh(row, width, left=start, height=0.5, color="#d62728", alpha=0.8)
            elif event["cat"] == "comm":
                axes.plot([start, start + width], [row + 0.33, row + 0.33], color="#7b4fa0", linewidth=1.5)
    for name, colour in {**COLOURS, "waiting on communication": "#d62728"}.items():
        axes.barh([], [], color=colour, label=name)
    axes.plot([], [], color="#7b4fa0", label="collectives in flight")
    step = ranks[0].timeline[0]["step"] if ranks[0].timeline else ""
    axes.set_yticks(range(len(ranks)), [f"rank {r.rank} ({r.hostname})" for r in ranks])
    axes.invert_yaxis()
    axes.set_xlabel(f"ms since the step's first start (step {step}, the last measured one; common clock)")
    axes.set_title(record.point_id, fontsize="small")
    axes.grid(alpha=0.3, axis="x")
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0, -0.35), ncols=6)
    return svg_text(figure)


def study_plots(configs: pd.DataFrame) -> dict[str, str]:
    """Throughput against each study axis the sweep varies (threads per rank, ranks per node, batch per
    rank), a line per configuration of the other fields; the median repetition's median step throughput."""
    plots = {}
    for axis in STUDY_AXES:
        if axis not in configs.columns or configs[axis].nunique() < 2:
            continue
        plots[axis] = _axis_svg(configs, axis)
    return plots


def _axis_svg(configs: pd.DataFrame, axis: str) -> str:
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    records = configs.to_dict("records")
    others = varying_fields(records, leave_out=(axis, "repetition")) or ["strategy"]
    frame = configs.assign(_line=[describe(row, others) for row in records]).sort_values(axis)
    for label, line in frame.groupby("_line", sort=True):
        value = pd.to_numeric(line["samples_per_s_median"], errors="coerce")
        low = (value - pd.to_numeric(line["samples_per_s_ci_low"], errors="coerce")).fillna(0).clip(lower=0)
        high = (pd.to_numeric(line["samples_per_s_ci_high"], errors="coerce") - value).fillna(0).clip(lower=0)
        axes.errorbar(line[axis], value, yerr=[low, high], marker="o", capsize=3, label=label)
    axes.set_title(f"throughput vs {axis.replace('_', ' ')}")
    axes.set_xlabel(axis)
    axes.set_ylabel("global samples/s (median step;\nbars: 95 % CI over steps)")
    axes.set_xticks(sorted(frame[axis].unique()))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0, -0.18), ncols=2)
    return svg_text(figure)
