"""The answer at the top of the report: which strategy is fastest at each scale, whether the measurement
can tell, what it costs, and which points failed and why.

Best strategy, per model × dataset × comparison group. A group holds the configurations that may be
compared like for like (ddlbench.analysis.keys.comparison_key): equal in every field but the strategy's
own (strategy, its options, split, micro-batches) and the per-replica batch, at the same global batch
(samples per optimizer step, Point.global_batch_size), so each strategy is compared at the same
configuration, not each at its fastest. A configuration that no other strategy met at its global batch is
compared at equal per-replica batch where another strategy ran at that one, and its row says so ("per-replica
batch 32 (global batches differ)"). Every configuration of the group is a candidate; its figure is the
median over its launches (repetitions) of the window throughput (samples of the kept window ÷ its wall
time, global samples/s). The winner is the candidate with the highest geometric mean over its launches,
the statistic its verdict tests (the median where a configuration has no per-launch values); the
runner-up the best candidate of another strategy; the margin winner ÷ runner-up, the ratio of those
geometric means (the verdict's ratio, so the two never disagree).

The verdict rests on launches (ddlbench.analysis.verdicts): each group is a cell, one question ("which is
fastest here?") and one family (judge_cell): Welch's t on the log per-launch throughputs; the winner's
claim tested against every candidate of another strategy at α/(k−1), k the candidates, which pays for its
selection, else every such pair, Holm at α/2; so a cell's verdict does not depend on the rest of the sweep.
The winner is "fastest" (`separated`) only when it beats every other strategy's candidates in that family;
"faster" beside the runner-up and each further strategy says which comparisons rejected, with the ratio
of geometric means and its 95 % interval. Across cells, the claims' Benjamini–Hochberg q-values are reported
(family_note), not used to change a cell's verdict. Below 3 launches a side there is no run-to-run
interval and no verdict.

Horovod whose CUDA gradients went through the host (gradient_path "host-copied (gloo)": Horovod built
without NCCL operations) is not a contender: it is named in `left_out` unless `include_host_copied`.
Where every "node" is a process on one host (a local run), the scale says so and no node-hour cost is
given: the processes share one machine's cores and memory. Cost = nodes ÷ throughput, in node-hours per
10⁶ samples, elsewhere.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddlbench.analysis.keys import COMPARISON_FIELDS, CONFIG_FIELDS, describe, varying_fields
from ddlbench.analysis.verdicts import ALPHA, MIN_LAUNCHES, TEST_CELL, benjamini_hochberg, judge_cell, too_few
from ddlbench.report.figures import MIN_CI_N, interval_text, missing, number
from ddlbench.statistics import student_t_quantile

SCALE_FIELDS = ("model", "dataset", "nodes", "ranks_per_node", "batch_size")
SECONDS_PER_HOUR = 3600.0
HOST_COPIED = "host-copied (gloo)"  # ddlbench.train.strategies.horovod.gradient_path
ONE_HOST_NOTE = (
    "every point ran on one host: its 'nodes' are processes sharing that host's cores and memory, so speedup "
    "and efficiency over them are not those of nodes, and no node-hour cost is given"
)
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
    launches: tuple[float, ...] = ()  # each launch's window throughput (samples/s): what a verdict compares
    statistic: str = "median"  # of `value` over its n samples

    @property
    def text(self) -> str:
        if self.statistic != "median" and (self.low is None or self.high is None):
            count = "n=1 launch" if self.n == 1 else f"{self.statistic} of {self.n} {self.unit}"
            return f"{number(self.value)} {count} (no 95 % CI: n < {MIN_LAUNCHES})"
        if self.statistic != "median":
            interval = f"[{number(self.low)}, {number(self.high)}]"
            return f"{number(self.value)} {interval} ({self.statistic} of {self.n} {self.unit})"
        return interval_text(self.value, self.low, self.high, self.n, unit=self.unit)

    @property
    def sentence(self) -> str:
        """'990.4 samples/s (median of 3 launches)', with its 95 % interval where it has one."""
        interval = "" if self.low is None or self.high is None else f" [{number(self.low)}, {number(self.high)}]"
        count = f" ({self.statistic} of {self.n} {self.unit})" if self.n and self.n > 1 else ""
        return f"{number(self.value)}{interval} samples/s{count}"

    @property
    def rank_value(self) -> float:
        """What the ranking and the margin compare: the geometric mean over launches (the verdict's
        statistic), else the figure itself."""
        if self.statistic == "geometric mean" or not self.launches or not all(v > 0 for v in self.launches):
            return self.value
        return math.exp(math.fsum(math.log(v) for v in self.launches) / len(self.launches))


def basis(configs: pd.DataFrame | list[dict[str, Any]]) -> str:
    """'repetitions' when every configuration has an interval over repetitions (≥ 6), else 'steps'."""
    counts = configs["n_repetitions"] if isinstance(configs, pd.DataFrame) else [r["n_repetitions"] for r in configs]
    if len(counts) and all(not missing(n) and int(n) >= MIN_CI_N for n in counts):
        return "repetitions"
    return "steps"


BASIS_TEXT = {
    "repetitions": "median over repetitions, 95 % CI over repetitions",
    "steps": f"median step of the median repetition, 95 % CI over steps (fewer than {MIN_CI_N} repetitions)",
    "launches": (
        f"geometric mean over launches of the window throughput, 95 % CI (Student's t on the logs) from "
        f"{MIN_LAUNCHES} launches; verdict: {TEST_CELL}"
    ),
}


def throughput(row: dict[str, Any], level: str, label: str) -> Figure:
    """The row's throughput at `level`: 'launches', the geometric mean over launches of the window
    throughput with its Student-t 95 % interval on the logs from MIN_LAUNCHES launches (the statistic the
    verdicts test, so ranking, margin and verdict agree); 'repetitions', the median over repetitions; or
    'steps', the median repetition's median step, CI over its steps."""
    launches = launch_values(row)
    if level == "launches" and launches and all(v > 0 for v in launches):
        logs = [math.log(v) for v in launches]
        centre = math.fsum(logs) / len(logs)
        low = high = None
        if len(logs) >= MIN_LAUNCHES:
            spread = math.sqrt(math.fsum((x - centre) ** 2 for x in logs) / (len(logs) - 1) / len(logs))
            half = student_t_quantile(0.975, len(logs) - 1) * spread
            low, high = math.exp(centre - half), math.exp(centre + half)
        return Figure(
            strategy=str(row["strategy"]), label=label, value=math.exp(centre), low=low, high=high,
            n=len(launches), unit="launches", launches=launches, statistic="geometric mean",
        )  # fmt: skip
    if level in ("repetitions", "launches"):
        prefix, n, unit = "rep_samples_per_s", row.get("n_repetitions"), "launches" if level == "launches" else level
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
        launches=launches,
    )


