"""matplotlib set up for SVG text embedded in a self-contained HTML page, and the figure → SVG step.

The report's own charts are hand-written SVG (ddlbench.report.charts); matplotlib draws what needs its
reach: one step of every rank (ddlbench.report.inside), the scaling models' bands
(ddlbench.report.scaling) and the calibration report's curves (ddlbench.calibrate.report). Text stays text
(svg.fonttype none), XML-escaped by matplotlib, and ids are stable so the same data gives the same SVG.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display on login or compute nodes
import matplotlib.pyplot as plt

matplotlib.rcParams["svg.fonttype"] = "none"  # keep text as text: smaller, searchable, no font files
matplotlib.rcParams["svg.hashsalt"] = "ddlbench"  # stable ids, so the same data gives the same SVG

__all__ = ["plt", "svg_text"]


def svg_text(figure) -> str:
    buffer = io.StringIO()
    # tight: the legend sits below the axes, and the saved figure grows to hold it
    figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and doctype: the SVG sits inside HTML
