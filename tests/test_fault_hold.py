"""A `slower:` fault's extra time is spent busy, as slower hardware would spend it: the rank keeps its core
(ddlbench.train.faults.hold), where a sleep would give it away and pay a cold wake-up on a busy host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddlbench.train.faults import hold

SCHEDSTAT = Path("/proc/thread-self/schedstat")  # this thread's ns on a CPU, ns runnable but waiting, slices


def wanting_a_core(call) -> tuple[float, float]:
    """(wall seconds of `call`, seconds this thread spent on a core or waiting in the run queue for one). A thread
    that spins wants a core all the time, however busy the host and however low its priority (the CPU time alone
    is the host's share: a CI run of this test at nice 10 beside five busy processes got 9 % of the wall); a
    sleeping one wants none, but for its wake-up."""
    if not SCHEDSTAT.exists():
        pytest.skip(f"{SCHEDSTAT} is not there (a kernel without CONFIG_SCHED_INFO)")

    def wanted() -> float:
        on_cpu, waiting, _ = SCHEDSTAT.read_text().split()
        return (int(on_cpu) + int(waiting)) / 1e9

    wall, want = time.perf_counter(), wanted()
    call()
    return time.perf_counter() - wall, wanted() - want


def test_hold_lasts_its_time_on_the_callers_own_core():
    wall, want = wanting_a_core(lambda: hold(0.2))
    assert wall >= 0.2
    # the thread ran or waited to run through it (a twentieth left for the reads around it and the clock)
    assert want >= 0.95 * wall, (wall, want)
    # the contrast the test rests on: a sleep of 0.2 s wants a core only to wake up
    slept, want_asleep = wanting_a_core(lambda: time.sleep(0.2))
    assert want_asleep < slept / 2, (slept, want_asleep)
