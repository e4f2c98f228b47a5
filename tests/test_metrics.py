"""Point figures from rank measurements: the slowest rank sets the step time; throughput is global."""

from __future__ import annotations

import math

import pytest

from ddlbench.metrics import first_nonfinite_step, summarize_ranks
from ddlbench.records import RankResult
from tests.conftest import make_point


def rank(r, times, losses=(2.0, 1.0), rss=100):
    return RankResult(rank=r, hostname="h", step_times_s=tuple(times), losses=tuple(losses), peak_rss_bytes=rss)


def test_step_time_is_the_slowest_rank_and_throughput_counts_all_ranks():
    point = make_point(nodes=2, batch_size=10, warmup_steps=0, steps=2)
    metrics = summarize_ranks(point, [rank(0, [0.1, 0.4], rss=100), rank(1, [0.2, 0.3], losses=(4.0, 3.0), rss=300)])
    assert metrics.global_batch_size == 20
    assert metrics.step_time_s.median == pytest.approx(0.3)  # steps take max(0.1, 0.2)=0.2 and max(0.4, 0.3)=0.4
    assert metrics.samples_per_s.median == pytest.approx((20 / 0.2 + 20 / 0.4) / 2)
    assert metrics.samples_per_s_overall == pytest.approx(40 / 0.6)
    assert metrics.peak_rss_bytes == 300
    assert (metrics.loss_first, metrics.loss_last) == (3.0, 2.0)  # mean over ranks


def test_a_rank_with_missing_steps_is_an_error():
    point = make_point(steps=2)
    with pytest.raises(ValueError, match="expected 2 each"):
        summarize_ranks(point, [rank(0, [0.1])])


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
    verdict = judge(point, outcome, [rank(0, [0.1, 0.2]), rank(1, [0.1])], [])
    assert verdict.status == "failed"
    assert verdict.reason == "rank results are inconsistent: ranks timed [1, 2] steps, expected 2 each"
    good = judge(point, outcome, [rank(0, [0.1, 0.2]), rank(1, [0.1, 0.3])], [])
    assert good.status == "ok" and good.metrics.step_time_s.max == 0.3
