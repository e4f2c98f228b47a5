"""Noticing that submitit jobs ended from their result files, at a filesystem cost that does not grow
faster than the sweep: QueueWatch's sleep (ddlbench.launch.waves) for `ddlbench submit`'s wait.

Each job still running is looked at (one stat of its result file) at most once every `every_s`, the
looks spread evenly round the jobs: with N jobs unfinished, N ÷ `every_s` stats a second, so at most
one stat per point per minute at the default, for any N (but `least_per_s`, 1 a second, in all for a
sweep of fewer than 60 jobs, which would otherwise wait a minute to notice an end). A job's end is then
noticed within `every_s` of its result file, and never sooner than `least_s` after the last squeue call.
Torch-free.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class ResultNap:
    """QueueWatch's sleep: the pause, cut short once a job has written its result file (no scheduler
    call), though never under `least_s`. squeue is then asked soon after a job ends even when the
    interval has grown long, and never more often than every `least_s` however many jobs end.

    Looks are budgeted (the module docstring): every `check_s` it looks at as many of the unfinished
    jobs, round robin, as (seconds since the last look) × max(N ÷ `every_s`, `least_per_s`) allows (a
    sweep under 60 jobs is looked at `least_per_s` times a second in all); the unspent fraction carries
    over to the next nap. `exists`, `clock` and `sleep` replace Path.exists, time.monotonic and
    time.sleep (tests, benchmarks/scheduler_load.py); `stats` counts the looks made."""

    def __init__(
        self,
        jobs: Callable[[], Iterable[Any]],
        *,
        least_s: float = 10.0,
        check_s: float = 1.0,
        every_s: float = 60.0,
        least_per_s: float = 1.0,
        exists: Callable[[Path], bool] = Path.exists,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not (least_s >= 0 and check_s > 0 and every_s > 0):
            raise ValueError(f"least {least_s} s, check {check_s} s, every {every_s} s: need >= 0, > 0, > 0")
        self.jobs, self.least_s, self.check_s, self.every_s = jobs, least_s, check_s, every_s
        self.least_per_s = least_per_s
        self._exists, self._clock, self._sleep = exists, clock, sleep
        self.finished: set[str] = set()
        self.stats = 0
        self._turn: deque[str] = deque()  # unfinished job ids, the next to look at first
        self._known: set[str] = set()
        self._credit = 0.0  # looks earned and not yet made

    def _unfinished(self) -> dict[str, Any]:
        jobs = {job.job_id: job for job in list(self.jobs()) if job.job_id not in self.finished}
        for job_id in jobs:  # new jobs join the end of the round
            if job_id not in self._known:
                self._known.add(job_id)
                self._turn.append(job_id)
        return jobs

    def _new_result(self, elapsed_s: float) -> bool:
        jobs = self._unfinished()
        rate = max(len(jobs) / self.every_s, self.least_per_s)
        self._credit = min(self._credit + elapsed_s * rate, float(len(jobs)))
        found = False
        while self._credit >= 1 and self._turn:
            job_id = self._turn.popleft()
            job = jobs.get(job_id)
            if job is None:  # finished (or no longer asked about): out of the round
                self._known.discard(job_id)
                continue
            self._credit -= 1
            self.stats += 1
            if self._exists(job.paths.result_pickle):
                self.finished.add(job_id)
                self._known.discard(job_id)
                found = True
            else:
                self._turn.append(job_id)
        return found

    def __call__(self, seconds: float) -> None:
        began = self._clock()
        self._sleep(min(seconds, self.least_s))
        last = self._clock()
        while (left := seconds - (self._clock() - began)) > 0:
            self._sleep(min(left, self.check_s))
            now = self._clock()
            if self._new_result(now - last):
                left = seconds - (now - began)
                if left > 0:
                    self._sleep(min(left, 2 * self.check_s))  # SLURM ends the job just after its result is written
                return
            last = now
