"""Point-level figures from per-rank measurements; each formula is written here once, with its unit."""

from __future__ import annotations

import math

from ddlbench.point import Point
from ddlbench.records import Metrics, RankResult, Stats


def summarize_ranks(point: Point, ranks: list[RankResult]) -> Metrics:
    """Merge the ranks of one point into its Metrics.

    A synchronous step ends when its slowest rank ends, so the job's time for step i is
    max over ranks of rank_time[i] (seconds). Throughput counts every sample the job consumed in that
    step: global_batch_size / step_time (samples/s). DDLBench printed per-rank throughput; summing
    ranks is what this does, through the global batch.
    """
    if not ranks:
        raise ValueError("no rank results to summarize")
    counts = {len(rank.step_times_s) for rank in ranks}
    if counts != {point.steps}:
        raise ValueError(f"ranks timed {sorted(counts)} steps, expected {point.steps} each")
    step_times = [max(rank.step_times_s[i] for rank in ranks) for i in range(point.steps)]
    global_batch = point.global_batch_size
    losses = mean_loss_per_step(ranks)
    return Metrics(
        step_time_s=Stats.of(step_times),
        samples_per_s=Stats.of([global_batch / t for t in step_times]),
        samples_per_s_overall=global_batch * point.steps / math.fsum(step_times),
        global_batch_size=global_batch,
        peak_rss_bytes=max(rank.peak_rss_bytes for rank in ranks),
        cuda_peak_allocated_bytes=_max_or_none(rank.cuda_peak_allocated_bytes for rank in ranks),
        cuda_peak_reserved_bytes=_max_or_none(rank.cuda_peak_reserved_bytes for rank in ranks),
        loss_first=losses[0],
        loss_last=losses[-1],
        tensor_peak_bytes=_max_or_none(rank.tensor_peak_bytes for rank in ranks),
    )


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
