"""The named figures of a run, each with its unit, interval, sample size and basis: what a certificate
judges (ddlbench.certify) and what the results database keeps of a sweep or a certificate (`store`).

Names are paths, stable across runs of the same suite, so a reference file can name them:

- `machine/matmul_flop_per_s/<precision>`, `machine/conv_flop_per_s/<precision>` (FLOP/s) and
  `machine/memory_bandwidth_bytes_per_s` (B/s): the calibration's figures as its machine file holds them
  (ddlbench.analysis.machine.machine_file: median over iterations with the 95 % CI of the median; FLOP/s at the
  size with the highest median);
- `machine/<op>/<library>/<layout>/busbw_bytes_per_s` (B/s): the collective's bus bandwidth at the largest
  message timed, factor·bytes ÷ t with t the median over iterations of the slowest rank's time (NCCL
  tests' convention; factor 2(p−1)/p for all-reduce); its interval is factor·bytes ÷ t's interval ends;
  `machine/<op>/<library>/<layout>/time_s@<bytes>B` (s): the time at the smallest message (latency-bound);
- `train/<configuration>/samples_per_s` (samples/s): a training configuration's global throughput. With
  ≥ 6 repetitions, the median over repetitions of each one's window throughput (samples of the kept window
  ÷ its wall time) and its 95 % CI over repetitions; below that, the median repetition's median step
  throughput and its 95 % CI over steps (the basis says which);
- `scaling/<configuration>/efficiency` (dimensionless): T(n) ÷ T(n0) ÷ (n ÷ n0), T the throughput above,
  n0 the smallest node count of the configuration's series (same in everything but nodes). Its interval
  divides the ends of the two intervals crosswise: it holds at least the 95 % of each (conservative).

A configuration is named by its point id without repetition, digest and replay tag (`resnet8-cifar10-ddp-n1x1-b32-t1`);
two configurations of the suite that share that name (they differ in an option the id does not spell)
get their configuration key appended.

Per-node figures: a configuration pinned to a node (the sweep's `each_node`) is one node's figure, named
as the unpinned configuration with `node` set; the partition's figure of that name is then the median
over nodes (its interval: the 95 % CI of that median, none below 6 nodes).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd

from ddlbench.analysis.keys import JSON_FIELDS, POINT_FIELDS
from ddlbench.analysis.machine.fit import bus_factor
from ddlbench.point import Point
from ddlbench.report.figures import MIN_CI_N, missing
from ddlbench.statistics import median_ci

_ID_TAIL = re.compile(r"-r\d+-[0-9a-f]{8}$")
_NODE_TAG = re.compile(r"-on_[a-z0-9_]+$")
# the replay after the window (Point.replay_steps) leaves the window's figures as they are: not in their name
_REPLAY_TAG = re.compile(r"-rp\d+$")


NEVER_RAN = "never ran: no point of the run left a record of it"  # the basis of such an unmeasured figure
# the kinds of figure that are checks (Figure.check): they judge themselves, are proposed no band, take no part
# in spreads, and their values are counts of findings rather than measurements to follow over a history
CHECK_KINDS = ("replay", "health", "spread")


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One measured figure of a certification run; value None when its points did not succeed."""

    name: str
    unit: str
    kind: str  # machine | throughput | scaling
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int  # the samples the value rests on (iterations, repetitions, steps or nodes: see basis)
    basis: str  # what the value and its interval are over
    node: str | None = None  # the node a per-node figure ran on
    why_missing: str = ""  # why a figure the suite should produce has no value
    # the figure's value in each independent launch (a training figure: each repetition's window throughput);
    # what a regression is judged from (ddlbench.analysis.verdicts). Empty where the figure comes from one
    # launch (a calibration's iterations, a ratio of two configurations), which then draws no verdict.
    launches: tuple[float, ...] = ()
    # a check's own verdict, which needs no reference band (the replay check, ddlbench.certify.replay): "pass"
    # or "failed"; "" for a measured figure, and for a check with nothing to compare
    check: str = ""
    finding: str = ""  # what a check found, in words (the odd replays: where they ran and what differs)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["launches"] = list(self.launches)
        return data

    @classmethod
    def unmeasured(
        cls, name: str, *, unit: str, kind: str, why: str, node: str | None = None, never_ran: bool = False
    ) -> Figure:
        """A figure the suite should produce but has no value for, and why: its points failed, or (`never_ran`)
        none of them left a record (basis NEVER_RAN)."""
        return cls(
            name=name, unit=unit, kind=kind, value=None, ci_low=None, ci_high=None, n=0,
            basis=NEVER_RAN if never_ran else "", node=node, why_missing=why,
        )  # fmt: skip

    @property
    def never_ran(self) -> bool:
        return self.value is None and self.basis == NEVER_RAN


