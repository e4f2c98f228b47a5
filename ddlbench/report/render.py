"""The sweep report: a self-contained HTML page (jinja2 with autoescape, plots as inline SVG).

Every figure is a configuration's or a point's (ddlbench.analysis.configurations), shown with its
95 % interval and n (ddlbench.report.figures), flagged when noisy, oversubscribed or of another
measurement version. Records of another measurement version are left out of comparisons, speedups
and plots unless `include_other_versions`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

import ddlbench
from ddlbench.analysis.aggregate import add_configuration_columns
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.analysis.keys import BASELINE_STRATEGY, CONFIG_FIELDS, describe, varying_fields
from ddlbench.config import SweepConfig
from ddlbench.errors import DdlbenchError
from ddlbench.provenance import utc_now
from ddlbench.records import MEASUREMENT_VERSION, STATUSES
from ddlbench.report.figures import Cell, figure_cell, missing, number, point_notes
from ddlbench.report.inside import INSIDE_COLUMNS, RANK_COLUMNS, inside_rows, step_drawings, study_plots
from ddlbench.report.plots import figure_level, level_caption, strategy_comparison_svg, throughput_vs_nodes_svg
from ddlbench.report.predicted import predicted_section
from ddlbench.report.scaling import scaling_section
from ddlbench.sweep import expand_sweep
from ddlbench.templating import template_environment

MIB = 2**20
# the fields that name a point in the tables even when the sweep holds them constant
SHOWN_FIELDS = ("model", "dataset", "strategy", "nodes", "ranks_per_node", "split", "batch_size", "micro_batches")
TEXT_COLUMNS = {"point_id", "model", "dataset", "strategy", "strategy_options", "setting", "status", "reason"}
# (column, heading) of the comparison table; figures are built by _comparison_cells
COMPARISON_COLUMNS = [
    "model", "dataset", "nodes", "ranks_per_node", "strategy", "strategy_options", "micro_batches", "split",
    "batch_size", "global_batch_size", "setting", "samples_per_s", "samples_per_s_steps", "vs_baseline",
    "baseline_samples_per_s", "step_time_s", "warmup_dropped_steps", "split_flops_share", "tensor_peak_mib",
    "peak_rss_mib", "cuda_peak_mib", "local_parameters_max", "stages",
]  # fmt: skip
# shown, in both tables, when some point read real data through a loader
INPUT_COLUMNS = ["input_wait_s", "input_wait_share"]
POINT_FIGURE_COLUMNS = [
    "status", "measurement_version", "samples_per_s", "samples_per_s_overall", "step_time_s",
    "warmup_dropped_steps", "speedup", "scaling_efficiency", "base_nodes", "base_samples_per_s", "vs_baseline",
    "split_flops_share", "peak_rss_bytes", "tensor_peak_bytes", "cuda_peak_allocated_bytes", "loss_first",
    "loss_last",
]  # fmt: skip


def render_report(
    config: SweepConfig, table: pd.DataFrame, *, include_other_versions: bool = False, report_dir: Path | None = None
) -> str:
    """The report's HTML; `report_dir` (where it will be written) makes its links to trace files relative."""
    if "config_key" not in table.columns:
        raise DdlbenchError("the table predates configuration keys; run `ddlbench aggregate` again")
    table = add_configuration_columns(table, include_other_versions=include_other_versions)
    configs = summarize_configurations(table, include_other_versions=include_other_versions)
    models = [model for model in config.models if model in set(table["model"])]
    plots = {
        model: _figure(throughput_vs_nodes_svg(configs, model), configs[configs["model"] == model]) for model in models
    }
    pairs = sorted({(m, d) for m, d in zip(table["model"], table["dataset"], strict=True)})
    several = table["strategy"].nunique() > 1
    comparison_plots = {
        f"{m} on {d}": _figure(
            strategy_comparison_svg(configs, m, d), configs[(configs["model"] == m) & (configs["dataset"] == d)]
        )
        for m, d in (pairs if several else [])
    }
    comparison = strategy_comparison(configs) if several else strategy_comparison(configs.iloc[0:0])
    skipped = [{"point_id": point.point_id, "reason": why} for point, why in expand_sweep(config).skipped]
    failed = table[table["status"] != "ok"]
    counts = {status: int((table["status"] == status).sum()) for status in (*STATUSES, "missing")}
    other = table[_flag(table, "other_measurement_version")].reindex(
        columns=["point_id", "measurement_version", "status"]
    )
    oversubscribed = table[_flag(table, "oversubscribed")].reindex(columns=["point_id", "cores_note"])
    point_fields = _point_fields(table)
    reading = "input_wait_s_median" in table.columns and bool(table["input_wait_s_median"].notna().any())
    input_columns = INPUT_COLUMNS if reading else []
    context: dict[str, Any] = {
        "config": config,
        "config_hash": config.config_hash(),
        "generated": utc_now(),
        "version": ddlbench.__version__,
        "measurement_version": MEASUREMENT_VERSION,
        "include_other_versions": include_other_versions,
        "counts": counts,
        "total": len(table),
        "configurations": len(configs),
        "plots": plots,
        "comparison_plots": comparison_plots,
        "comparison": [_comparison_cells(row) | _input_cells(row) for row in comparison.to_dict("records")],
        "comparison_columns": COMPARISON_COLUMNS + input_columns,
        "input_columns": input_columns,
        "baseline": BASELINE_STRATEGY,
        "skipped": skipped,
        "other_versions": _plain_rows(other),
        "oversubscribed": _plain_rows(oversubscribed),
        "shared_settings": _shared_settings(table),
        "columns": ["point_id", *point_fields, "repetition", *POINT_FIGURE_COLUMNS, *input_columns],
        "rows": [_point_cells(row, point_fields) | _input_cells(row) for row in table.to_dict("records")],
        "failed": _plain_rows(failed[["point_id", "status", "reason"]]),
        "provenance": _provenance(table),
        "inside_rows": inside_rows(table, report_dir=report_dir, sweep_dir=config.sweep_dir),
        "inside_columns": INSIDE_COLUMNS,
        "rank_columns": RANK_COLUMNS,
        "step_drawings": [
            {"point_id": d["point_id"], "svg": Markup(d["svg"]), "ranks": d["ranks"]}
            for d in step_drawings(configs, table, config.sweep_dir)
        ],
        "study_plots": {axis: Markup(svg) for axis, svg in study_plots(configs).items()},
        "predicted": predicted_section(config, table),
        "scaling": scaling_section(config),
    }
    return template_environment(autoescape=True).get_template("report.html.j2").render(**context)


