"""The sweep report: a self-contained HTML page (jinja2 with autoescape, plots as inline SVG)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from markupsafe import Markup

import ddlbench
from ddlbench.config import SweepConfig
from ddlbench.provenance import utc_now
from ddlbench.records import STATUSES
from ddlbench.report.plots import strategy_comparison_svg, throughput_vs_nodes_svg
from ddlbench.sweep import expand_sweep
from ddlbench.templating import template_environment

TABLE_COLUMNS = [
    "point_id", "model", "dataset", "strategy", "nodes", "ranks_per_node", "split", "batch_size",
    "micro_batches", "threads", "repetition", "status", "samples_per_s_median", "samples_per_s_p5",
    "samples_per_s_p95", "step_time_s_median", "speedup", "scaling_efficiency", "peak_rss_bytes",
    "tensor_peak_bytes", "cuda_peak_allocated_bytes", "loss_first", "loss_last",
]  # fmt: skip
# One row per strategy at each (model, dataset, layout): what the strategies cost and hold.
COMPARISON_COLUMNS = [
    "model", "dataset", "nodes", "ranks_per_node", "strategy", "micro_batches", "split", "global_batch_size",
    "samples_per_s", "vs_baseline", "step_time_s", "tensor_peak_mib", "peak_rss_mib", "cuda_peak_mib",
    "local_parameters_max", "stages",
]  # fmt: skip
MIB = 2**20


def render_report(config: SweepConfig, table: pd.DataFrame) -> str:
    models = [model for model in config.models if model in set(table["model"])]
    plots = {model: Markup(throughput_vs_nodes_svg(table, model)) for model in models}
    pairs = sorted({(m, d) for m, d in zip(table["model"], table["dataset"], strict=True)})
    comparison_plots = (
        {f"{m} on {d}": Markup(strategy_comparison_svg(table, m, d)) for m, d in pairs}
        if table["strategy"].nunique() > 1
        else {}
    )
    skipped = [{"point_id": point.point_id, "reason": why} for point, why in expand_sweep(config).skipped]
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
        "comparison_plots": comparison_plots,
        "comparison": _rows(strategy_comparison(table)),
        "comparison_columns": COMPARISON_COLUMNS,
        "baseline": BASELINE_STRATEGY,
        "skipped": skipped,
        "columns": [column for column in TABLE_COLUMNS if column in table.columns],
        "rows": _rows(table),
        "failed": _rows(failed[["point_id", "status", "reason"]]),
        "provenance": _provenance(table),
    }
    return template_environment(autoescape=True).get_template("report.html.j2").render(**context)


BASELINE_STRATEGY = "ddp"


def strategy_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Successful points pooled over repetitions (medians), one row per strategy and layout.

    vs_baseline = samples/s of the row ÷ samples/s of ddp on the same model, dataset, nodes and ranks
    per node (dimensionless; empty where ddp did not run there). Memory in MiB (2^20 bytes).
    """
    ok = table[table["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    # figures a table may lack (records without ranks, without CUDA) become empty columns
    optional = ["tensor_peak_bytes", "cuda_peak_allocated_bytes", "local_parameters_max", "stages"]
    ok = ok.reindex(columns=[*ok.columns, *(column for column in optional if column not in ok.columns)])
    ok[optional] = ok[optional].apply(pd.to_numeric, errors="coerce")  # None (no CUDA) → NaN
    keys = ["model", "dataset", "nodes", "ranks_per_node", "strategy", "micro_batches", "split", "global_batch_size"]
    frame = (
        ok.groupby(keys, sort=True, dropna=False)
        .agg(
            samples_per_s=("samples_per_s_median", "median"),
            step_time_s=("step_time_s_median", "median"),
            peak_rss_bytes=("peak_rss_bytes", "max"),
            tensor_peak_bytes=("tensor_peak_bytes", "max"),
            cuda_peak_bytes=("cuda_peak_allocated_bytes", "max"),
            local_parameters_max=("local_parameters_max", "max"),
            stages=("stages", "max"),
        )
        .reset_index()
    )
    for name in ("peak_rss", "tensor_peak", "cuda_peak"):
        frame[f"{name}_mib"] = frame.pop(f"{name}_bytes") / MIB
    layout = ["model", "dataset", "nodes", "ranks_per_node"]
    base = frame[frame["strategy"] == BASELINE_STRATEGY].groupby(layout)["samples_per_s"].max()
    frame["vs_baseline"] = frame["samples_per_s"] / frame.join(base.rename("base"), on=layout)["base"]
    return frame[COMPARISON_COLUMNS]


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
