"""The sweep report: a self-contained HTML page (jinja2 with autoescape, plots as inline SVG)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from markupsafe import Markup

import ddlbench
from ddlbench.config import SweepConfig
from ddlbench.provenance import utc_now
from ddlbench.records import STATUSES
from ddlbench.report.plots import throughput_vs_nodes_svg
from ddlbench.templating import template_environment

TABLE_COLUMNS = [
    "point_id", "model", "dataset", "strategy", "nodes", "ranks_per_node", "batch_size", "threads",
    "repetition", "status", "samples_per_s_median", "samples_per_s_p5", "samples_per_s_p95",
    "step_time_s_median", "speedup", "scaling_efficiency", "peak_rss_bytes", "cuda_peak_allocated_bytes",
    "loss_first", "loss_last",
]  # fmt: skip


def render_report(config: SweepConfig, table: pd.DataFrame) -> str:
    models = [model for model in config.models if model in set(table["model"])]
    plots = {model: Markup(throughput_vs_nodes_svg(table, model)) for model in models}
    failed = table[table["status"] != "ok"]
    counts = {status: int((table["status"] == status).sum()) for status in (*STATUSES, "missing")}
    context: dict[str, Any] = {
        "config": config,
        "config_hash": config.config_hash(),
        "generated": utc_now(),
        "version": ddlbench.__version__,
        "counts": counts,
        "total": len(table),
        "plots": plots,
        "columns": [column for column in TABLE_COLUMNS if column in table.columns],
        "rows": _rows(table),
        "failed": _rows(failed[["point_id", "status", "reason"]]),
        "provenance": _provenance(table),
    }
    return template_environment(autoescape=True).get_template("report.html.j2").render(**context)


def _rows(frame: pd.DataFrame) -> list[dict[str, str]]:
    return [{column: _format(value) for column, value in row.items()} for row in frame.to_dict("records")]


def _format(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _provenance(table: pd.DataFrame) -> dict[str, str]:
    keys = [
        "hostnames",
        "cpu_model",
        "gpu_model",
        "backend",
        "torch_version",
        "ddlbench_version",
        "git_commit",
    ]
    summary = {}
    for key in keys:
        if key in table.columns:
            values = sorted({str(v) for v in table[key].dropna() if str(v)})
            summary[key] = ", ".join(values) if values else "—"
    return summary
