"""A point's figures of the inside of its steps, from its ranks' per-step anatomy.

Every figure is computed per kept measured step (the steps `ddlbench.metrics` keeps after dropping those
still warming up) and summarised over those steps as records.Stats (median, 95 % CI of the median, …).
Per-rank, per-step figures are defined in ddlbench.train.recording.recorder; here, for step i:

- phase figures (seconds): the mean over ranks of that rank's figure, e.g. comm_exposed_s(i) =
  Σ_r comm_exposed_s(r, i) / R — what a typical rank spends on it;
- comm_overlap (dimensionless): Σ_r comm_hidden_s(r, i) / Σ_r comm_s(r, i), the share of the ranks'
  communication time hidden under their computation; none in steps without communication;
- update_gap_s (seconds): the mean over ranks of update_start(r, i) − update_end(r, i−1), the time between
  two consecutive weight updates of a rank (Li et al., MLHPC'19: work could hide in these gaps); the
  first kept step has none;
- stragglers: busy(r, i) = step_s(r, i) − comm_exposed_s(r, i), the time rank r did not wait on its
  peers. The slowest rank of step i is the one with the largest busy time; skew_s(i) = max_r busy −
  min_r busy; wait_s(i) = the mean over the other ranks of (max_r busy − busy(r, i)), the time each of
  them lost waiting for the slowest; wait_share(i) = wait_s(i) / the job's step time (dimensionless).
  The point's slowest rank is the one slowest in the most kept steps (ties: the lower rank).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ddlbench.records import ANATOMY_FIGURES, RankResult, Stats, Straggler
from ddlbench.statistics import percentile

# per-rank figures averaged over ranks into the point's phase figures (seconds)
PHASE_FIGURES = tuple(name for name in ANATOMY_FIGURES if name not in ("step_s", "busy_s", "comm_ops", "comm_bytes"))


def anatomy_figures(ranks: list[RankResult], dropped: int, job_step_times: list[float]) -> dict[str, Any]:
    """The point's inside figures over its kept steps (from `dropped` on) that every rank stamped (all of
    them on the CPU, the traced ones on CUDA: RankResult.anatomy_steps), as records.Metrics fields; all None
    when no kept step was stamped on every rank (records from before the recorder)."""
    steps = len(job_step_times)
    positions = [_positions(rank, steps) for rank in ranks]
    kept = [i for i in range(dropped, steps) if positions and all(i in where for where in positions)]
    if not kept:
        return {"phases_s": None, "comm_overlap": None, "update_gap_s": None, "straggler": None}
    count = len(ranks)

    def per_rank(name: str, i: int) -> list[float]:
        return [rank.anatomy[name][where[i]] for rank, where in zip(ranks, positions, strict=True)]

    phases = {name: Stats.of([math.fsum(per_rank(name, i)) / count for i in kept]) for name in PHASE_FIGURES}
    overlap = []
    for i in kept:
        comm = math.fsum(per_rank("comm_s", i))
        if comm > 0:
            overlap.append(math.fsum(per_rank("comm_hidden_s", i)) / comm)
    return {
        "phases_s": phases,
        "comm_overlap": Stats.of(overlap) if overlap else None,
        "update_gap_s": _update_gaps(ranks, positions, kept),
        "straggler": _straggler(ranks, positions, kept, job_step_times),
    }


def _positions(rank: RankResult, steps: int) -> dict[int, int]:
    """Measured step -> its place in the rank's anatomy; {} when the anatomy does not match its steps."""
    stamped = rank.anatomy_steps or tuple(range(steps))
    if len(rank.anatomy.get("busy_s", ())) != len(stamped) or (not rank.anatomy_steps and len(stamped) != steps):
        return {}
    return {step: place for place, step in enumerate(stamped)}


