"""The sweep report: a self-contained HTML page (jinja2 with autoescape, charts as inline SVG, its large
tables as JSON drawn by a small inline script, nothing fetched) and its summary as Markdown.

The page answers first (ddlbench.report.summary: the best strategy per model × dataset × scale, failed
points by cause; ddlbench.report.health: the machine's certificate), then has one section per model ×
dataset (ddlbench.report.sections), then the failed, skipped and flagged points, every point, and the
provenance. Every figure is a configuration's or a point's (ddlbench.analysis.configurations), shown
with its 95 % interval and n, flagged when noisy, oversubscribed or of another measurement version.
Records of another measurement version are left out of comparisons, speedups and charts unless
`include_other_versions`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

import ddlbench
from ddlbench.analysis.aggregate import add_configuration_columns
from ddlbench.analysis.configurations import summarize_configurations
from ddlbench.analysis.keys import BASELINE_STRATEGY, CONFIG_FIELDS
from ddlbench.config import SweepConfig
from ddlbench.errors import DdlbenchError
from ddlbench.provenance import utc_now
from ddlbench.records import MEASUREMENT_VERSION
from ddlbench.report import data
from ddlbench.report.columns import column, title
from ddlbench.report.figures import missing, number
from ddlbench.report.health import health_section
from ddlbench.report.inside import RANK_COLUMNS, step_drawings
from ddlbench.report.markdown import render_markdown
from ddlbench.report.predicted import predicted_section
from ddlbench.report.scaling import pair_of, scaling_block, scaling_section
from ddlbench.report.sections import pair_section
from ddlbench.report.summary import (
    BASIS_TEXT,
    ONE_HOST_NOTE,
    best_strategies,
    display_status,
    failures_by_cause,
    family_note,
    headlines,
    one_host,
    status_counts,
)
from ddlbench.report.tables import encode_table, script_json, view
from ddlbench.sweep import expand_sweep
from ddlbench.templating import template_environment, templates_dir

SHOWN = 200  # rows of a server-written list (failed, skipped, flagged points) before the rest is left out
MAX_DRAWINGS = 12  # step drawings in the whole report (each reads a record and draws with matplotlib)
INPUT_NOTE = (
    "Points with an input wait read real data through a DataLoader during the steps (their step times include "
    "it; other points cycle through batches made resident before timing): the input wait is, per kept step, the "
    "longest host time any rank spent waiting for its batch (the loader's next batch plus enqueueing its copy to "
    "the device; on GPUs an upper bound of the stall), its share that wait ÷ the step time."
)


def render_report(
    config: SweepConfig, table: pd.DataFrame, *, include_other_versions: bool = False, report_dir: Path | None = None
) -> str:
    """The report's HTML; `report_dir` (where it will be written) makes its links to trace files relative."""
    return render_reports(config, table, include_other_versions=include_other_versions, report_dir=report_dir)[0]


def render_reports(
    config: SweepConfig,
    table: pd.DataFrame,
    *,
    include_other_versions: bool = False,
    include_host_copied: bool = False,
    report_dir: Path | None = None,
    models_ready: Callable[[], None] | None = None,
) -> tuple[str, str]:
    """The report's HTML and its Markdown summary, from one computation. `include_host_copied`: Horovod
    whose CUDA gradients went through the host competes for best strategy (left out by default).
    `models_ready`: called before the scaling models (models.json) are read, so that they may be fitted
    while the rest of the report is made (ddlbench.finish)."""
    context = report_context(
        config,
        table,
        include_other_versions=include_other_versions,
        include_host_copied=include_host_copied,
        report_dir=report_dir,
        models_ready=models_ready,
    )
    html = template_environment(autoescape=True).get_template("report.html.j2").render(**context)
    return html, render_markdown(context)