def launch_values(row: dict[str, Any]) -> tuple[float, ...]:
    """Each launch's window throughput of a configuration row (rep_samples_per_s_values, a JSON list)."""
    values = row.get("rep_samples_per_s_values")
    if missing(values) or not values:
        return ()
    return tuple(float(v) for v in (json.loads(values) if isinstance(values, str) else values))


def cost_node_h(nodes: Any, samples_per_s: float) -> float | None:
    """Node-hours per million samples: nodes ÷ samples/s × 10⁶ ÷ 3600."""
    if missing(samples_per_s) or samples_per_s <= 0:
        return None
    return float(nodes) / samples_per_s * 1e6 / SECONDS_PER_HOUR


def one_host(table: pd.DataFrame) -> bool:
    """True when points of several "nodes" ran, yet every point's ranks ran on the same one host (a local
    sweep): its nodes are processes sharing that host."""
    if "hostnames" not in table.columns or "nodes" not in table.columns or table.empty:
        return False
    hosts = {host for value in table["hostnames"].dropna() for host in str(value).split(",") if host}
    return len(hosts) == 1 and int(pd.to_numeric(table["nodes"]).max()) > 1


def is_host_copied(row: dict[str, Any]) -> bool:
    return str(row.get("gradient_path") or "") == HOST_COPIED


