"""Point figures from rank measurements: steps on one clock, window throughput, warm-up detection, cores."""

from __future__ import annotations

import math

import pytest

from ddlbench.metrics import core_sharing, first_nonfinite_step, summarize_ranks, warmup_steps_detected
from ddlbench.records import RankResult
from tests.conftest import make_point


def rank(r, spans, losses=(2.0, 1.0), rss=100, host="h", cpus=(0, 1, 2, 3), threads=1):
    """A rank's result from (start, end) pairs of its measured steps on the common clock."""
    return RankResult(
        rank=r,
        hostname=host,
        step_times_s=tuple(end - start for start, end in spans),
        step_starts_s=tuple(start for start, _ in spans),
        step_ends_s=tuple(end for _, end in spans),
        losses=tuple(losses),
        peak_rss_bytes=rss,
        cpus=tuple(cpus),
        threads=threads,
    )


def test_a_job_step_spans_the_earliest_start_to_the_latest_end():
    point = make_point(nodes=2, batch_size=10, steps=2)
    # rank 1 starts each step late: the slowest rank's own duration (0.15) understates the step (0.2)
    ranks = [
        rank(0, [(0.0, 0.1), (0.2, 0.6)], rss=100),
        rank(1, [(0.05, 0.2), (0.25, 0.5)], losses=(4.0, 3.0), rss=300),
    ]
    metrics = summarize_ranks(point, ranks)
    assert metrics.global_batch_size == 20
    assert metrics.step_times_job_s == pytest.approx((0.2, 0.4))
    assert metrics.step_time_s.median == pytest.approx(0.3)
    assert metrics.samples_per_s.median == pytest.approx((20 / 0.2 + 20 / 0.4) / 2)
    # measured over the window 0.0 → 0.6, not derived from the sum of step times
    assert metrics.window_s == pytest.approx(0.6)
    assert metrics.samples_per_s_overall == pytest.approx(40 / 0.6)
    assert metrics.peak_rss_bytes == 300
    assert (metrics.loss_first, metrics.loss_last) == (3.0, 2.0)  # mean over ranks


def test_the_window_counts_the_gaps_between_steps():
    point = make_point(batch_size=10, steps=2)
    metrics = summarize_ranks(point, [rank(0, [(0.0, 0.1), (0.5, 0.6)])])
    assert metrics.samples_per_s_overall == pytest.approx(20 / 0.6)  # not 20 / 0.2: the gap was spent too


def test_leading_slow_steps_are_detected_and_dropped():
    times = [5.0, 3.0, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0]
    assert warmup_steps_detected(times) == 2
    assert warmup_steps_detected([1.0, 1.1, 0.9, 1.0, 5.0, 1.0]) == 0  # a late outlier is not warm-up
    assert warmup_steps_detected([9.0, 9.0, 9.0, 9.0, 9.0, 1.0]) == 0  # a level series has no transient
    assert warmup_steps_detected([5.0, 1.0, 1.0]) == 0  # too few steps to judge
    point = make_point(batch_size=10, steps=10)
    spans, t = [], 0.0
    for duration in times:
        spans.append((t, t + duration))
        t += duration
    metrics = summarize_ranks(point, [rank(0, spans)])
    assert metrics.warmup_dropped_steps == 2
    assert metrics.step_time_s.n == 8 and metrics.step_time_s.max == pytest.approx(1.1)
    assert metrics.window_s == pytest.approx(sum(times[2:]))
    assert len(metrics.step_times_job_s) == 10  # the raw series is kept


def test_at_most_half_the_steps_are_dropped():
    assert warmup_steps_detected([9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]) == 4
    assert warmup_steps_detected([9.0] * 7 + [1.0] * 3) == 0  # slow is the norm here, nothing stands out


def test_ranks_sharing_cores_on_a_host_are_oversubscribed():
    alone = [rank(0, [(0, 1)], cpus=(0,)), rank(1, [(0, 1)], cpus=(1,))]
    assert core_sharing(alone) == (False, "h: 2 ranks, 2 threads on 2 CPUs")
    crowded = [rank(r, [(0, 1)], cpus=(0, 1)) for r in range(4)]
    shared, note = core_sharing(crowded)
    assert shared and note == "h: 4 ranks, 4 threads on 2 CPUs (shared)"
    threads = [rank(0, [(0, 1)], cpus=(0, 1), threads=2), rank(1, [(0, 1)], cpus=(2, 3), threads=2)]
    assert core_sharing(threads)[0] is False
    two_hosts = [rank(0, [(0, 1)], cpus=(0,), host="a"), rank(1, [(0, 1)], cpus=(0,), host="b")]
    assert core_sharing(two_hosts)[0] is False  # CPU 0 of two different hosts


def test_a_rank_with_missing_steps_is_an_error():
    point = make_point(steps=2)
    with pytest.raises(ValueError, match="expected 2 each"):
        summarize_ranks(point, [rank(0, [(0.0, 0.1)])])


def test_divergence_is_the_first_nonfinite_loss():
    assert first_nonfinite_step([2.0, 1.0]) is None
    assert first_nonfinite_step([2.0, math.nan, math.inf]) == 1


def test_inconsistent_rank_results_still_give_a_failed_verdict():
    from ddlbench.launch.processes import LaunchOutcome
    from ddlbench.launch.runner import judge

    point = make_point(nodes=2, steps=2)
    outcome = LaunchOutcome(
        returncodes=(0, 0), ranks_of_process=((0,), (1,)), timed_out=False, stopped=(False, False), wall_s=1.0
    )
    verdict = judge(point, outcome, [rank(0, [(0, 0.1), (0.1, 0.3)]), rank(1, [(0, 0.1)])], [])
    assert verdict.status == "failed"
    assert verdict.reason == "rank results are inconsistent: ranks timed [1, 2] steps, expected 2 each"
    good = judge(point, outcome, [rank(0, [(0, 0.1), (0.1, 0.2)]), rank(1, [(0, 0.1), (0.1, 0.4)])], [])
    assert good.status == "ok" and good.metrics.step_time_s.max == pytest.approx(0.3)