def strategy_comparison(configs: pd.DataFrame) -> pd.DataFrame:
    """The configurations (ddlbench.analysis.configurations), sorted by model, dataset and layout, with a
    `setting` column naming what else varies, and memory in MiB (2^20 bytes).

    vs_baseline = the configuration's samples/s (median over repetitions of the window throughput) ÷
    that of ddp equal in every field but the strategy's own; baseline_samples_per_s is ddp's figure."""
    frame = configs.copy()
    own_columns = ("model", "dataset", "nodes", "ranks_per_node", "strategy", "strategy_options")
    own_columns += ("micro_batches", "split", "batch_size", "repetition")
    others = varying_fields(frame.to_dict("records"), leave_out=own_columns)
    frame["setting"] = [describe(row, others) for row in frame.to_dict("records")] if others else ""
    for name, column in (
        ("peak_rss", "peak_rss_bytes"),
        ("tensor_peak", "tensor_peak_bytes"),
        ("cuda_peak", "cuda_peak_allocated_bytes"),
    ):
        frame[f"{name}_mib"] = pd.to_numeric(frame[column], errors="coerce") / MIB
    order = ["model", "dataset", "nodes", "ranks_per_node", "strategy", "strategy_options", "split"]
    order += ["micro_batches", "batch_size", "setting"]
    return frame.sort_values(order, kind="stable").reset_index(drop=True)