def _pairs(configs: pd.DataFrame) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The configurations' rows (the columns a comparison reads) per model × dataset."""
    figures = [f"{p}_{s}" for p in ("rep_samples_per_s", "samples_per_s") for s in ("median", "ci_low", "ci_high")]
    wanted = [
        *dict.fromkeys([*CONFIG_FIELDS, *COMPARISON_FIELDS]),
        "baseline_key",
        "n_repetitions",
        "samples_per_s_n",
        "rep_samples_per_s_noisy",
        "rep_samples_per_s_values",
        "gradient_path",
        *figures,
    ]
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in configs.reindex(columns=wanted).to_dict("records"):
        pairs.setdefault((str(row["model"]), str(row["dataset"])), []).append(row)
    return pairs  # in the table's order: the sweep's models, then its datasets


def best_strategies(
    configs: pd.DataFrame, *, one_host: bool = False, include_host_copied: bool = False
) -> list[dict[str, Any]]:
    """One row per model × dataset × comparison group (see the module's docstring), in model, dataset,
    scale order, with the verdicts of all contested rows judged as one family. `one_host`: every point
    ran on one host (its nodes are processes)."""
    rows: list[dict[str, Any]] = []
    for (model, dataset), pair in _pairs(configs).items():
        others = [f for f in COMPARISON_FIELDS if f not in ("model", "dataset", "global_batch_size")]
        extra = [f for f in others if f not in ("nodes", "ranks_per_node") and len({str(r.get(f)) for r in pair}) > 1]
        for held, group in _comparison_groups(pair, others, include_host_copied):
            rows.append(_scale_row(model, dataset, group, held, extra, one_host, include_host_copied))
    # one question, one family: each contested row is a cell judged alone (ddlbench.analysis.verdicts.judge_cell),
    # so a cell's verdict does not depend on what else the sweep holds; across cells, Benjamini–Hochberg q-values
    # are reported
    for row in rows:
        if row["runner_up"] is not None:
            _judge_row(row)
    contested = [row for row in rows if row["runner_up"] is not None]
    for row, q in zip(contested, benjamini_hochberg([row["p_claim"] for row in contested]), strict=True):
        row["q_value"] = q
    for row in rows:
        row["answer"] = answer(row)
    return rows


def family_note(rows: list[dict[str, Any]]) -> str:
    """What the verdicts control, in words: each cell alone at 5 %; across the report's contested cells, the
    expected number of false claims and how many claims also hold at a 5 % false discovery rate."""
    contested = [row for row in rows if row["runner_up"] is not None]
    claims = [row for row in contested if row["separated"]]
    held = sum(row["q_value"] is not None and row["q_value"] < ALPHA for row in claims)
    return (
        f"Each cell (model × dataset × scale × batch) is one family: its winner called fastest only when it "
        f"beats every other strategy at {ALPHA:g}/(k−1) (k candidates: its selection paid for), else every pair "
        f"tested, Holm at {ALPHA / 2:g}; so a cell's chance of a false 'faster' is at most {ALPHA:g} whatever "
        f"else the sweep holds. Across the {len(contested)} contested cell(s), at most "
        f"{len(contested) * ALPHA:.2g} false claim(s) are expected; {held} of the {len(claims)} 'fastest' "
        f"claim(s) also hold at a false discovery rate of "
        f"{ALPHA:g} over the cells (Benjamini–Hochberg)."
    )


def _judge_row(row: dict[str, Any]) -> None:
    """The row's cell judged as one family: its winner against the runner-up (`verdict`) and each further
    strategy (`behind`); `separated` when the winner is fastest, ahead of every other strategy's candidates."""
    candidates = row["candidates"]
    cell = judge_cell([figure.launches for figure in candidates], [figure.strategy for figure in candidates])
    row["comparisons"], row["p_claim"] = cell.comparisons, cell.p_claim
    winner_index = candidates.index(row["winner"])
    if cell.winner != winner_index:  # the winner has no launches to test: no verdict
        row["verdict"] = too_few(len(row["winner"].launches), len(row["runner_up"].launches))
        return
    for other in (row["runner_up"], *row["rest"]):
        verdict = cell.against.get(candidates.index(other))
        text = "" if verdict is None else verdict.text
        text = text.replace("higher", "faster", 1) if verdict is not None and verdict.direction else text
        if other is not row["runner_up"]:
            row["behind"].append((other.label, text))
            continue
        row["verdict"] = text
        row["p_adjusted"] = None if verdict is None else verdict.p_adjusted
    row["separated"] = cell.fastest


