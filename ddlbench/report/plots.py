"""Plots as SVG text, for embedding in a self-contained HTML page.

Both plots draw configurations (ddlbench.analysis.configurations), one mark per configuration, never a
mean over configurations. A figure shows one level of statistics for all its marks (`figure_level`):
over repetitions when every configuration in it has ≥ 6 (the window throughput's median over
repetitions and its 95 % CI), else over steps (the median repetition's median step throughput and
its 95 % CI over steps), so a mark and its error bar always measure the same thing. Hollow marks and
hatched bars are noisy (interval wider than ±5 %); '(oversubscribed)' marks a line or bar with at
least one record that ran with cores shared.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display on login or compute nodes
import matplotlib.pyplot as plt
import pandas as pd

matplotlib.rcParams["svg.fonttype"] = "none"  # keep text as text: smaller, searchable, no font files
matplotlib.rcParams["svg.hashsalt"] = "ddlbench"  # stable ids, so the same data gives the same SVG

from ddlbench.analysis.keys import describe, varying_fields  # noqa: E402
from ddlbench.report.figures import MIN_CI_N  # noqa: E402


def figure_level(configs: pd.DataFrame) -> str:
    """'repetitions' when every configuration has enough repetitions for an interval, else 'steps'."""
    if len(configs) and (configs["n_repetitions"] >= MIN_CI_N).all():
        return "repetitions"
    return "steps"


def level_caption(level: str) -> str:
    if level == "repetitions":
        return (
            "global samples/s: median over repetitions of each repetition's window throughput "
            "(samples ÷ wall time); bars: its 95 % CI over repetitions"
        )
    return (
        "global samples/s: median step of the median repetition; bars: 95 % CI of that median over steps "
        f"(none where n ≤ 5; fewer than {MIN_CI_N} repetitions, so no interval over repetitions)"
    )


def _figures(configs: pd.DataFrame, level: str) -> tuple[pd.Series, pd.Series, pd.Series, pd.Series]:
    """Value, lower and upper error-bar lengths (0 without an interval), and the noise flag, per row."""
    prefix = "rep_samples_per_s" if level == "repetitions" else "samples_per_s"
    value = pd.to_numeric(configs[f"{prefix}_median"], errors="coerce")
    low = pd.to_numeric(configs[f"{prefix}_ci_low"], errors="coerce")
    high = pd.to_numeric(configs[f"{prefix}_ci_high"], errors="coerce")
    has_ci = low.notna() & high.notna()
    noisy = configs[f"{prefix}_noisy"].fillna(False).astype(bool) & has_ci
    return value, (value - low).where(has_ci, 0).clip(lower=0), (high - value).where(has_ci, 0).clip(lower=0), noisy


def throughput_vs_nodes_svg(configs: pd.DataFrame, model: str) -> str:
    """Global samples/s against nodes, a line per series (configuration but nodes), with 95 % CIs.

    The dotted line of the same colour is ideal linear scaling from the series' smallest node count."""
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    ours = configs[configs["model"] == model].sort_values("nodes")
    level = figure_level(ours)
    records = ours.to_dict("records")
    label_fields = varying_fields(records, leave_out=("model", "nodes")) or ["strategy"]
    for _, series in ours.groupby("series_key", sort=False):
        value, below, above, noisy = _figures(series, level)
        label = describe(series.iloc[0].to_dict(), label_fields)
        if series["any_oversubscribed"].fillna(False).astype(bool).any():
            label += " (oversubscribed)"
        line = axes.errorbar(series["nodes"], value, yerr=[below, above], marker="o", capsize=3, label=label)
        colour = line[0].get_color()
        if noisy.any():  # hollow marks over the filled ones
            axes.plot(series["nodes"][noisy], value[noisy], "o", color=colour, markerfacecolor="white", zorder=5)
        if len(series) > 1:  # ideal: throughput proportional to nodes from the smallest count
            base_nodes = series["nodes"].iloc[0]
            ideal = value.iloc[0] * series["nodes"] / base_nodes
            axes.plot(series["nodes"], ideal, linestyle=":", color=colour, alpha=0.6)
    axes.set_title(f"{model}: throughput vs nodes")
    axes.set_xlabel("nodes")
    axes.set_ylabel(_ylabel(level))
    axes.set_xticks(sorted(ours["nodes"].unique()))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if ours.empty:
        axes.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.18), ncols=2)
    return svg_text(figure)


def strategy_comparison_svg(configs: pd.DataFrame, model: str, dataset: str) -> str:
    """Global samples/s of each configuration side by side, one group of bars per layout (nodes × ranks).

    Strategies that split a model and strategies that replicate it consume different global batches at
    the same batch_size, which is why the y axis is samples/s and not steps/s."""
    figure, axes = plt.subplots(figsize=(7.2, 4.0))
    ours = configs[(configs["model"] == model) & (configs["dataset"] == dataset)]
    level = figure_level(ours)
    placed = [(int(n), int(r)) for n, r in zip(ours["nodes"], ours["ranks_per_node"], strict=True)]
    layouts = sorted(set(placed))
    records = ours.to_dict("records")
    label_fields = varying_fields(records, leave_out=("model", "dataset", "nodes", "ranks_per_node")) or ["strategy"]
    labels = [describe(row, label_fields) for row in records]
    ours = ours.assign(_label=labels, _layout=placed)
    names = sorted(set(labels))
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        bars = ours[ours["_label"] == name]
        value, below, above, noisy = _figures(bars, level)
        positions = [layouts.index(layout) + (index - (len(names) - 1) / 2) * width for layout in bars["_layout"]]
        if bars["any_oversubscribed"].fillna(False).astype(bool).any():
            name += " (oversubscribed)"
        drawn = axes.bar(positions, value, width=width, yerr=[below, above], capsize=2, label=name)
        for patch, flag in zip(drawn.patches, noisy, strict=True):
            if flag:
                patch.set_hatch("//")
    axes.set_xticks(range(len(layouts)), [f"{n} node{'s' if n > 1 else ''} × {r}" for n, r in layouts])
    axes.set_title(f"{model} on {dataset}: strategies compared")
    axes.set_ylabel(_ylabel(level))
    axes.grid(alpha=0.3, axis="y")
    if ours.empty:
        axes.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.12), ncols=2)
    return svg_text(figure)


def _ylabel(level: str) -> str:
    return f"global samples/s\n(bars: 95 % CI over {level})"


def svg_text(figure) -> str:
    buffer = io.StringIO()
    # tight: the legend sits below the axes, and the saved figure grows to hold it
    figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and doctype: the SVG sits inside HTML
