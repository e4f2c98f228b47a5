"""Point-level figures from per-rank measurements; each formula is written here once, with its unit."""

from __future__ import annotations

import math

from ddlbench.analysis.energy import energy_figures
from ddlbench.analysis.inside.figures import anatomy_figures
from ddlbench.analysis.machine.host_speed import point_probe
from ddlbench.point import Point
from ddlbench.records import Metrics, RankResult, Stats
from ddlbench.statistics import percentile


def summarize_ranks(point: Point, ranks: list[RankResult]) -> Metrics:
    """Merge the ranks of one point into its Metrics.

    Every rank stamps the start and end of each measured step on one clock (rank 0's; see
    ddlbench.train.clock), so the job's step i lasts from the earliest start to the latest end over
    ranks (seconds). Leading steps still warming up are detected on that series (`warmup_steps_detected`)
    and left out. Per kept step, throughput is global_batch_size / step time (samples/s, the whole
    job's, not one rank's). Over the kept window, samples_per_s_overall = global_batch_size × kept
    steps / (latest end of the last kept step − earliest start of the first): measured, not derived
    from a sum of per-step times (Hoefler & Belli's rule 3: rates are total work over total time).
    Energy over the measured window (energy_j, samples_per_j …) is defined in ddlbench.analysis.energy.
    """
    if not ranks:
        raise ValueError("no rank results to summarize")
    counts = {len(rank.step_times_s) for rank in ranks}
    if counts != {point.steps}:
        raise ValueError(f"ranks timed {sorted(counts)} steps, expected {point.steps} each")
    if any(len(rank.step_starts_s) != point.steps or len(rank.step_ends_s) != point.steps for rank in ranks):
        raise ValueError("a rank did not stamp the start and end of every measured step")
    starts = [min(rank.step_starts_s[i] for rank in ranks) for i in range(point.steps)]
    ends = [max(rank.step_ends_s[i] for rank in ranks) for i in range(point.steps)]
    step_times = [end - begin for begin, end in zip(starts, ends, strict=True)]
    dropped = warmup_steps_detected(step_times)
    kept = step_times[dropped:]
    window = ends[-1] - starts[dropped]
    global_batch = point.global_batch_size
    losses = mean_loss_per_step(ranks)
    oversubscribed, cores_note = core_sharing(ranks)
    return Metrics(
        step_time_s=Stats.of(kept),
        samples_per_s=Stats.of([global_batch / t for t in kept]),
        samples_per_s_overall=global_batch * len(kept) / window,
        window_s=window,
        step_times_job_s=tuple(step_times),
        warmup_dropped_steps=dropped,
        global_batch_size=global_batch,
        peak_rss_bytes=max(rank.peak_rss_bytes for rank in ranks),
        cuda_peak_allocated_bytes=_max_or_none(rank.cuda_peak_allocated_bytes for rank in ranks),
        cuda_peak_reserved_bytes=_max_or_none(rank.cuda_peak_reserved_bytes for rank in ranks),
        loss_first=losses[0],
        loss_last=losses[-1],
        tensor_peak_bytes=_max_or_none(rank.tensor_peak_bytes for rank in ranks),
        tensor_resident_bytes=_max_or_none(rank.tensor_resident_bytes for rank in ranks),
        input_pool_bytes=_max_or_none(rank.input_pool_bytes for rank in ranks),
        clock_uncertainty_s=max(rank.clock_uncertainty_s for rank in ranks),
        oversubscribed=oversubscribed,
        cores_note=cores_note,
        host_probe=point_probe(ranks),
        **input_wait_figures(ranks, step_times, dropped, point.steps),
        **anatomy_figures(ranks, dropped, step_times),
        **energy_figures(point, ranks),
    )


def input_wait_figures(
    ranks: list[RankResult], step_times: list[float], dropped: int, steps: int
) -> dict[str, Stats | None]:
    """Per kept step of a point that read through a loader: input_wait_s = the longest wait on input of
    any rank (s; a collective step cannot start before its slowest rank has its batch), and
    input_wait_share = that wait ÷ the job's step time (dimensionless, the share of the step stalled on
    input). None for points whose input was resident."""
    if not any(rank.input_source == "loader" for rank in ranks):
        return {"input_wait_s": None, "input_wait_share": None}
    if any(len(rank.input_wait_s) != steps for rank in ranks):
        raise ValueError("a rank reading through a loader did not time its wait on input at every measured step")
    waits = [max(rank.input_wait_s[i] for rank in ranks) for i in range(dropped, steps)]
    return {
        "input_wait_s": Stats.of(waits),
        "input_wait_share": Stats.of([wait / step for wait, step in zip(waits, step_times[dropped:], strict=True)]),
    }


# at most this share of the measured steps may be judged still warming up
MAX_WARMUP_SHARE = 0.5


def warmup_steps_detected(step_times: list[float]) -> int:
    """How many leading steps are still warming up: the leading run of steps above the upper Tukey
    fence, Q3 + 1.5·IQR, of the series' second half, taken as the steady state (Hoefler & Belli's
    outlier rule, applied only at the start, where a transient — caches, allocator growth, lazy
    initialisation — makes steps slow). At most MAX_WARMUP_SHARE of the steps; none with fewer than 4
    steps, where quartiles mean little."""
    if len(step_times) < 4:
        return 0
    steady = sorted(step_times[len(step_times) // 2 :])
    q1, q3 = percentile(steady, 25), percentile(steady, 75)
    fence = q3 + 1.5 * (q3 - q1)
    limit = int(len(step_times) * MAX_WARMUP_SHARE)
    dropped = 0
    while dropped < limit and step_times[dropped] > fence:
        dropped += 1
    return dropped


def core_sharing(ranks: list[RankResult]) -> tuple[bool, str]:
    """Whether some host ran more threads than the CPUs its ranks could use, and the count per host.

    Per host (by hostname): Σ threads of its ranks, and their loaders' worker processes, against the size
    of the union of their CPU affinities. More than CPUs means ranks time-share cores, and the figures
    measure contention.
    """
    hosts: dict[str, list[RankResult]] = {}
    for rank in ranks:
        hosts.setdefault(rank.hostname, []).append(rank)
    oversubscribed, notes = False, []
    for host, members in sorted(hosts.items()):
        cpus = set().union(*(set(rank.cpus) for rank in members))
        if not cpus:
            continue
        threads = sum(rank.threads for rank in members)
        workers = sum(rank.loader_workers for rank in members)
        shared = threads + workers > len(cpus)
        oversubscribed |= shared
        busy = f"{threads} threads + {workers} loader workers" if workers else f"{threads} threads"
        notes.append(f"{host}: {len(members)} ranks, {busy} on {len(cpus)} CPUs{' (shared)' if shared else ''}")
    return oversubscribed, "; ".join(notes)


def mean_loss_per_step(ranks: list[RankResult]) -> list[float]:
    """Mean over the ranks that compute a loss; with equal local batches this is the global-batch loss."""
    reporting = [rank.losses for rank in ranks if rank.losses]
    if not reporting:
        raise ValueError("no rank reported a loss")
    return [math.fsum(step) / len(step) for step in zip(*reporting, strict=True)]


def first_nonfinite_step(losses: list[float]) -> int | None:
    """Index of the first step whose loss is NaN or infinite: the run diverged there."""
    return next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)


def _max_or_none(values) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
