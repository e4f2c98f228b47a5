"""Two runs side by side, figure by figure: the change, and whether running again could explain it.

For each figure both runs hold (same name, same node): change = (B − A) ÷ A, a fraction of the medians.
The verdict rests on launches (ddlbench.analysis.verdicts): the figure's per-launch values in A against
those in B (each repetition's window throughput for a training figure), Welch's t on their logarithms,
Holm-corrected over every figure of the comparison (one family). It says which way a figure went for its
direction (lower is better for times, unit `s`; higher for every other figure: rates, bandwidths, FLOP/s,
efficiencies):

- `better` / `worse`: the adjusted p < 0.05;
- `same within noise`: tested, and not separated;
- `one launch: no run-to-run interval` (or how many launches are missing): a run holds fewer than 3
  launches of the figure; the steps or iterations of one launch are not independent samples of the
  machine, so they draw no verdict, however narrow their interval;
- `only in A` / `only in B`, or `not measured` where a run holds the figure without a value.

`ratio` (geometric mean of B's launches ÷ A's) and its 95 % interval, `p` (Holm-adjusted) and the
launch counts come with every tested row.

Beside the figures, what changed in the software and cards the runs ran with (`provenance_changes`: "driver
580.159.04 → 590.2; cuDNN 91900 → 92000; GPU power limit 700 W → 600 W"), from each run's provenance
(ddlbench.history.store.run_provenance): a figure that moved may owe it to them.
"""

from __future__ import annotations

import json
from typing import Any

from ddlbench.analysis.verdicts import Contrast, contrast, judge
from ddlbench.history.db import Run

SAME = "same within noise"


# each provenance fact compare names (ddlbench.history.store.PROVENANCE_COLUMNS): its name and unit
PROVENANCE_NAMES: dict[str, tuple[str, str]] = {
    "driver_version": ("driver", ""),
    "cuda_runtime_version": ("CUDA runtime", ""),
    "cudnn_version": ("cuDNN", ""),
    "nccl_version": ("NCCL", ""),
    "torch_version": ("torch", ""),
    "gpu_model": ("GPU", ""),
    "gpu_power_limit_w": ("GPU power limit", "W"),
    "gpu_sm_clock_app_mhz": ("GPU SM application clock", "MHz"),
    "gpu_sm_clock_max_mhz": ("GPU SM max clock", "MHz"),
    "gpu_mem_clock_app_mhz": ("GPU memory application clock", "MHz"),
    "gpu_mem_clock_max_mhz": ("GPU memory max clock", "MHz"),
    "gpu_ecc_mode": ("GPU ECC mode", ""),
    "gpu_mig_mode": ("GPU MIG mode", ""),
    "gpu_persistence_mode": ("GPU persistence mode", ""),
    "gpu_vbios_version": ("GPU VBIOS", ""),
    "cpu_model": ("CPU", ""),
    "allocator": ("host allocator", ""),
}


def provenance_changes(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str]:
    """What differs between two runs' provenance, named: ["driver 580.1 → 590.2", "GPU power limit 700 W →
    600 W"]; a fact one run lacks reads "none". Empty where either run kept no provenance (stored before
    the database kept it): nothing can be said."""
    if not a or not b:
        return []
    changes = []
    for key, (name, unit) in PROVENANCE_NAMES.items():
        before, after = a.get(key), b.get(key)
        if before != after:
            changes.append(f"{name} {_with_unit(before, unit)} → {_with_unit(after, unit)}")
    return changes


def _with_unit(value: str | None, unit: str) -> str:
    if value is None:
        return "none"
    return f"{value} {unit}" if unit else value


def higher_is_better(unit: str) -> bool:
    return unit != "s"


def compare_runs(a: Run, b: Run) -> list[dict[str, Any]]:
    """One row per figure of either run, in A's order then B's new ones; the verdicts judged together."""
    first = {(figure["name"], figure["node"]): figure for figure in a.figures}
    second = {(figure["name"], figure["node"]): figure for figure in b.figures}
    keys = list(first) + [key for key in second if key not in first]
    return judge_rows([compare_figures(first.get(key), second.get(key), key=key) for key in keys])


def compare_figures(
    a: dict[str, Any] | None, b: dict[str, Any] | None, *, key: tuple[str, str | None]
) -> dict[str, Any]:
    """One figure's row before the family's verdict: its change and its contrast (see judge_rows)."""
    row: dict[str, Any] = {"name": key[0], "node": key[1], "a": a, "b": b, "change": None}
    if a is None or b is None:
        return row | {"verdict": "only in B" if a is None else "only in A"}
    row["unit"] = b["unit"]
    if a["value"] is None or b["value"] is None:
        return row | {"verdict": "not measured"}
    row["contrast"] = tested = contrast(launches(a), launches(b))
    # the change and the verdict from one statistic: the ratio of geometric means over launches, where both
    # runs kept per-launch values; else the figures' own values (one launch each: its value)
    if tested.ratio is not None:
        row["change"] = tested.ratio - 1
    elif a["value"]:
        row["change"] = (b["value"] - a["value"]) / abs(a["value"])
    return row


def judge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's verdict, with Holm's correction over the rows that have a contrast."""
    tested = [row for row in rows if isinstance(row.get("contrast"), Contrast)]
    for row, verdict in zip(tested, judge([row.pop("contrast") for row in tested]), strict=True):
        item = verdict.contrast
        row |= {"ratio": item.ratio, "ratio_ci": (item.ci_low, item.ci_high), "p": verdict.p_adjusted}
        row |= {"launches": (item.n_a, item.n_b)}
        if verdict.direction is None:
            row["verdict"] = item.why_no_test or SAME
        else:
            up = verdict.direction == "higher"
            row["verdict"] = "better" if up == higher_is_better(row["unit"]) else "worse"
    return rows


def launches(figure: dict[str, Any]) -> list[float]:
    """The figure's per-launch values (a list, or JSON text as the database keeps it). A figure that keeps
    none came from one launch (a calibration's iterations, a ratio of two configurations): its value is
    that launch's."""
    values = figure.get("launches")
    if not values:
        return [] if figure.get("value") is None else [float(figure["value"])]
    if isinstance(values, str):
        values = json.loads(values)
    return [float(v) for v in values]


def regressions(previous: Run, figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures of a new certificate that got worse than in `previous` (the last passing certificate of
    the same suite, partition and measurement version), by compare_runs' rule, whatever their reference
    band says: from launches, Holm-corrected over the figures both hold."""
    before = {(figure["name"], figure["node"]): figure for figure in previous.figures}
    rows = judge_rows(
        [
            compare_figures(before[key], figure, key=key)
            for figure in figures
            if (key := (figure["name"], figure["node"])) in before
        ]
    )
    return [
        {
            "name": row["name"],
            "node": row["node"],
            "unit": row["unit"],
            "value": row["b"]["value"],
            "previous_value": row["a"]["value"],
            "change": row["change"],
            "ratio": row["ratio"],
            "p": row["p"],
            "previous_run": previous.id,
            "previous_date": previous.date,
        }
        for row in rows
        if row["verdict"] == "worse"
    ]
