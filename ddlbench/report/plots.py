"""Plots as SVG text, for embedding in a self-contained HTML page."""

from __future__ import annotations

import io
import json

import matplotlib

matplotlib.use("Agg")  # no display on login or compute nodes
import matplotlib.pyplot as plt
import pandas as pd

matplotlib.rcParams["svg.fonttype"] = "none"  # keep text as text: smaller, searchable, no font files
matplotlib.rcParams["svg.hashsalt"] = "ddlbench"  # stable ids, so the same data gives the same SVG

from ddlbench.analysis.aggregate import SERIES_KEYS  # noqa: E402


def throughput_vs_nodes_svg(points: pd.DataFrame, model: str) -> str:
    """Global samples/s (median over steps, then over repetitions) against nodes, a line per configuration.

    Error bars span the step-level p5–p95 (medians over repetitions); the dotted line of the same colour
    is ideal linear scaling from the smallest node count.
    """
    figure, axes = plt.subplots(figsize=(6.4, 3.8))
    ok = points[(points["model"] == model) & (points["status"] == "ok")]
    for key, series in ok.groupby(SERIES_KEYS, sort=True):
        by_nodes = series.groupby("nodes").agg(
            median=("samples_per_s_median", "median"),
            p5=("samples_per_s_p5", "median"),
            p95=("samples_per_s_p95", "median"),
        )
        config = dict(zip(SERIES_KEYS, key, strict=True))
        label = "{strategy} {dataset} {ranks_per_node}/node b{batch_size} t{threads}".format(**config)
        if int(config["micro_batches"]) > 1:
            label += f" mb{config['micro_batches']}"
        changed = _options_text(config["strategy_options"])
        if changed:
            label += f" {changed}"
        if config["model_options"] not in ("{}", '{"norm": "batch"}'):
            label += f" {config['model_options']}"
        line = axes.errorbar(
            by_nodes.index,
            by_nodes["median"],
            yerr=[
                (by_nodes["median"] - by_nodes["p5"]).clip(lower=0),
                (by_nodes["p95"] - by_nodes["median"]).clip(lower=0),
            ],
            marker="o",
            capsize=3,
            label=label,
        )
        if len(by_nodes) > 1:  # ideal: throughput proportional to nodes from the smallest count
            base_nodes = by_nodes.index[0]
            ideal = by_nodes["median"].iloc[0] * by_nodes.index / base_nodes
            axes.plot(by_nodes.index, ideal, linestyle=":", color=line[0].get_color(), alpha=0.6)
    axes.set_title(f"{model}: throughput vs nodes")
    axes.set_xlabel("nodes")
    axes.set_ylabel("global samples/s (median step)")
    nodes = sorted(points.loc[points["model"] == model, "nodes"].unique())
    axes.set_xticks(nodes)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if ok.empty:
        axes.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and doctype: the SVG sits inside HTML


def strategy_comparison_svg(points: pd.DataFrame, model: str, dataset: str) -> str:
    """Global samples/s of each strategy side by side, one group of bars per world size (nodes × ranks).

    A bar is the median over repetitions of each point's median step; whiskers span the step-level
    p5–p95. Strategies that split a model and strategies that replicate it consume different global
    batches at the same batch_size, which is why the y axis is samples/s and not steps/s.
    """
    figure, axes = plt.subplots(figsize=(7.2, 3.8))
    ok = points[(points["model"] == model) & (points["dataset"] == dataset) & (points["status"] == "ok")]
    layouts = sorted({(int(n), int(r)) for n, r in zip(ok["nodes"], ok["ranks_per_node"], strict=True)})
    labels = sorted({_strategy_label(row) for row in ok.to_dict("records")})
    width = 0.8 / max(len(labels), 1)
    for index, label in enumerate(labels):
        medians, lows, highs = [], [], []
        for nodes, per_node in layouts:
            rows = ok[
                (ok["nodes"] == nodes)
                & (ok["ranks_per_node"] == per_node)
                & (ok.apply(_strategy_label, axis=1) == label)
            ]
            median = rows["samples_per_s_median"].median() if len(rows) else float("nan")
            medians.append(median)
            # medians over repetitions of p5/p95 need not bracket the median of medians: clip at 0
            lows.append(max(median - rows["samples_per_s_p5"].median(), 0.0) if len(rows) else 0.0)
            highs.append(max(rows["samples_per_s_p95"].median() - median, 0.0) if len(rows) else 0.0)
        positions = [i + (index - (len(labels) - 1) / 2) * width for i in range(len(layouts))]
        axes.bar(positions, medians, width=width, yerr=[lows, highs], capsize=2, label=label)
    axes.set_xticks(range(len(layouts)), [f"{n} node{'s' if n > 1 else ''} × {r}" for n, r in layouts])
    axes.set_title(f"{model} on {dataset}: strategies compared")
    axes.set_ylabel("global samples/s (median step)")
    axes.grid(alpha=0.3, axis="y")
    if ok.empty:
        axes.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.legend(fontsize="small", ncols=2)
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def _options_text(options_json: str) -> str:
    """A point's strategy options as k=v text; points hold only those that differ from the defaults."""
    return " ".join(f"{k}={v}" for k, v in sorted(json.loads(options_json or "{}").items()))


def _strategy_label(row) -> str:
    """The strategy with the layout choices that distinguish its points: micro-batches, hybrid split."""
    label = str(row["strategy"])
    changed = _options_text(row.get("strategy_options", "{}"))
    if changed:
        label += f" {changed}"
    if int(row.get("micro_batches", 1) or 1) > 1:
        label += f" mb{int(row['micro_batches'])}"
    split, world = int(row.get("split", 1) or 1), int(row["nodes"]) * int(row["ranks_per_node"])
    if 1 < split < world:
        label += f" s{split}"
    return label