def _update_gaps(ranks: list[RankResult], positions: list[dict[int, int]], kept: list[int]) -> Stats | None:
    gaps = []
    for i in kept:
        if i - 1 not in kept:
            continue
        per_rank = []
        for rank, where in zip(ranks, positions, strict=True):
            now, before = where[i], where[i - 1]
            if len(rank.update_starts_s) > now and len(rank.update_ends_s) > before:
                start, end = rank.update_starts_s[now], rank.update_ends_s[before]
                if start is not None and end is not None:
                    per_rank.append(start - end)
        if per_rank:
            gaps.append(math.fsum(per_rank) / len(per_rank))
    return Stats.of(gaps) if gaps else None


def _straggler(
    ranks: list[RankResult], positions: list[dict[int, int]], kept: list[int], job_step_times: list[float]
) -> Straggler | None:
    if len(ranks) < 2 or not len(kept):
        return None
    slowest, skews, waits, shares = [], [], [], []
    for i in kept:
        busy = {rank.rank: rank.anatomy["busy_s"][where[i]] for rank, where in zip(ranks, positions, strict=True)}
        top = max(busy.values())
        who = min(r for r, b in busy.items() if b == top)
        slowest.append(who)
        skews.append(top - min(busy.values()))
        lost = math.fsum(top - b for r, b in busy.items() if r != who) / (len(busy) - 1)
        waits.append(lost)
        shares.append(lost / job_step_times[i] if job_step_times[i] > 0 else 0.0)
    counts = Counter(slowest)
    rank = min(counts, key=lambda r: (-counts[r], r))
    return Straggler(
        rank=rank,
        hostname=next(result.hostname for result in ranks if result.rank == rank),
        slowest_steps=counts[rank],
        steps=len(kept),
        skew_s=Stats.of(skews),
        wait_s=Stats.of(waits),
        wait_share=Stats.of(shares),
    )


def kept_values(rank: RankResult, name: str, dropped: int) -> list[float]:
    """The rank's figure `name` in its stamped steps from measured step `dropped` on."""
    values = rank.anatomy.get(name, ())
    if not rank.anatomy_steps:
        return list(values[dropped:])
    return [value for step, value in zip(rank.anatomy_steps, values, strict=False) if step >= dropped]


def rank_medians(rank: RankResult, dropped: int) -> dict[str, Any]:
    """One rank's median of each figure over the kept steps it stamped (for the report's per-rank table)."""
    out: dict[str, Any] = {"rank": rank.rank, "hostname": rank.hostname}
    for name in rank.anatomy:
        values = kept_values(rank, name, dropped)
        if values:
            out[name] = percentile(sorted(values), 50)
    return out


# point-level Stats figures in the sweep table, with every Stats field (records.Stats)
TABLE_STATS = ("comm_overlap", "update_gap_s", "straggler_wait_s", "straggler_wait_share", "straggler_skew_s")
PHASE_STATS_FIELDS = ("median", "ci_low", "ci_high")  # per phase figure; n is that of step_time_s


def anatomy_columns(metrics: Any, stats_fields: tuple[str, ...]) -> dict[str, Any]:
    """A record's inside figures as sweep-table columns: phase_<figure>_{median,ci_low,ci_high} (s), the
    Stats of comm_overlap, update_gap_s and the straggler's wait_s, wait_share and skew_s, and the
    straggler's rank, host and the kept steps in which it was slowest."""
    columns: dict[str, Any] = {}
    if metrics.phases_s:
        for name, stats in metrics.phases_s.items():
            columns |= {f"phase_{name}_{field}": getattr(stats, field) for field in PHASE_STATS_FIELDS}
    straggler = metrics.straggler
    figures = {
        "comm_overlap": metrics.comm_overlap,
        "update_gap_s": metrics.update_gap_s,
        "straggler_wait_s": straggler.wait_s if straggler else None,
        "straggler_wait_share": straggler.wait_share if straggler else None,
        "straggler_skew_s": straggler.skew_s if straggler else None,
    }
    for figure, stats in figures.items():
        if stats is not None:
            columns |= {f"{figure}_{field}": getattr(stats, field) for field in stats_fields}
    if straggler is not None:
        columns |= {
            "straggler_rank": straggler.rank,
            "straggler_host": straggler.hostname,
            "straggler_slowest_steps": straggler.slowest_steps,
            "straggler_steps": straggler.steps,
        }
    return columns