def report_context(
    config: SweepConfig,
    table: pd.DataFrame,
    *,
    include_other_versions: bool = False,
    include_host_copied: bool = False,
    report_dir: Path | None = None,
    models_ready: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Everything the page shows (templates/report.html.j2); the Markdown summary reads the same."""
    if "config_key" not in table.columns:
        raise DdlbenchError("the table predates configuration keys; run `ddlbench report` again")
    aggregated = table  # the scaling models' stamp names the table as aggregated, before columns are added
    configs = summarize_configurations(table, include_other_versions=include_other_versions)
    table = add_configuration_columns(table, include_other_versions=include_other_versions, summary=configs)
    hosts = one_host(table)
    frame = data.configurations_frame(configs, table, report_dir=report_dir, sweep_dir=config.sweep_dir, one_host=hosts)
    configs_table = data.configurations_table(frame)
    points_table, point_keys = data.points_table(table)
    tables: dict[str, Any] = {"configs": configs_table, "points": points_table}
    config_keys = {c["key"] for c in configs_table["columns"]}

    predicted = predicted_section(config, table)
    predicted_ranges: dict[tuple[str, str], tuple[int, int]] = {}
    predicted_keys: list[str] = []
    if predicted and "frame" in predicted:
        joined = predicted.pop("frame")
        specs = data.present(joined, predicted.pop("specs"))
        tables["predicted"] = encode_table(joined, specs)
        predicted_ranges = data.pair_ranges(joined) if len(joined) else {}
        predicted_keys = [spec.key for spec in specs]
    if models_ready is not None:
        models_ready()
    scaling = scaling_section(config, aggregated)
    sections = _sections(frame, table, config_keys, config, predicted_ranges, predicted_keys, scaling, hosts)
    if scaling and not scaling.get("why"):
        placed = {(s["model"], s["dataset"]) for s in sections}
        apart = [m for m in scaling["models"] if pair_of(m) not in placed]
        scaling["apart"] = scaling_block(apart) if apart else None

    best = best_strategies(configs, one_host=hosts, include_host_copied=include_host_copied)
    for row in best:
        row["cost_text"] = number(row["cost_node_h"]) if not hosts else "— (one host)"
    failures = failures_by_cause(table)
    failed = table[table["status"] != "ok"]
    skipped = [{"point_id": point.point_id, "reason": why} for point, why in expand_sweep(config).skipped]
    other = table[_flag(table, "other_measurement_version")]
    oversubscribed = table[_flag(table, "oversubscribed")]
    reading = "input_wait_s_median" in table.columns and bool(table["input_wait_s_median"].notna().any())
    return {
        "config": config,
        "config_hash": config.config_hash(),
        "generated": utc_now(),
        "version": ddlbench.__version__,
        "measurement_version": MEASUREMENT_VERSION,
        "include_other_versions": include_other_versions,
        "baseline": BASELINE_STRATEGY,
        "heading": title,
        "about": lambda key: column(key).description,
        "counts": status_counts(table),
        "total": len(table),
        "configurations": len(configs),
        "health": health_section(config.sweep_dir),
        "headlines": headlines(configs, best, one_host=hosts, include_host_copied=include_host_copied),
        "one_host": hosts,
        "one_host_note": ONE_HOST_NOTE,
        "family_note": family_note(best),
        "left_out": sorted({name for row in best for name in row["left_out"]}),
        "best": best,
        "basis_text": BASIS_TEXT,
        "failures": failures,
        "failures_rows": [r | {"examples": ", ".join(r["examples"])} for r in failures],
        "sections": sections,
        "predicted": predicted,
        "scaling": scaling,
        "rank_columns": RANK_COLUMNS,
        "reading": reading,
        "input_note": INPUT_NOTE,
        "failed": [
            r | {"status": display_status(r["status"], r["reason"]), "reason": _text(r["reason"])}
            for r in failed[["point_id", "status", "reason"]].head(SHOWN).to_dict("records")
        ],
        "failed_total": len(failed),
        "skipped": skipped[:SHOWN],
        "skipped_total": len(skipped),
        "other_versions": _plain_rows(other.reindex(columns=["point_id", "measurement_version", "status"]).head(SHOWN)),
        "other_versions_total": len(other),
        "oversubscribed": _plain_rows(oversubscribed.reindex(columns=["point_id", "cores_note"]).head(SHOWN)),
        "oversubscribed_total": len(oversubscribed),
        "points_view": view("points", point_keys, page=50),
        "shared_settings": _shared_settings(table),
        "provenance": provenance(table, config),
        "data_json": Markup(script_json(tables)),
        "script": Markup((templates_dir() / "report.js").read_text()),
    }


def _sections(
    frame: pd.DataFrame,
    table: pd.DataFrame,
    config_keys: set[str],
    config: SweepConfig,
    predicted_ranges: dict[tuple[str, str], tuple[int, int]],
    predicted_keys: list[str],
    scaling: dict[str, Any] | None,
    hosts: bool,
) -> list[dict[str, Any]]:
    """One section per model × dataset that has points, in the sweep's order of models and datasets."""
    ranges = data.pair_ranges(frame)
    present = {(str(m), str(d)) for m, d in zip(table["model"], table["dataset"], strict=True)}
    order = [(m, d) for m in config.models for d in config.datasets if (m, d) in present]
    order += sorted(present - set(order))
    per_pair_drawings = max(1, MAX_DRAWINGS // max(1, len(order)))
    sections, drawn = [], 0
    for model, dataset in order:
        start, stop = ranges.get((model, dataset), (0, 0))
        pair = frame.iloc[start:stop]
        points = table[(table["model"] == model) & (table["dataset"] == dataset)]
        section = pair_section(
            model, dataset, pair, start=start, stop=stop, points=points, table_keys=config_keys, one_host=hosts
        )
        chosen = _drawn_configurations(pair, min(per_pair_drawings, MAX_DRAWINGS - drawn))
        section["drawings"] = [
            {"point_id": d["point_id"], "svg": Markup(d["svg"]), "ranks": d["ranks"]}
            for d in (step_drawings(chosen, table, config.sweep_dir) if len(chosen) else [])
        ]
        drawn += len(section["drawings"])
        if (model, dataset) in predicted_ranges:
            first, last = predicted_ranges[(model, dataset)]
            section["predicted"] = view("predicted", predicted_keys, start=first, stop=last)
        if scaling and not scaling.get("why"):
            models = [m for m in scaling["models"] if pair_of(m) == (model, dataset)]
            section["scaling"] = scaling_block(models) if models else None
        sections.append(section)
    return sections


def _drawn_configurations(pair: pd.DataFrame, limit: int) -> pd.DataFrame:
    """Each strategy's fastest configuration at its largest node count, fastest strategies first."""
    if pair.empty or limit <= 0:
        return pair.iloc[0:0]
    ranked = pair.assign(_value=pd.to_numeric(pair["rep_samples_per_s_median"], errors="coerce"))
    ranked = ranked.sort_values(["nodes", "_value"], ascending=[False, False], kind="stable")
    chosen = ranked.drop_duplicates("strategy").sort_values("_value", ascending=False, kind="stable")
    return chosen.head(limit)


def _shared_settings(table: pd.DataFrame) -> dict[str, str]:
    """Configuration fields with one value over every point (Hoefler & Belli's rule 9: the full setup)."""
    varied = set(data.varying(table))
    shared = {}
    for name in CONFIG_FIELDS:
        if name in varied or name not in table.columns or not len(table):
            continue
        value = table[name].iloc[0]
        shared[name] = data.options_text(value) if name.endswith("_options") else (number(value) or "—")
    return shared


def _flag(table: pd.DataFrame, name: str) -> pd.Series:
    """A yes/no column as plain booleans; all False when the table lacks it (no record read)."""
    if name not in table.columns:
        return pd.Series(False, index=table.index, dtype=bool)
    return table[name].fillna(False).astype(bool)


def _text(value: Any) -> str:
    return "" if missing(value) else str(value)


def _plain_rows(frame: pd.DataFrame) -> list[dict[str, str]]:
    return [{name: number(value) for name, value in row.items()} for row in frame.to_dict("records")]


def _values(table: pd.DataFrame, name: str, *, split: str = "", limit: int = 12) -> str:
    """The distinct values of a column, sorted: 'a, b' or 'a, b, … (40 in all)'."""
    if name not in table.columns:
        return "—"
    found: set[str] = set()
    for value in table[name].dropna().unique():
        found.update(part for part in (str(value).split(split) if split else [str(value)]) if part)
    ordered = sorted(found)
    if not ordered:
        return "—"
    shown = ", ".join(ordered[:limit])
    return shown if len(ordered) <= limit else f"{shown}, … ({len(ordered)} in all)"


def provenance(table: pd.DataFrame, config: SweepConfig) -> dict[str, str]:
    """Where, with what and when the figures were made (from the records), and this report."""
    versions = sorted({int(v) for v in table.get("measurement_version", pd.Series(dtype=float)).dropna()})
    return {
        "Hosts": _values(table, "hostnames", split=","),
        "CPU": _values(table, "cpu_model"),
        "GPU": _values(table, "gpu_model"),
        "Backend": _values(table, "backend"),
        "Launcher": _values(table, "launcher"),
        "torch": _values(table, "torch_version"),
        "NVIDIA driver": _values(table, "driver_version", split=", "),
        "CUDA runtime, cuDNN, NCCL": " · ".join(
            _values(table, name, split=", ") for name in ("cuda_runtime_version", "cudnn_version", "nccl_version")
        ),
        "GPU power limit (W)": _values(table, "gpu_power_limit_w", split=","),
        "GPU SM clock, application (MHz)": _values(table, "gpu_sm_clock_app_mhz", split=","),
        "NVML": _values(table, "nvml"),
        "Host allocator": _values(table, "allocator", split="; "),
        "ddlbench (records)": _values(table, "ddlbench_version"),
        "Git commit (records)": _values(table, "git_commit"),
        "SLURM partition": _values(table, "slurm_partition"),
        "Sweep config hash": config.config_hash()[:16],
        "Measurement version": f"{MEASUREMENT_VERSION} (this ddlbench); records: "
        + (", ".join(str(v) for v in versions) or "—"),
        "Report": f"ddlbench {ddlbench.__version__}, generated {utc_now()}",
    }