def _figure(svg: str, configs: pd.DataFrame) -> dict[str, Any]:
    return {"svg": Markup(svg), "caption": level_caption(figure_level(configs))}


def _comparison_cells(row: dict[str, Any]) -> dict[str, Cell]:
    notes = point_notes(row)
    cells = {
        column: Cell(text=number(row.get(column)), is_text=column in TEXT_COLUMNS) for column in COMPARISON_COLUMNS
    }
    cells["strategy_options"] = Cell(text=_options(row.get("strategy_options")), is_text=True)
    cells["samples_per_s"] = figure_cell(
        row, "rep_samples_per_s", unit="repetitions", n_column="n_repetitions", notes=notes
    )
    cells["samples_per_s_steps"] = figure_cell(row, "samples_per_s", unit="steps", n_column="samples_per_s_n")
    cells["step_time_s"] = figure_cell(row, "step_time_s", unit="steps", n_column="step_time_s_n")
    return cells


def _point_cells(row: dict[str, Any], fields: list[str]) -> dict[str, Cell]:
    columns = ["point_id", *fields, "repetition", *POINT_FIGURE_COLUMNS]
    cells = {column: Cell(text=number(row.get(column)), is_text=column in TEXT_COLUMNS) for column in columns}
    if "strategy_options" in cells:
        cells["strategy_options"] = Cell(text=_options(row.get("strategy_options")), is_text=True)
    notes = point_notes(row)
    cells["samples_per_s"] = figure_cell(row, "samples_per_s", unit="steps", n_column="samples_per_s_n", notes=notes)
    cells["step_time_s"] = figure_cell(row, "step_time_s", unit="steps", n_column="step_time_s_n")
    cells["status"] = Cell(text=str(row["status"]), is_text=True)
    return cells


def _input_cells(row: dict[str, Any]) -> dict[str, Cell]:
    """The wait on input per step (s) and its share of the step time, of a point that read through a loader."""
    return {column: figure_cell(row, column, unit="steps", n_column=f"{column}_n") for column in INPUT_COLUMNS}


def _point_fields(table: pd.DataFrame) -> list[str]:
    """The configuration fields the points table shows: the naming ones, and any other the sweep varies."""
    varying = set(varying_fields(table.to_dict("records")))
    return [name for name in CONFIG_FIELDS if name in SHOWN_FIELDS or name in varying]


def _shared_settings(table: pd.DataFrame) -> dict[str, str]:
    """Configuration fields with one value over every point (Hoefler & Belli's rule 9: the full setup)."""
    varying = set(varying_fields(table.to_dict("records")))
    shared = {}
    for name in CONFIG_FIELDS:
        if name in varying or name not in table.columns or not len(table):
            continue
        value = table[name].iloc[0]
        shared[name] = _options(value) if name.endswith("_options") else (number(value) or "—")
    return shared


def _flag(table: pd.DataFrame, column: str) -> pd.Series:
    """A yes/no column as plain booleans; all False when the table lacks it (no record read)."""
    if column not in table.columns:
        return pd.Series(False, index=table.index, dtype=bool)
    return table[column].fillna(False).astype(bool)


def _options(value: Any) -> str:
    if missing(value):
        return ""
    options = json.loads(value) if isinstance(value, str) else dict(value)
    return " ".join(f"{key}={option}" for key, option in sorted(options.items())) or "default"


def _plain_rows(frame: pd.DataFrame) -> list[dict[str, str]]:
    return [{column: number(value) for column, value in row.items()} for row in frame.to_dict("records")]


def _provenance(table: pd.DataFrame) -> dict[str, str]:
    keys = ["hostnames", "cpu_model", "gpu_model", "backend", "torch_version", "ddlbench_version", "git_commit"]
    summary = {}
    for key in keys:
        if key in table.columns:
            values = sorted({str(v) for v in table[key].dropna() if str(v)})
            summary[key] = ", ".join(values) if values else "—"
    return summary