def machine_figures(machine: dict[str, Any]) -> list[Figure]:
    """The calibration's figures from a machine file (ddlbench.analysis.machine.machine_file)."""
    figures = []
    compute = machine.get("compute") or {}
    for key in ("matmul_flop_per_s", "conv_flop_per_s"):
        for precision, figure in sorted((compute.get(key) or {}).items()):
            basis = f"median over iterations at the fastest size {figure.get('size')} (95 % CI of the median)"
            figures.append(_stats_figure(f"machine/{key}/{precision}", "FLOP/s", figure, basis))
    if bandwidth := compute.get("memory_bandwidth_bytes_per_s"):
        basis = f"bytes moved ({bandwidth.get('bytes_moved')} B, read + write) ÷ time, median over iterations"
        figures.append(_stats_figure("machine/memory_bandwidth_bytes_per_s", "B/s", bandwidth, basis))
    for entry in machine.get("collectives") or []:
        curve = entry.get("curve") or []
        if not curve:
            continue
        prefix = f"machine/{entry['op']}/{entry['library']}/{entry['layout']}"
        largest, smallest = curve[-1], curve[0]
        factor = bus_factor(entry["op"], entry["ranks"])
        time = largest["time_s"]
        figures.append(
            Figure(
                name=f"{prefix}/busbw_bytes_per_s",
                unit="B/s",
                kind="machine",
                value=factor * largest["bytes"] / time["value"],
                ci_low=_divide(factor * largest["bytes"], time.get("ci_high")),
                ci_high=_divide(factor * largest["bytes"], time.get("ci_low")),
                n=int(time.get("n") or 0),
                basis=f"bus bandwidth at {largest['bytes']} B: {factor:g}·bytes ÷ median time of the slowest rank",
            )
        )
        basis = f"median over iterations of the slowest rank's time at {smallest['bytes']} B"
        figures.append(_stats_figure(f"{prefix}/time_s@{smallest['bytes']}B", "s", smallest["time_s"], basis))
    return figures


def training_figures(table: pd.DataFrame) -> list[Figure]:
    """Throughput per configuration (per node where pinned), the partition's figure over nodes, and
    scaling efficiency, from an aggregated table (ddlbench.analysis.aggregate: its configuration columns);
    configurations whose points all failed are listed without a value."""
    planned = _planned(table)
    if planned.empty:
        return []
    configs = _configurations(table)
    summaries = configs.to_dict("index") if configs is not None else {}
    rows = [_throughput(row, summaries.get(key)) for key, row in planned.to_dict("index").items()]
    figures: list[Figure] = []
    by_name: dict[str, list[Figure]] = {}
    for figure in rows:
        by_name.setdefault(figure.name, []).append(figure)
    partition: dict[str, Figure] = {}
    for name, group in by_name.items():
        if any(figure.node for figure in group):
            partition[name] = _over_nodes(name, group)
            figures.append(partition[name])
            figures.extend(sorted(group, key=lambda figure: figure.node or ""))
        else:
            partition[name] = group[0]
            figures.append(group[0])
    figures.extend(_scaling(planned, partition))
    return figures


