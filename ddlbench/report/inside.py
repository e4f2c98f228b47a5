"""The report's drawing of one step of every rank, for a configuration: phases as bars, waits on
communication over them, collectives in flight below, and per rank its medians over the kept steps.

The drawings come from the records, which keep each rank's last measured step
(ddlbench.analysis.inside.timeline); the phase and straggler figures of every configuration are in the
report's tables (ddlbench.report.data, ddlbench.analysis.inside.figures defines them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.analysis.inside.figures import kept_values, rank_medians
from ddlbench.records import RecordError, read_record, record_path
from ddlbench.report.figures import number
from ddlbench.statistics import percentile

MS = 1e3
COLOURS = {"data": "#9e9e9e", "forward": "#4c78a8", "backward": "#f58518", "update": "#54a24b"}


def step_drawings(configs: pd.DataFrame, table: pd.DataFrame, sweep_dir: Path) -> list[dict[str, Any]]:
    """For each configuration given (its median repetition's point), the last measured step of every rank
    drawn from its record: phases as bars, waits on communication in red over them, and collectives in
    flight as thin lines below. The caller chooses how many (each reads a record and draws)."""
    drawings = []
    ok = table[table["status"] == "ok"]
    for config in configs.to_dict("records"):
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
            for w, s in zip(
                kept_values(rank, "exposed_p2p_s", dropped), kept_values(rank, "step_s", dropped), strict=True
            )
            if s > 0
        ]
        share = percentile(sorted(shares), 50) if shares else None
        rows.append(
            {
                "rank": str(rank.rank),
                "host": rank.hostname,
                "steps": str(len(kept_values(rank, "step_s", dropped))),  # n of every median in the row
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
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from ddlbench.report.plots import plt, svg_text  # matplotlib only when there is something to draw

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
    keys = [
        Patch(color=colour, label=name) for name, colour in {**COLOURS, "waiting on communication": "#d62728"}.items()
    ]
    keys.append(Line2D([], [], color="#7b4fa0", label="collectives in flight"))
    step = ranks[0].timeline[0]["step"] if ranks[0].timeline else ""
    axes.set_yticks(range(len(ranks)), [f"rank {r.rank} ({r.hostname})" for r in ranks])
    axes.invert_yaxis()
    axes.set_xlabel(f"ms since the step's first start (step {step}, the last measured one; common clock)")
    axes.set_title(record.point_id, fontsize="small")
    axes.grid(alpha=0.3, axis="x")
    axes.legend(handles=keys, fontsize="x-small", loc="upper left", bbox_to_anchor=(0, -0.35), ncols=6)
    return svg_text(figure)
