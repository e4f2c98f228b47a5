"""Plots as SVG text, for embedding in a self-contained HTML page."""

from __future__ import annotations

import io

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
        if config["model_options"] not in ("{}", '{"norm": "batch"}'):
            label += f" {config['model_options']}"
        line = axes.errorbar(
            by_nodes.index,
            by_nodes["median"],
            yerr=[by_nodes["median"] - by_nodes["p5"], by_nodes["p95"] - by_nodes["median"]],
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