def _configurations(table: pd.DataFrame) -> pd.DataFrame | None:
    """Per configuration, its figures over repetitions and its median repetition's over steps, as the
    table's rows carry them (the median repetition's row holds its step statistics)."""
    if "median_repetition" not in table.columns:
        return None
    fed = table[table["n_repetitions"].notna() & (table["repetition"] == table["median_repetition"])]
    columns = ["config_key", "n_repetitions", "samples_per_s_n"]
    columns += ["rep_samples_per_s_values"] if "rep_samples_per_s_values" in table.columns else []
    columns += [
        f"{prefix}_{stat}"
        for prefix in ("rep_samples_per_s", "samples_per_s")
        for stat in ("median", "ci_low", "ci_high")
    ]
    return fed[columns].drop_duplicates("config_key").set_index("config_key") if len(fed) else None


def _planned(table: pd.DataFrame) -> pd.DataFrame:
    """One row per planned configuration (indexed by its key) with its label, pinned node, node count,
    `unpinned` (equal for the same configuration on different nodes) and `series` (equal over nodes too)."""
    if table.empty:
        return table
    first = table.drop_duplicates("config_key").set_index("config_key")
    counted: dict[str, list[str]] = {}
    for (key, status), count in table.groupby(["config_key", "status"], sort=False).size().items():
        counted.setdefault(key, []).append(f"{status}: {count}")
    statuses = {key: ", ".join(parts) for key, parts in counted.items()}
    fields = [name for name in POINT_FIELDS if name in first.columns and name != "repetition"]
    unpinned = _hashes(first, [name for name in fields if name != "node"])
    frame = pd.DataFrame(
        {
            "label": first["point_id"]
            .str.replace(_ID_TAIL, "", regex=True)
            .str.replace(_NODE_TAG, "", regex=True)
            .str.replace(_REPLAY_TAG, "", regex=True),
            "unpinned": unpinned,
            "series": _hashes(first, [name for name in fields if name not in ("node", "nodes")]),
            "nodes": first["nodes"].astype(int),
            "node": [
                str(node) if not missing(node) and node else None for node in first.get("node", [None] * len(first))
            ],
            "status": [statuses.get(key, "") for key in first.index],
        },
        index=first.index,
    )
    # two configurations the id does not tell apart (an option it does not spell) get a digest of theirs
    owners = frame.groupby("label")["unpinned"].nunique()
    shared = frame["label"].map(owners) > 1
    if shared.any():
        frame.loc[shared, "label"] = [
            f"{label}-{_digest(_point(first.loc[key]), drop=('node',))[:8]}"
            for key, label in frame.loc[shared, "label"].items()
        ]
    return frame


