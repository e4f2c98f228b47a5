"""The report of a calibration: measured curves against their α–β fits, the compute figures (the update's turns
among them), the collectives beside compute with what the analytic model takes from them, and the layer timings."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from markupsafe import Markup

from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.report.plots import svg_text
from ddlbench.templating import template_environment

COMPARED = (  # (row label, path in a machine file, unit scale, unit)
    ("matmul fp32", ("compute", "matmul_flop_per_s", "fp32"), 1e-12, "TFLOP/s"),
    ("matmul tf32", ("compute", "matmul_flop_per_s", "tf32"), 1e-12, "TFLOP/s"),
    ("matmul bf16", ("compute", "matmul_flop_per_s", "bf16"), 1e-12, "TFLOP/s"),
    ("matmul fp16", ("compute", "matmul_flop_per_s", "fp16"), 1e-12, "TFLOP/s"),
    ("memory bandwidth", ("compute", "memory_bandwidth_bytes_per_s"), 1e-9, "GB/s"),
    ("first touch of memory", ("compute", "first_touch_s_per_byte"), 1e9, "ns/B"),
    ("intra-node link bandwidth", ("links", "intra_node", "bandwidth_bytes_per_s"), 1e-9, "GB/s"),
    ("intra-node link latency α", ("links", "intra_node", "alpha_s"), 1e6, "µs"),
    ("inter-node link bandwidth", ("links", "inter_node", "bandwidth_bytes_per_s"), 1e-9, "GB/s"),
    ("inter-node link latency α", ("links", "inter_node", "alpha_s"), 1e6, "µs"),
)


def comparison(machines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per figure of COMPARED, a cell per machine ("" where the file has none)."""
    rows = []
    for label, path, scale, unit in COMPARED:
        cells = []
        for machine in machines:
            value: Any = machine
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, dict):
                value = value.get("value")
            cells.append("" if value is None else f"{value * scale:.4g}")
        rows.append({"label": f"{label} ({unit})", "cells": cells})
    return rows


def render_calibration(machine: dict[str, Any], references: list[dict[str, Any]] | None = None) -> str:
    """The report of a measured machine, beside the machine files of `references` (datasheet ones)."""
    compared = [machine, *(references or [])]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in machine["collectives"]:
        groups.setdefault((entry["library"], entry["link"], entry["layout"]), []).append(entry)
    curves = [
        {
            "title": f"{library}, {link.replace('_', ' ')}, {layout.replace('x', ' node(s) × ')} ranks",
            "svg": Markup(_curves_svg(entries)),
        }
        for (library, link, layout), entries in groups.items()
    ]
    return (
        template_environment(autoescape=True)
        .get_template("calibration.html.j2")
        .render(
            machine=machine,
            curves=curves,
            compute=machine.get("compute", {}),
            compared=[m["name"] for m in compared],
            comparison=comparison(compared),
            layer_timings=[layer_timing_table(entry) for entry in machine.get("layer_timings") or []],
            update_turns=update_turns(machine.get("operator_timings") or []),
            beside_model=[
                {"op": op, "share": share, "stretch": stretch}
                for op, (share, stretch) in MachineModel.from_dict(machine).comm_beside.items()
            ],
        )
    )


def update_turns(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The optimizer step of each operators turn (ranks of a node at once, threads), its figure per element and
    its ratio to the one-rank turn of the same threads (None where that turn is missing)."""
    turns = [entry for entry in entries if entry.get("update_s_per_param")]
    alone = {entry["threads"]: entry["update_s_per_param"]["value"] for entry in turns if entry["ranks_per_node"] == 1}
    rows = []
    for entry in sorted(turns, key=lambda entry: (entry["threads"], entry["ranks_per_node"])):
        figure, one = entry["update_s_per_param"], alone.get(entry["threads"])
        ratio = figure["value"] / one if one else None
        rows.append({"threads": entry["threads"], "ranks": entry["ranks_per_node"], "figure": figure, "ratio": ratio})
    return rows


def layer_timing_table(timings: dict[str, Any]) -> dict[str, Any]:
    """One model's layer timings as rows of milliseconds per batch size: each block's forward and backward and its share
    of the step ((forward + backward) ÷ step, medians), then the loss, the update, the rest and the step."""
    sizes = timings["batch_sizes"]
    steps = [figure["value"] for figure in timings["step_s"]]

    def ms(figures: list[dict[str, Any]]) -> list[str]:
        return [f"{figure['value'] * 1e3:.3g}" for figure in figures]

    def share(*parts: list[dict[str, Any]]) -> list[str]:
        return [f"{sum(part[i]['value'] for part in parts) / step:.1%}" for i, step in enumerate(steps)]

    rows = [
        {
            "label": f"{index}: {block['name']}",
            "forward": ms(block["forward_s"]),
            "backward": ms(block["backward_s"]),
            "share": share(block["forward_s"], block["backward_s"]),
        }
        for index, block in enumerate(timings["blocks"])
    ]
    rows.append({"label": "loss (forward + backward)", "forward": ms(timings["loss_s"]), "backward": [""] * len(sizes)})
    rows[-1]["share"] = share(timings["loss_s"])
    update = [timings["update_s"]] * len(sizes)
    rows.append({"label": "update (zero_grad + step)", "forward": ms(update), "backward": [""] * len(sizes)})
    rows[-1]["share"] = share(update)
    if timings.get("other_s"):
        rows.append(
            {"label": "other (not attributed)", "forward": ms(timings["other_s"]), "backward": [""] * len(sizes)}
        )
        rows[-1]["share"] = share(timings["other_s"])
    rows.append(
        {"label": "step", "forward": ms(timings["step_s"]), "backward": [""] * len(sizes), "share": [""] * len(sizes)}
    )
    options = ", ".join(f"{key}={value}" for key, value in timings["options"].items())
    title = (
        f"{timings['model']} on {timings['dataset']}{f' ({options})' if options else ''}, {timings['precision']}, "
        f"{timings['ranks_per_node']} rank(s) at once × {timings['threads']} thread(s)"
    )
    return {"title": title, "sizes": sizes, "rows": rows}


def _curves_svg(entries: list[dict[str, Any]]) -> str:
    """Time against message size, log–log: medians with their 95 % CI as marks, the fit as a line."""
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for entry in entries:
        sizes = [point["bytes"] for point in entry["curve"]]
        values = [point["time_s"]["value"] for point in entry["curve"]]
        low = [v - (p["time_s"]["ci_low"] or v) for v, p in zip(values, entry["curve"], strict=True)]
        high = [(p["time_s"]["ci_high"] or v) - v for v, p in zip(values, entry["curve"], strict=True)]
        line = axes.errorbar(sizes, values, yerr=[low, high], fmt="o", capsize=2, label=entry["op"])
        fitted = [entry["alpha_s"] + entry["beta_s_per_byte"] * size for size in sizes]
        axes.plot(sizes, fitted, color=line[0].get_color(), linestyle="--", alpha=0.8)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("message bytes")
    axes.set_ylabel("time (s): median over iterations, bars 95 % CI\ndashed: α + β·bytes fit")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize="small")
    return svg_text(figure)
