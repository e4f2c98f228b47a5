"""The analytical model's recommendation against the measured best, scored over launches.

A *cell* is a choice a user has at one scale: the measured points equal in model, dataset, nodes, ranks
per node, precision, threads and every other comparison field (ddlbench.analysis.keys.comparison_key)
but the global batch. Its candidates are its measured configurations (each strategy at the layout and
batch the sweep ran it); a cell is scored when they span at least two strategies. Strategies in one cell
may run different global batches (ddp on 2 ranks at batch 16 runs 32 samples a step, gpipe at batch 16
runs 16), so candidates are ranked by throughput, never by step time:

    samples_per_s = global_batch_size / step_time_s                  (samples/s, the whole job)

- recommended: the candidate with the highest predicted samples/s (`predicted_samples_per_s`) among
  those the model predicts to fit in memory (all of them when it predicts none to fit), as the oracle
  (ddlbench.analysis.analytic.oracle) recommends;
- measured best: the candidate with the highest median over its launches of the window throughput
  (`samples_per_s_overall`, samples of the kept window ÷ its wall time, one value per repetition);
- ratio: the recommended's measured throughput ÷ the best's, geometric means over launches, with its 95 %
  interval (ddlbench.analysis.verdicts.contrast: Welch's t on log per-launch values).

A cell is a *hit* when the recommended is the measured best (its median equals the highest), or when it
is not measurably slower than the best: Welch's t between their launches (at least MIN_LAUNCHES each)
finds no "lower" verdict, Holm-corrected over the cells that needed a test (one family per score). With
fewer launches on either side there is no run-to-run interval, so only exact agreement is a hit. The
score is hits ÷ cells, against issue 22's target TARGET. Rows of another measurement version
(`other_measurement_version`) are left out, and so is a configuration without a positive measured or
predicted throughput. The measured best is the largest of several
noisy medians, so it is biased upwards (the winner's curse): a test against it errs towards a miss.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import pandas as pd

from ddlbench.analysis.analytic.accuracy import NEVER_SEEN, PROFILED, seen
from ddlbench.analysis.keys import comparison_key, describe, varying_fields
from ddlbench.analysis.verdicts import MIN_LAUNCHES, contrast, judge

TARGET = 0.90  # issue 22: share of cells where the recommendation is the best or within its interval
RULE = (
    "A cell is a hit when the configuration with the highest predicted samples/s (among those predicted to "
    "fit) is the one with the highest measured samples/s (median over launches), or is not measurably slower "
    "than it (Welch's t on log per-launch throughput, Holm over the cells tested, α = 0.05); with fewer than "
    f"{MIN_LAUNCHES} launches on either side there is no interval and only exact agreement counts."
)
# what a cell's name always shows; any other comparison field in which cells differ is named too
CELL_LABEL = ("model", "dataset", "nodes", "ranks_per_node", "precision")
REQUIRED = ("config_key", "strategy", "samples_per_s_overall", "predicted_samples_per_s")


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One scale's choice: what the model recommended, what was fastest, and whether that is a hit."""

    label: str
    seen: str  # PROFILED when the calibration profiled any of the cell's candidates' model, else NEVER_SEEN
    compared: tuple[str, ...]  # the candidates, each a configuration named by what sets it apart
    strategies: int
    recommended: str
    recommended_predicted_samples_per_s: float  # the model's figure (samples/s)
    measured_best: str
    recommended_samples_per_s: float  # median over the recommended's launches (samples/s)
    best_samples_per_s: float  # median over the best's launches (samples/s)
    launches: tuple[int, int]  # (recommended, best)
    ratio: float | None  # recommended ÷ best, geometric means over launches (1 when they agree)
    ci_low: float | None  # 95 % interval of the ratio (None without a test)
    ci_high: float | None
    verdict: str
    hit: bool

    @property
    def agrees(self) -> bool:
        return self.recommended == self.measured_best


@dataclass(frozen=True, kw_only=True)
class Score:
    """The recommendation's score over a sweep: hits ÷ cells, with every cell behind it."""

    cells: tuple[Cell, ...]
    target: float = TARGET
    rule: str = field(default=RULE, repr=False)

    @property
    def n(self) -> int:
        return len(self.cells)

    @property
    def hits(self) -> int:
        return sum(cell.hit for cell in self.cells)

    @property
    def share(self) -> float | None:
        """hits ÷ cells (dimensionless); None without a cell."""
        return self.hits / self.n if self.cells else None

    @property
    def met(self) -> bool | None:
        return None if self.share is None else self.share >= self.target

    def of(self, label: str) -> Score:
        """The score over the cells whose `seen` is `label` (PROFILED or NEVER_SEEN)."""
        if label not in (PROFILED, NEVER_SEEN):
            raise ValueError(f"seen is {PROFILED!r} or {NEVER_SEEN!r}, not {label!r}")
        return Score(cells=tuple(c for c in self.cells if c.seen == label), target=self.target)


@dataclass(frozen=True, kw_only=True)
class _Candidate:
    name: str
    strategy: str
    predicted: float  # samples/s
    fits: bool
    launches: tuple[float, ...]  # measured samples/s, one per repetition

    @property
    def median(self) -> float:
        return float(pd.Series(self.launches).median())


