"""A `slower:` fault's extra time is spent busy, as slower hardware would spend it: the rank keeps its core
(ddlbench.train.faults.hold), where a sleep would give it away and pay a cold wake-up on a busy host."""

from __future__ import annotations

import time

from ddlbench.train.faults import hold


def test_hold_lasts_its_time_on_the_callers_own_core():
    wall, cpu = time.perf_counter(), time.thread_time()
    hold(0.2)
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    assert wall >= 0.2
    # the thread ran through it: a sleep of 0.2 s costs it well under a millisecond of CPU (a tenth of the wait
    # leaves room for a host whose other work takes the core most of the time)
    assert cpu >= 0.02, (wall, cpu)
    asleep = time.thread_time()
    time.sleep(0.2)
    assert time.thread_time() - asleep < 0.01  # the contrast the test rests on
