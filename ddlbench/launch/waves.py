"""Putting a sweep's job arrays into the queue under the user's limits, and following them, with one
squeue call per poll for all of the sweep's jobs.

An array goes in as large as the room allows (MaxArraySize, and the submit limits less the user's jobs
already queued); the rest follows as earlier jobs end. A refusal by sbatch for a limit (another job of
the user took the room, or a group limit counts other users' jobs) is not a point's failure: it is
tried again after a pause. Torch-free; the submitting itself is a callable, so that this is tested
without SLURM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TypeVar

from ddlbench.errors import DdlbenchError
from ddlbench.launch.limits import UserLimits
from ddlbench.launch.slurm import QueuedJob, query_queue

log = logging.getLogger(__name__)

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")

# refusals in a row, with none of the user's jobs queued, after which a refusal is taken for good, once
# the pauses between them add up to EMPTY_QUEUE_PATIENCE_S: a controller under load may still count jobs
# that squeue already lists as ended (seen on the test cluster: five refusals over 18 s with none queued)
REFUSALS_WITH_EMPTY_QUEUE = 5
EMPTY_QUEUE_PATIENCE_S = 120.0


class LimitRefusal(Exception):
    """sbatch refused a submission for a limit on queued jobs (ddlbench.launch.limits.is_limit_refusal);
    `submitted`: the job ids of the group's first items that did go in before the refusal, in order."""

    def __init__(self, message: str, *, submitted: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.submitted = list(submitted)


class QueueWatch:
    """The user's jobs in the queue, read with one squeue call per poll.

    `pause` sleeps the current interval: `poll_s` after a poll that saw the watched jobs change (one
    ended, or a new one came in), else the last interval × `growth`, up to `max_poll_s`. A job that
    starts changes nothing that is waited for. A sweep whose jobs run for an hour is then asked about
    every 2 minutes, and one whose jobs end every few seconds every `poll_s`: 6 calls a minute, for any
    number of jobs (0.03 calls per point per minute for 200 points)."""

    def __init__(
        self,
        *,
        poll_s: float = 10.0,
        max_poll_s: float = 120.0,
        growth: float = 1.5,
        query: Callable[[], list[QueuedJob]] = query_queue,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not 0 < poll_s <= max_poll_s or growth < 1:
            raise ValueError(f"poll {poll_s} s up to {max_poll_s} s by ×{growth}: need 0 < poll <= max, growth >= 1")
        self.poll_s, self.max_poll_s, self.growth = poll_s, max_poll_s, growth
        self.interval = poll_s
        self.calls = 0
        self._query, self._sleep = query, sleep
        self._seen: set[str] | None = None

    def poll(self, watched: Collection[str] = ()) -> list[QueuedJob]:
        queue = self._query()
        self.calls += 1
        active = {job.job_id for job in queue if job.active and job.job_id in watched}
        if self._seen is None or active != self._seen:
            self.interval = self.poll_s
        else:
            self.interval = min(self.interval * self.growth, self.max_poll_s)
        self._seen = active
        return queue

    def pause(self) -> None:
        self._sleep(self.interval)


def submit_in_waves(
    groups: Sequence[tuple[Key, Sequence[Item]]],
    submit: Callable[[Key, list[Item]], list[str]],
    *,
    limits: Callable[[Key], UserLimits | None],
    watch: QueueWatch,
) -> dict[str, Item]:
    """Submit every group's items, each call of `submit` one array of one group, as the limits allow;
    returns job id → item. `submit` returns the job ids of the items it was given, in order, and raises
    LimitRefusal when sbatch refuses for a limit; anything else it raises ends the submission."""
    submitted: dict[str, Item] = {}
    queue: list[QueuedJob] | None = None
    refusals, refused_for_s = 0, 0.0
    # after a refusal the limits read overstate the room (a group limit counts other users' jobs):
    # the next array is half the refused one, and each one that goes in doubles it again
    ceiling: int | None = None
    for key, members in groups:
        limit = limits(key)
        cap = limit.max_array_size if limit and limit.max_array_size else len(members)
        waiting = list(members)
        while waiting:
            if limit and limit.submit and queue is None:
                queue = watch.poll(submitted)
            room = limit.room(queue or []) if limit else None
            take = min(len(waiting), cap, len(waiting) if room is None else room, ceiling or len(waiting))
            if take == 0:
                tightest = limit.tightest(queue or []) if limit else None
                log.info(
                    "%d point(s) wait for room in the queue (%s, %d of your jobs counted); next look in %.0f s",
                    len(waiting),
                    tightest.name + f"={tightest.value}" if tightest else "a limit",
                    tightest.used(queue or []) if tightest else 0,
                    watch.interval,
                )
                watch.pause()
                queue = watch.poll(submitted)
                continue
            refusal = None
            try:
                job_ids = submit(key, waiting[:take])
            except LimitRefusal as refused:
                refusal, job_ids = refused, refused.submitted  # those that went in before it stay submitted
            submitted.update(zip(job_ids, waiting[: len(job_ids)], strict=True))
            if limit is not None:  # counted at once as queued, without asking squeue again
                account, qos = limit.account or "", limit.qos or ""
                queue = (queue or []) + [
                    QueuedJob(job_id=job_id, state="PENDING", name="", comment="", account=account, qos=qos)
                    for job_id in job_ids
                ]
            waiting = waiting[len(job_ids) :]
            if refusal is not None:
                ceiling = max(1, take // 2)
                refused_for_s += watch.interval
                queue = _after_refusal(refusal, watch, submitted, refusals := refusals + 1, refused_for_s)
                continue
            refusals, refused_for_s = 0, 0.0
            ceiling = ceiling * 2 if ceiling else None
    return submitted


def _after_refusal(
    refusal: LimitRefusal, watch: QueueWatch, submitted: Collection[str], refusals: int, refused_for_s: float
) -> list[QueuedJob]:
    """Pause after sbatch refused for a limit; the queue as it then is. With none of the user's jobs
    queued nothing of theirs can end to make room: after a few such refusals, `refused_for_s` seconds of
    pauses in all (this one's included), it is an error."""
    log.warning("sbatch refused for a limit (%s); trying again in %.0f s", str(refusal).strip(), watch.interval)
    watch.pause()
    queue = watch.poll(submitted)
    patience_spent = refusals >= REFUSALS_WITH_EMPTY_QUEUE and refused_for_s >= EMPTY_QUEUE_PATIENCE_S
    if patience_spent and not any(job.active for job in queue):
        raise DdlbenchError(
            f"sbatch refused {refusals} times in a row over {refused_for_s:.0f} s for a limit although none of "
            f"your jobs is queued: "
            f"{str(refusal).strip()}; ask `sacctmgr show assoc user=$USER` and `sacctmgr show qos` what it is"
        )
    return queue


def wait_for_jobs(
    job_ids: Collection[str], *, watch: QueueWatch, on_poll: Callable[[list[QueuedJob]], None] | None = None
) -> None:
    """Return once none of `job_ids` is queued or running (squeue lists it as ended, or no more).
    `on_poll` gets the queue of every poll (ddlbench.launch.progress reports from it: no squeue call of its own)."""
    job_ids = set(job_ids)
    while True:
        queue = watch.poll(job_ids)
        if on_poll is not None:
            on_poll(queue)
        left = sum(1 for job in queue if job.job_id in job_ids and job.active)
        if not left:
            return
        log.debug("%d job(s) queued or running; next look in %.0f s", left, watch.interval)
        watch.pause()
