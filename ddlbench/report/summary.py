"""The answer at the top of the report: which strategy is fastest at each scale and by how much, what it
costs, and which points failed and why.

Best strategy, per model × dataset × scale (nodes, ranks per node, and batch per replica where the
model × dataset varies it): every configuration of that scale is a candidate, each strategy is
represented by its fastest configuration, and the winner is the strategy with the highest median
throughput. Throughput is the median over repetitions of the window throughput when every candidate
has ≥ 6 repetitions (an interval over repetitions exists), else the median repetition's median step
with its 95 % CI over steps; the `basis` says which. The margin is winner ÷ runner-up (a ratio of
medians); their 95 % intervals overlapping means the two are not separable by this measurement
(Hoefler & Belli's rule 7). Cost = nodes ÷ throughput, in node-hours per 10⁶ samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddlbench.analysis.keys import CONFIG_FIELDS, describe, varying_fields
from ddlbench.report.figures import MIN_CI_N, interval_text, missing, number

SCALE_FIELDS = ("model", "dataset", "nodes", "ranks_per_node", "batch_size")
SECONDS_PER_HOUR = 3600.0
_RANK_PREFIX = re.compile(r"^(ranks? [\d\[\], -]+ on \S+: |rank \d+ on [^:]+: )")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Fault|Interrupt|Exit|Warning))\b")


@dataclass(frozen=True, kw_only=True)
class Figure:
    """A configuration's throughput at the basis of its comparison."""

    strategy: str
    label: str  # the strategy and whatever else tells its configuration apart from the others compared
    value: float
    low: float | None
    high: float | None
    n: int | None
    unit: str

    @property
    def text(self) -> str:
        return interval_text(self.value, self.low, self.high, self.n, unit=self.unit)


def basis(configs: pd.DataFrame | list[dict[str, Any]]) -> str:
    """'repetitions' when every configuration has an interval over repetitions (≥ 6), else 'steps'."""
    counts = configs["n_repetitions"] if isinstance(configs, pd.DataFrame) else [r["n_repetitions"] for r in configs]
    if len(counts) and all(not missing(n) and int(n) >= MIN_CI_N for n in counts):
        return "repetitions"
    return "steps"


BASIS_TEXT = {
    "repetitions": "median over repetitions, 95 % CI over repetitions",
    "steps": f"median step of the median repetition, 95 % CI over steps (fewer than {MIN_CI_N} repetitions)",
}


def throughput(row: dict[str, Any], level: str, label: str) -> Figure:
    if level == "repetitions":
        prefix, n, unit = "rep_samples_per_s", row.get("n_repetitions"), "repetitions"
    else:
        prefix, n, unit = "samples_per_s", row.get("samples_per_s_n"), "steps"
    low, high = row.get(f"{prefix}_ci_low"), row.get(f"{prefix}_ci_high")
    return Figure(
        strategy=str(row["strategy"]),
        label=label,
        value=float(row[f"{prefix}_median"]),
        low=None if missing(low) else float(low),
        high=None if missing(high) else float(high),
        n=None if missing(n) else int(n),
        unit=unit,
    )


def cost_node_h(nodes: Any, samples_per_s: float) -> float | None:
    """Node-hours per million samples: nodes ÷ samples/s × 10⁶ ÷ 3600."""
    if missing(samples_per_s) or samples_per_s <= 0:
        return None
    return float(nodes) / samples_per_s * 1e6 / SECONDS_PER_HOUR


def separability(best: Figure, other: Figure) -> str:
    if None in (best.low, best.high, other.low, other.high):
        return "no interval to compare"
    if best.low > other.high or other.low > best.high:  # type: ignore[operator]
        return "separable"
    return "not separable"


def _pairs(configs: pd.DataFrame) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The configurations' rows (the columns a comparison reads) per model × dataset."""
    figures = [f"{p}_{s}" for p in ("rep_samples_per_s", "samples_per_s") for s in ("median", "ci_low", "ci_high")]
    wanted = [*CONFIG_FIELDS, "n_repetitions", "samples_per_s_n", "rep_samples_per_s_noisy", *figures]
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in configs.reindex(columns=wanted).to_dict("records"):
        pairs.setdefault((str(row["model"]), str(row["dataset"])), []).append(row)
    return pairs  # in the table's order: the sweep's models, then its datasets