def _hashes(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    """A value per row, equal for rows equal in `columns` (a grouping key within one table)."""
    hashed = pd.util.hash_pandas_object(frame[columns].astype(str), index=False)
    return [f"{value:016x}" for value in hashed]


def _throughput(row: dict[str, Any], summary: dict[str, Any] | None) -> Figure:
    name = f"train/{row['label']}/samples_per_s"
    if summary is None or missing(summary.get("samples_per_s_median")):
        # the repetitions' statuses ("missing: 2", "ok: 1, failed: 2"): all missing = no record of any
        never_ran = all(part.strip().startswith("missing") for part in str(row["status"]).split(","))
        why = "no record: the point never ran" if never_ran else f"no successful repetition ({row['status']})"
        return Figure.unmeasured(
            name, unit="samples/s", kind="throughput", why=why, node=_node(row), never_ran=never_ran
        )
    reps = int(summary["n_repetitions"])
    if reps >= MIN_CI_N:
        value, low, high = (summary[f"rep_samples_per_s_{s}"] for s in ("median", "ci_low", "ci_high"))
        n, basis = reps, f"median over {reps} repetitions of the window throughput (samples ÷ wall time)"
    else:
        value, low, high = (summary[f"samples_per_s_{s}"] for s in ("median", "ci_low", "ci_high"))
        n = int(summary["samples_per_s_n"])
        basis = f"median step throughput of the median repetition (of {reps}), 95 % CI over its {n} steps"
    values = summary.get("rep_samples_per_s_values")
    return Figure(
        name=name,
        unit="samples/s",
        kind="throughput",
        value=float(value),
        ci_low=_float(low),
        ci_high=_float(high),
        n=n,
        basis=basis,
        node=_node(row),
        launches=tuple(json.loads(values)) if isinstance(values, str) else (),
    )


def _over_nodes(name: str, group: list[Figure]) -> Figure:
    """The partition's figure: the median over its nodes' figures, with the CI of that median."""
    values = sorted(figure.value for figure in group if figure.value is not None)
    if len(group) == 1 and values:  # one node: its figure is the partition's, interval and all
        return replace(group[0], node=None, basis=f"the one node's: {group[0].basis}")
    if not values:
        never_ran = all(figure.never_ran for figure in group)
        why = "no node left a record" if never_ran else "no node succeeded"
        return Figure.unmeasured(name, unit="samples/s", kind="throughput", why=why, never_ran=never_ran)
    interval = median_ci(values)
    return Figure(
        name=name,
        unit="samples/s",
        kind="throughput",
        value=statistics.median(values),
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        n=len(values),
        basis=f"median over {len(values)} of {len(group)} nodes' figures (95 % CI of the median over nodes)",
    )


def _scaling(planned: pd.DataFrame, partition: dict[str, Figure]) -> list[Figure]:
    series: dict[str, list[dict[str, Any]]] = {}
    for row in planned.drop_duplicates("unpinned").to_dict("records"):
        series.setdefault(row["series"], []).append(row)
    figures = []
    for rows in series.values():
        base_row = min(rows, key=lambda row: row["nodes"])
        base = partition[f"train/{base_row['label']}/samples_per_s"]
        for row in rows:
            if row["nodes"] > base_row["nodes"]:
                top = partition[f"train/{row['label']}/samples_per_s"]
                figures.append(_efficiency(row, top, base, ideal=row["nodes"] / base_row["nodes"]))
    return figures


def _efficiency(row: dict[str, Any], top: Figure, base: Figure, *, ideal: float) -> Figure:
    name = f"scaling/{row['label']}/efficiency"
    if top.value is None or base.value is None:
        why = f"{'this' if top.value is None else 'the base'} configuration has no figure"
        return Figure.unmeasured(name, unit="1", kind="scaling", why=why)
    bounds = (top.ci_low, top.ci_high, base.ci_low, base.ci_high)
    has_interval = None not in bounds and base.ci_low > 0
    return Figure(
        name=name,
        unit="1",
        kind="scaling",
        value=top.value / base.value / ideal,
        ci_low=top.ci_low / base.ci_high / ideal if has_interval else None,
        ci_high=top.ci_high / base.ci_low / ideal if has_interval else None,
        n=min(top.n, base.n),
        basis=(
            f"(T ÷ T at the series' smallest node count) ÷ {ideal:g}; interval from the ends of both "
            "throughputs' intervals (conservative)"
        ),
    )


def _node(row: dict[str, Any]) -> str | None:
    return None if missing(row["node"]) or not row["node"] else str(row["node"])


def _point(row: pd.Series) -> Point:
    data = {name: row[name] for name in POINT_FIELDS if name in row.index and not missing(row[name])}
    for name in JSON_FIELDS:
        if isinstance(data.get(name), str):
            data[name] = json.loads(data[name])
    for name, value in list(data.items()):
        if hasattr(value, "item"):
            data[name] = value.item()  # numpy scalars from the table
    return Point.from_dict(data)


def _digest(point: Point, *, drop: tuple[str, ...]) -> str:
    spec = point.to_dict()
    for name in ("repetition", *drop):
        spec.pop(name, None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _stats_figure(name: str, unit: str, figure: dict[str, Any], basis: str) -> Figure:
    return Figure(
        name=name,
        unit=unit,
        kind="machine",
        value=float(figure["value"]),
        ci_low=_float(figure.get("ci_low")),
        ci_high=_float(figure.get("ci_high")),
        n=int(figure.get("n") or 0),
        basis=basis,
    )


def _divide(numerator: float, denominator: Any) -> float | None:
    return None if missing(denominator) or not denominator else numerator / float(denominator)


def _float(value: Any) -> float | None:
    return None if missing(value) else float(value)
