"""A sweep's records (its aggregated table) as series to model: one figure over one or more parameters,
everything else held fixed, with every repetition kept.

Each value is one launch: the table has one row per repetition (an independent launch of the same
configuration), and a series takes one figure per row, never a launch's per-step statistics, so the
spread among a point's values, and the prediction bands that rest on it, is run-to-run variation.
The figures, per repetition r of a configuration (its window throughput R_r = samples of the kept window ÷
the window's wall time, samples_per_s_overall in the table; B the global batch, Point.global_batch_size,
the table's global_batch_size; n the nodes):
- samples_per_s: R_r (samples/s);
- step_time_s: B / R_r (s), the mean step time of the window;
- speedup: R_r / R̃₀ with R̃₀ the median over repetitions of the series' smallest scale (dimensionless);
  for several parameters, the point where all are smallest (dimensionless);
- efficiency: speedup / (s / s₀) with s the first modelled parameter (dimensionless);
- cost_node_h_per_epoch: n · E / R_r / 3600 (node-hours per epoch of E samples; E from --epoch-samples or
  the dataset's training-set size); times price_per_node_hour when one is given, cost_per_epoch (currency).
Only successful records of this measurement version count; a failed point is absent, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ddlbench.analysis.keys import CONFIG_FIELDS, describe, split_follows_world, varying_fields
from ddlbench.config.adaptive import NUMERIC_PARAMETERS
from ddlbench.errors import DdlbenchError

# the names are ddlbench.config.adaptive.MODELLED_FIGURES (what the adaptive key may name), in this order
FIGURES = {
    "samples_per_s": ("samples/s", "R = samples of the kept window / its wall time"),
    "step_time_s": ("s", "B / R, B the global batch"),
    "speedup": ("", "R / R0, R0 the median at the series' smallest scale"),
    "efficiency": ("", "speedup / (x / x0)"),
    "cost_node_h_per_epoch": ("node-h", "nodes * epoch samples / R / 3600"),
    "cost_per_epoch": ("currency", "cost_node_h_per_epoch * price per node-hour"),
}


@dataclass(frozen=True, kw_only=True)
class Series:
    """One figure of one configuration family over `parameters`, every repetition kept."""

    figure: str
    parameters: tuple[str, ...]
    label: str  # what is held fixed, e.g. "ddp resnet8 cifar10 b32"
    x: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return FIGURES.get(self.figure, ("", ""))[0]

    def array(self) -> np.ndarray:
        return np.asarray(self.x, dtype=float)

    def lists(self) -> list[list[float]]:
        return [list(v) for v in self.values]


def used_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The successful rows of this measurement version."""
    if table.empty or "status" not in table.columns or "samples_per_s_overall" not in table.columns:
        return table.iloc[0:0]  # nothing measured: a sweep whose every point failed has no figure columns
    used = table["status"] == "ok"
    if "other_measurement_version" in table.columns:
        used &= table["other_measurement_version"].fillna(False).astype(bool) == False  # noqa: E712
    return table[used & table["samples_per_s_overall"].notna()]