def best_strategies(configs: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per model × dataset × scale (see the module's docstring), in model, dataset, scale order."""
    rows: list[dict[str, Any]] = []
    for (model, dataset), pair in _pairs(configs).items():
        batch_varies = len({r["batch_size"] for r in pair}) > 1
        fields = ["nodes", "ranks_per_node", *(["batch_size"] if batch_varies else [])]
        groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        for row in pair:
            groups.setdefault(tuple(int(row[f]) for f in fields), []).append(row)
        for key, group in sorted(groups.items()):
            rows.append(_scale_row(model, dataset, dict(zip(fields, key, strict=True)), group))
    return rows


def scale_text(nodes: Any, ranks_per_node: Any, batch: Any = None) -> str:
    text = f"{int(nodes)} node{'s' if int(nodes) != 1 else ''} × {int(ranks_per_node)}/node"
    return text + (f", batch {int(batch)}" if batch is not None else "")


def _scale_row(model: str, dataset: str, values: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    level = basis(records)
    prefix = "rep_samples_per_s" if level == "repetitions" else "samples_per_s"
    label_fields = ["strategy", *varying_fields(records, leave_out=(*SCALE_FIELDS, "strategy"))]
    best_per_strategy: dict[str, Figure] = {}
    measured = [r for r in records if not missing(r[f"{prefix}_median"])]
    for row in sorted(measured, key=lambda r: -float(r[f"{prefix}_median"])):
        strategy = str(row["strategy"])
        if strategy not in best_per_strategy:
            best_per_strategy[strategy] = throughput(row, level, describe(row, label_fields))
    ranked = sorted(best_per_strategy.values(), key=lambda f: -f.value)
    row = {
        "model": model,
        "dataset": dataset,
        "nodes": int(values["nodes"]),
        "ranks_per_node": int(values["ranks_per_node"]),
        "batch_size": int(values["batch_size"]) if "batch_size" in values else None,
        "scale": scale_text(values["nodes"], values["ranks_per_node"], values.get("batch_size")),
        "basis": level,
        "strategies": len(ranked),
        "winner": ranked[0] if ranked else None,
        "runner_up": ranked[1] if len(ranked) > 1 else None,
        "margin": None,
        "separable": "",
        "cost_node_h": cost_node_h(values["nodes"], ranked[0].value) if ranked else None,
    }
    if len(ranked) > 1:
        row["margin"] = ranked[0].value / ranked[1].value if ranked[1].value > 0 else None
        row["separable"] = separability(ranked[0], ranked[1])
    else:
        row["separable"] = f"only {next(iter(best_per_strategy), 'no strategy')} ran at this scale"
    return row


def headlines(configs: pd.DataFrame, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model × dataset: its fastest configuration at any scale, its cheapest, and the scales each
    strategy won (among scales where more than one strategy ran)."""
    out = []
    for (model, dataset), pair in _pairs(configs).items():
        level = basis(pair)
        prefix = "rep_samples_per_s" if level == "repetitions" else "samples_per_s"
        records = [r for r in pair if not missing(r[f"{prefix}_median"])]
        if not records:
            continue
        label_fields = ["strategy", *varying_fields(records, leave_out=("model", "dataset", "strategy"))]
        fastest = max(records, key=lambda r: float(r[f"{prefix}_median"]))
        cheapest = min(records, key=lambda r: cost_node_h(r["nodes"], float(r[f"{prefix}_median"])) or float("inf"))
        wins: dict[str, int] = {}
        contested = [r for r in rows if r["model"] == model and r["dataset"] == dataset and r["strategies"] > 1]
        for row in contested:
            wins[row["winner"].strategy] = wins.get(row["winner"].strategy, 0) + 1
        out.append(
            {
                "model": str(model),
                "dataset": str(dataset),
                "basis": level,
                "fastest": throughput(fastest, level, describe(fastest, label_fields)),
                "fastest_cost": number(cost_node_h(fastest["nodes"], float(fastest[f"{prefix}_median"]))),
                "cheapest": throughput(cheapest, level, describe(cheapest, label_fields)),
                "cheapest_cost": number(cost_node_h(cheapest["nodes"], float(cheapest[f"{prefix}_median"]))),
                "wins": sorted(wins.items(), key=lambda item: (-item[1], item[0])),
                "contested": len(contested),
                "strategies": sorted({str(r["strategy"]) for r in pair}),
            }
        )
    return out


def display_status(status: Any, reason: Any) -> str:
    """The status as the report names it: a failed point whose loss stopped being finite is 'diverged'."""
    if status == "failed" and isinstance(reason, str) and reason.startswith("diverged"):
        return "diverged"
    return str(status)


def cause(reason: Any) -> str:
    """A short group for a failure's reason: its exception's type, else its first clause with numbers as N."""
    if missing(reason) or not str(reason).strip():
        return "no reason given"
    text = _RANK_PREFIX.sub("", str(reason).strip().splitlines()[0])
    found = _EXCEPTION.match(text)
    if found:
        return found.group(1)
    clause = re.split(r"[:;(]", text, maxsplit=1)[0].strip()
    clause = re.sub(r"\d+(\.\d+)?", "N", clause)
    return clause[:60] + ("…" if len(clause) > 60 else "")


def failures_by_cause(table: pd.DataFrame, *, examples: int = 3) -> list[dict[str, Any]]:
    """The points that did not succeed, counted by status and cause, most frequent first."""
    if table.empty:
        return []
    failed = table[table["status"] != "ok"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in failed[["point_id", "status", "reason"]].to_dict("records"):
        key = (display_status(row["status"], row["reason"]), cause(row["reason"]))
        groups.setdefault(key, []).append(row)
    out = [
        {
            "status": status,
            "cause": why,
            "count": len(rows),
            "examples": [str(r["point_id"]) for r in rows[:examples]],
            "example_reason": _shorten("" if missing(rows[0]["reason"]) else str(rows[0]["reason"])),
        }
        for (status, why), rows in groups.items()
    ]
    return sorted(out, key=lambda r: (-r["count"], r["status"], r["cause"]))


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_counts(table: pd.DataFrame) -> dict[str, int]:
    """Points per status as the report names them (ok, failed, diverged, oom, timeout, missing, …)."""
    counts: dict[str, int] = {}
    reasons = table["reason"] if "reason" in table.columns else [None] * len(table)
    for status, reason in zip(table["status"], reasons, strict=True):
        name = display_status(status, reason)
        counts[name] = counts.get(name, 0) + 1
    order = ["ok", "failed", "diverged", "oom", "timeout", "missing"]
    return dict(sorted(counts.items(), key=lambda item: (order.index(item[0]) if item[0] in order else 99, item[0])))