def cell_key(row: dict) -> tuple[tuple[str, object], ...]:
    """The comparison key without the global batch: equal for the configurations one cell compares."""
    return tuple((name, value) for name, value in comparison_key(row) if name != "global_batch_size")


def score(joined: pd.DataFrame) -> Score:
    """The recommendation's score over `joined` (accuracy.join: measured points, one row per launch, with
    their predictions). Raises ValueError naming the columns it lacks."""
    if joined.empty:
        return Score(cells=())
    missing = [name for name in REQUIRED if name not in joined.columns]
    if missing:
        raise ValueError(f"the recommendation score needs the columns {', '.join(missing)} (accuracy.join's)")
    rows = joined
    if "other_measurement_version" in rows.columns:  # figures of another version measure something else
        rows = rows[rows["other_measurement_version"].fillna(False) != True]  # noqa: E712
    groups: dict[tuple, list[dict]] = {}
    for row in rows.to_dict("records"):
        groups.setdefault(cell_key(row), []).append(row)
    differing = _differing(groups, CELL_LABEL)
    drafts = []
    for key, members in groups.items():  # in the table's order (the sweep's)
        candidates = _candidates(members)
        if len({c.strategy for c in candidates}) < 2:
            continue
        fitting = [c for c in candidates if c.fits] or candidates
        recommended = max(fitting, key=lambda c: c.predicted)
        best = max(candidates, key=lambda c: c.median)
        if recommended.median >= best.median:  # a tie with the best is the best
            best = recommended
        fields = dict(key)
        label = " ".join(f"{name}={fields[name]}" for name in (*CELL_LABEL, *differing) if fields[name] is not None)
        profiled = any(seen(row.get("predicted_compute_source")) == PROFILED for row in members)
        drafts.append((label, PROFILED if profiled else NEVER_SEEN, candidates, recommended, best))
    # the disagreements are one family of verdicts (Holm)
    tests = [contrast(best.launches, rec.launches) for *_, rec, best in drafts if rec is not best]
    verdicts = iter(judge(tests))
    cells = []
    for label, seen_label, candidates, rec, best in drafts:
        if rec is best:
            ratio, low, high = 1.0, None, None
            verdict, hit = "agreement: the recommended is the measured best", True
        else:
            judged = next(verdicts)
            item = judged.contrast
            ratio, low, high = item.ratio, item.ci_low, item.ci_high
            if item.tested:
                verdict, hit = judged.text, judged.direction != "lower"
            else:
                verdict, hit = f"{judged.text}; only exact agreement counts", False
        cells.append(
            Cell(
                label=label,
                seen=seen_label,
                compared=tuple(c.name for c in candidates),
                strategies=len({c.strategy for c in candidates}),
                recommended=rec.name,
                recommended_predicted_samples_per_s=rec.predicted,
                measured_best=best.name,
                recommended_samples_per_s=rec.median,
                best_samples_per_s=best.median,
                launches=(len(rec.launches), len(best.launches)),
                ratio=ratio,
                ci_low=low,
                ci_high=high,
                verdict=verdict,
                hit=hit,
            )
        )
    return Score(cells=tuple(cells))


def _candidates(members: list[dict]) -> list[_Candidate]:
    """The cell's configurations, named by the strategy and the fields in which they differ (and their
    global batch where those differ), each with its prediction and per-launch throughputs."""
    by_config: dict[str, list[dict]] = {}
    for row in members:
        by_config.setdefault(str(row["config_key"]), []).append(row)
    firsts = [rows[0] for rows in by_config.values()]
    names = ["strategy", *varying_fields(firsts, leave_out=("strategy", "batch_size"))]
    if len({r["batch_size"] for r in firsts if "batch_size" in r}) > 1:
        names.append("batch_size")
    batches = {r.get("global_batch_size") for r in firsts}
    out, taken = [], set()
    for config, rows in by_config.items():
        first = rows[0]
        name = describe(first, names)
        if len(batches) > 1:
            name += f" (global batch {first.get('global_batch_size')})"
        if name in taken:  # two configurations alike in what describe shows: tell them apart by key
            name += f" [{config[:6]}]"
        taken.add(name)
        launches = tuple(float(r["samples_per_s_overall"]) for r in rows if _number(r["samples_per_s_overall"]))
        predicted = [float(r["predicted_samples_per_s"]) for r in rows if _number(r["predicted_samples_per_s"])]
        if not launches or not predicted:
            continue  # nothing measured or nothing predicted: not a candidate
        fits = [r.get("predicted_fits") for r in rows]
        out.append(
            _Candidate(
                name=name,
                strategy=str(first["strategy"]),
                predicted=float(pd.Series(predicted).median()),
                fits=not any(str(f) == "False" for f in fits),  # a bool, or a CSV's text
                launches=launches,
            )
        )
    return out


def _differing(groups: dict[tuple, list], label: tuple[str, ...]) -> list[str]:
    """The key fields beyond `label` in which groups differ (threads, options, ...): a group's name says them too."""
    names = [name for name, _ in next(iter(groups), ())]
    return [name for name in names if name not in label and len({dict(key)[name] for key in groups}) > 1]


def _number(value: object) -> bool:
    """A throughput that can enter a ratio: a finite number above 0 (a missing figure is NaN or None)."""
    return isinstance(value, numbers.Real) and math.isfinite(value) and value > 0