def answer(row: dict[str, Any]) -> str:
    """The row's answer in words: who is fastest at this scale and whether the launches show it, or plainly
    that they cannot tell the strategies apart (and why)."""
    winner, runner_up = row["winner"], row["runner_up"]
    at = f"at {row['scale']}"
    if winner is None:
        return f"{at}: no figures"
    if runner_up is None:
        return f"{at}: only {winner.label} ran, nothing to compare"
    detail = row["verdict"][row["verdict"].find("(") :] if "(" in row["verdict"] else ""
    if row["separated"]:
        text = f"{at}: {winner.label} is fastest, ahead of {runner_up.label} {detail}"
    elif row["p_adjusted"] is not None:
        text = f"{at}: the launches cannot separate {winner.label} from {runner_up.label} {detail}"
    else:
        text = f"{at}: {winner.label} ahead of {runner_up.label} by ×{row['margin']:.3g}, no verdict ({row['verdict']})"
    for label, verdict in row["behind"]:
        word = "also ahead of" if verdict.startswith("faster") else "against"
        text += f"; {word} {label} {verdict.removeprefix('faster ')}"
    return text


def _comparison_groups(
    pair: list[dict[str, Any]], others: list[str], include_host_copied: bool
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The configurations of one model × dataset in groups compared like for like, each with the batch it
    holds equal: first at equal global batch; the configurations no other strategy met there, at equal
    per-replica batch where another strategy ran at it (their global batches then differ); the rest alone."""

    def grouped(rows: list[dict[str, Any]], batch: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
        out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rows:
            out.setdefault(tuple(_order(row.get(f)) for f in [*others, batch]), []).append(row)
        return out

    def contested(rows: list[dict[str, Any]]) -> bool:
        return len({r["strategy"] for r in rows if include_host_copied or not is_host_copied(r)}) > 1

    by_global = grouped(pair, "global_batch_size")
    alone = [row for rows in by_global.values() if not contested(rows) for row in rows]
    by_replica = {key: rows for key, rows in grouped(alone, "batch_size").items() if contested(rows)}
    paired = {id(row) for rows in by_replica.values() for row in rows}
    groups = [(key, "global batch", rows) for key, rows in by_global.items() if contested(rows)]
    groups += [(key, "per-replica batch", rows) for key, rows in by_replica.items()]
    for key, rows in by_global.items():
        left = [row for row in rows if not contested(rows) and id(row) not in paired]
        if left:
            groups.append((key, "global batch", left))
    return [(held, rows) for _, held, rows in sorted(groups, key=lambda item: (item[0], item[1]))]


def _order(value: Any) -> tuple[int, Any]:
    """A sort key that orders numbers as numbers and puts missing values last."""
    if missing(value):
        return (2, "")
    return (0, float(value)) if isinstance(value, int | float) else (1, str(value))


def scale_text(
    nodes: Any, ranks_per_node: Any, batch: Any = None, *, held: str = "global batch", one_host: bool = False
) -> str:
    """'2 nodes × 1/node, global batch 64'; on one host, '2 processes as nodes on one host, …' (with
    '× 2/node' where each "node" runs several ranks); at equal per-replica batch, 'per-replica batch 32
    (global batches differ)'."""
    count = int(nodes)
    if one_host:
        text = f"{count} process{'es as nodes' if count != 1 else ''} on one host"
        if int(ranks_per_node) != 1:
            text += f" × {int(ranks_per_node)}/node"
    else:
        text = f"{count} node{'s' if count != 1 else ''} × {int(ranks_per_node)}/node"
    if batch is None or missing(batch):
        return text
    return text + f", {held} {int(batch)}" + (" (global batches differ)" if held != "global batch" else "")


def _scale_row(
    model: str,
    dataset: str,
    records: list[dict[str, Any]],
    held: str,
    extra: list[str],
    one_host: bool,
    include_host_copied: bool,
) -> dict[str, Any]:
    first = records[0]
    batch = first.get("global_batch_size") if held == "global batch" else first.get("batch_size")
    left_out = [] if include_host_copied else [r for r in records if is_host_copied(r)]
    candidates = [r for r in records if r not in left_out and not missing(r["rep_samples_per_s_median"])]
    label_fields = ["strategy", *varying_fields(candidates, leave_out=(*COMPARISON_FIELDS, "strategy", "batch_size"))]
    figures = (throughput(r, "launches", describe(r, label_fields)) for r in candidates)
    ranked = sorted(figures, key=lambda f: -f.rank_value)
    winner = ranked[0] if ranked else None
    runner_up = next((f for f in ranked[1:] if winner and f.strategy != winner.strategy), None)
    # the best configuration of each further strategy, compared with the winner too
    seen = {f.strategy for f in (winner, runner_up) if f is not None}
    rest = []
    for figure in ranked:
        if figure.strategy not in seen:
            seen.add(figure.strategy)
            rest.append(figure)
    scale = scale_text(first["nodes"], first["ranks_per_node"], batch, held=held, one_host=one_host)
    if extra:
        scale += ", " + describe(first, extra)
    strategies = sorted({f.strategy for f in ranked})
    row = {
        "model": model,
        "dataset": dataset,
        "nodes": int(first["nodes"]),
        "ranks_per_node": int(first["ranks_per_node"]),
        "held_equal": held,
        "global_batch_size": None if missing(first.get("global_batch_size")) else int(first["global_batch_size"]),
        "batch_size": None if missing(batch) else int(batch),  # the batch held equal
        "scale": scale,
        "basis": "launches",
        "strategies": len(strategies),
        "winner": winner,
        "runner_up": runner_up,
        "rest": rest if runner_up is not None else [],
        "behind": [],  # (label, verdict) of each of `rest` against the winner
        "margin": winner.rank_value / runner_up.rank_value
        if winner and runner_up and runner_up.rank_value > 0
        else None,
        "candidates": ranked,  # every candidate of the cell, best first: the family its verdict is judged in
        "verdict": "",
        "separated": False,
        "p_adjusted": None,
        "p_claim": None,  # the winner's claim, within its cell (ddlbench.analysis.verdicts.judge_cell)
        "q_value": None,  # Benjamini–Hochberg over the report's contested cells
        "comparisons": 0,
        "left_out": [f"{r['strategy']} ({HOST_COPIED}: not a contender)" for r in left_out],
        "cost_node_h": None if one_host or winner is None else cost_node_h(first["nodes"], winner.value),
    }
    if runner_up is None:
        row["verdict"] = f"only {strategies[0] if strategies else 'no strategy'} ran at this scale"
    return row


def headlines(
    configs: pd.DataFrame, rows: list[dict[str, Any]], *, one_host: bool = False, include_host_copied: bool = False
) -> list[dict[str, Any]]:
    """Per model × dataset: the cells each strategy won with a verdict, of those where several ran (`tally`),
    and each cell's answer in words (`answer`). No "fastest overall" across scales and batches: configurations
    of different scales answer different questions, and no test compares them."""
    out = []
    for (model, dataset), pair in _pairs(configs).items():
        records = [
            r
            for r in pair
            if not missing(r["rep_samples_per_s_median"]) and (include_host_copied or not is_host_copied(r))
        ]
        if not records:
            continue
        wins: dict[str, int] = {}
        contested = [r for r in rows if r["model"] == model and r["dataset"] == dataset and r["runner_up"]]
        for row in contested:
            if row["separated"]:
                wins[row["winner"].strategy] = wins.get(row["winner"].strategy, 0) + 1
        ranked = sorted(wins.items(), key=lambda item: (-item[1], item[0]))
        undecided = sum(not row["separated"] for row in contested)
        out.append(
            {
                "model": str(model),
                "dataset": str(dataset),
                "basis": "launches",
                "wins": ranked,
                "tally": tally(ranked, len(contested), undecided),
                "answers": [r["answer"] for r in rows if r["model"] == model and r["dataset"] == dataset],
                "undecided": undecided,
                "contested": len(contested),
                "strategies": sorted({str(r["strategy"]) for r in pair}),
            }
        )
    return out


def tally(wins: list[tuple[str, int]], contested: int, undecided: int) -> str:
    """'ddp fastest in 2 of 3 cells where several strategies ran; 1 undecided', from the cells' verdicts."""
    if not contested:
        return "no cell where several strategies ran"
    won = ", ".join(f"{strategy} fastest in {count}" for strategy, count in wins) or "no strategy fastest"
    cells = f"{contested} cell{'s' if contested != 1 else ''} where several strategies ran"
    return f"{won} of {cells}" + (f"; {undecided} undecided" if undecided else "")


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