def series_from_table(
    table: pd.DataFrame,
    *,
    over: tuple[str, ...] = ("nodes",),
    figures: tuple[str, ...] = ("step_time_s", "samples_per_s", "speedup", "efficiency", "cost_node_h_per_epoch"),
    epoch_samples: int | None = None,
    price_per_node_hour: float | None = None,
    min_points: int = 2,
) -> list[Series]:
    """Every series of the table over `over` with at least `min_points` points, for each figure."""
    for name in over:
        if name not in NUMERIC_PARAMETERS:
            raise DdlbenchError(f"cannot model over {name!r}; parameters: {', '.join(NUMERIC_PARAMETERS)}")
    for figure in figures:
        if figure not in FIGURES:
            raise DdlbenchError(f"figure {figure!r} unknown; figures: {', '.join(FIGURES)}")
    if "cost_per_epoch" in figures and price_per_node_hour is None:
        raise DdlbenchError("cost_per_epoch needs a price per node-hour (--price-per-node-hour, or the site file's)")
    rows = used_rows(table)
    if rows.empty:
        return []
    implied = {"nodes", "ranks_per_node"} if "world_size" in over else set()
    held = [
        name
        for name in CONFIG_FIELDS
        if name in rows.columns and name not in over and name not in implied and not _follows(name, over)
    ]
    # what a series reads (its configuration, its parameters, the figures' inputs): a study's table has
    # hundreds of columns, and grouping them all costs seconds
    wanted = {*CONFIG_FIELDS, *over, "samples_per_s_overall", "global_batch_size", "nodes"}
    rows = rows[[name for name in rows.columns if name in wanted]]
    by = [rows[name].astype(str) for name in held]
    if _follows("split", over) and "split" in rows.columns:
        # a hybrid's split is its own choice (keys.series_key): one series per split, never mixed as repetitions
        by.append(
            pd.Series([_own_split(s, t) for s, t in zip(rows["split"], rows["strategy"], strict=True)], rows.index)
        )
    inputs = {
        name: rows[name].to_numpy(dtype=float, na_value=np.nan)
        for name in ("samples_per_s_overall", "global_batch_size", "nodes")
        if name in rows.columns
    }
    scales = np.column_stack([rows[name].to_numpy(dtype=float) for name in over])
    families = []
    for _, members in sorted(rows.groupby(by, sort=True, dropna=False).indices.items()):
        # the family's points: its distinct values of `over`, ascending, each with its rows in table order
        distinct, which = np.unique(scales[members], axis=0, return_inverse=True)
        points = [(tuple(float(v) for v in value), members[which.reshape(-1) == k]) for k, value in enumerate(distinct)]
        if len(points) >= min_points:
            families.append((rows.iloc[members[0]].to_dict(), points))
    # a label names what tells the series apart, after the model, dataset and strategy
    varying = varying_fields([first for first, _ in families], leave_out=(*over, "model", "dataset", "strategy"))
    out: list[Series] = []
    for first, points in families:
        label = (
            describe(first, ["strategy", "model", "dataset", *varying]).replace("model=", "").replace("dataset=", "")
        )
        for figure in figures:
            values = _figure_values(figure, points, inputs, first, epoch_samples, price_per_node_hour)
            if values is None:
                continue
            out.append(
                Series(
                    figure=figure,
                    parameters=over,
                    label=label,
                    x=tuple(p for p, _ in points),
                    values=values,
                    fixed={name: first.get(name) for name in held} | _split_held(first, over),
                )
            )
    return out


def _follows(name: str, over: tuple[str, ...]) -> bool:
    # split grows with the world for strategies that cut one replica over all ranks: keys.series_key's rule
    return name == "split" and ("nodes" in over or "world_size" in over)


def _own_split(split: Any, strategy: Any) -> str:
    """The split where it is a choice (hybrids, data parallelism's 1); "world" where it follows the world."""
    return "world" if split_follows_world(str(strategy)) else str(split)


def _split_held(first: dict[str, Any], over: tuple[str, ...]) -> dict[str, Any]:
    """split in the series' fixed fields where it is held (left out where it grows with the world)."""
    if not _follows("split", over) or "split" not in first or split_follows_world(str(first.get("strategy"))):
        return {}
    return {"split": first["split"]}


def _figure_values(figure, points, inputs, first, epoch_samples, price):
    """The figure's values at each point (`points`: its x and its rows' positions in `inputs`' arrays)."""
    rates = [inputs["samples_per_s_overall"][rows] for _, rows in points]
    if figure == "samples_per_s":
        return tuple(tuple(r) for r in rates)
    if figure == "step_time_s":
        return tuple(tuple(inputs["global_batch_size"][rows] / r) for (_, rows), r in zip(points, rates, strict=True))
    if figure in ("speedup", "efficiency"):
        base = float(np.median(rates[0]))
        x0 = points[0][0][0]
        return tuple(
            tuple(r / base if figure == "speedup" else r / base / (p[0] / x0))
            for (p, _), r in zip(points, rates, strict=True)
        )
    samples = epoch_samples or _dataset_samples(str(first.get("dataset")))
    if samples is None:
        return None  # the figure needs an epoch's size: skipped, the CLI says how to give it
    node_hours = tuple(
        tuple(inputs["nodes"][rows] * samples / r / 3600) for (_, rows), r in zip(points, rates, strict=True)
    )
    if figure == "cost_node_h_per_epoch":
        return node_hours
    return tuple(tuple(v * price for v in reps) for reps in node_hours)


def _dataset_samples(name: str) -> int | None:
    from ddlbench.catalog import DATASETS

    try:
        return DATASETS.get(name).train_samples
    except (KeyError, AttributeError, DdlbenchError):
        return None
