"""Steps on one clock: offsets to rank 0 with an error bound, and job steps spanning every rank."""

from __future__ import annotations

import time

import pytest

from ddlbench.launch.runner import run_point
from ddlbench.train.clock import StepTimer
from tests.conftest import make_point


def test_the_host_timer_marks_each_step_in_order():
    import torch

    timer = StepTimer(torch.device("cpu"))
    timer.open_window()
    for _ in range(3):
        timer.start()
        time.sleep(0.002)
        timer.end()
    starts, ends = timer.close_window()
    assert timer.name == "perf_counter"
    assert all(end - start >= 0.002 for start, end in zip(starts, ends, strict=True))
    assert all(ends[i] <= starts[i + 1] for i in range(2))


@pytest.mark.slow
def test_ranks_on_one_host_agree_on_the_clock_and_job_steps_span_them(tmp_path):
    point = make_point(nodes=2, ranks_per_node=1, warmup_steps=2, steps=6, oversubscribe=True)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    zero, one = record.ranks
    assert zero.clock_offset_s == 0.0 and zero.clock_uncertainty_s == 0.0
    # one host, one CLOCK_MONOTONIC: the true offset is 0, so Cristian's estimate must lie within its bound
    assert one.clock_uncertainty_s > 0
    assert abs(one.clock_offset_s) <= one.clock_uncertainty_s + 1e-6
    assert record.metrics.clock_uncertainty_s == one.clock_uncertainty_s
    for i, job_step in enumerate(record.metrics.step_times_job_s):
        assert job_step == pytest.approx(
            max(r.step_ends_s[i] for r in record.ranks) - min(r.step_starts_s[i] for r in record.ranks)
        )
        assert job_step >= max(r.step_times_s[i] for r in record.ranks) - 1e-9
    # the window runs from the first kept step's earliest start to the last step's latest end (job steps
    # may overlap a little: a fast rank starts step i+1 before a slow one has finished step i)
    first = record.metrics.warmup_dropped_steps
    window = max(r.step_ends_s[-1] for r in record.ranks) - min(r.step_starts_s[first] for r in record.ranks)
    assert record.metrics.window_s == pytest.approx(window)
    assert len(zero.warmup_times_s) == 2 and zero.timer == "perf_counter"
    assert zero.memory_probe.startswith("cpu allocator events")
