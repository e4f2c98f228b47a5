"""Progress on long work: how many points ended ok, failed, run and wait, and an estimate of the time left.

One Progress reports for `ddlbench submit`, `rerun`, `certify`, `calibrate`, the adaptive sweep and
`ddlbench status --watch`: on a terminal one line redrawn in place (a count changed, else at most every
`redraw_s`); elsewhere (a batch job's log, CI) a plain line when the counts change and otherwise every
`every_s`, so logs stay short.

The states come from where the work is: the queue and the records (sweep_states, the squeue call of the
wait's own poll), or files alone (ddlbench.launch.disk_status: a Snakemake subprocess, or a loop here),
with queued_states laid over them where sweep_status cannot read the records (a calibration suite's).

Time left, with its basis in its text:
- `predicted`, where every point not yet ended has a predicted duration d, seconds (a machine file:
  ddlbench.launch.packed.expected_times): (Σ d of the points waiting + Σ max(0, d − elapsed) of those
  running) ÷ max(1, points running now), and at least the longest running point's rest; elapsed counts
  from the first update that saw the point running;
- else `from N points ended`: points left ÷ (N ÷ seconds since the first update), N the points that
  ended since then (those already ended at the first update do not count), once N ≥ 2;
- else unknown.
Torch-free: predicted_durations reads the model tables shipped with the package or kept in the sweep's folder
(ddlbench.analysis.analytic.table_cache), as `ddlbench plan --pack` does.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from ddlbench.launch.patience import listen
from ddlbench.launch.slurm import PENDING_STATES, RUNNING_STATES, QueuedJob
from ddlbench.launch.status import STATES, PointStatus, StatusReader, points_of_job

log = logging.getLogger(__name__)

States = Iterable[PointStatus] | Mapping[str, str]  # PointStatus objects, or point id → state
WAITING = frozenset({"pending", "not started", "missing"})  # `missing`: ddlbench rerun's word for no record
CLEAR_TO_END = "\x1b[K"


def states_of(statuses: States) -> dict[str, str]:
    """point id → state."""
    if isinstance(statuses, Mapping):
        return dict(statuses)
    return {status.point_id: status.state for status in statuses}


def has_ended(state: str) -> bool:
    """ok, or any other status a record gives (failed, oom, timeout, unreadable, ...)."""
    return state != "running" and state not in WAITING


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Points by state: `failed` holds every ended point whose status is not ok, by status."""

    ok: int = 0
    failed: tuple[tuple[str, int], ...] = ()  # (status, points), in ddlbench.launch.status.STATES order
    running: int = 0
    pending: int = 0  # in the queue, not started yet
    not_started: int = 0  # neither queued nor recorded

    @classmethod
    def of(cls, statuses: States, *, total: int | None = None) -> Counts:
        """The counts of `statuses`; points up to `total` that they do not name are not started."""
        counts = Counter(states_of(statuses).values())
        unnamed = max(0, (total or 0) - sum(counts.values()))
        order = {state: index for index, state in enumerate(STATES)}
        causes = sorted((s for s in counts if has_ended(s) and s != "ok"), key=lambda s: (order.get(s, len(order)), s))
        return cls(
            ok=counts["ok"],
            failed=tuple((cause, counts[cause]) for cause in causes),
            running=counts["running"],
            pending=counts["pending"],
            not_started=counts["not started"] + counts["missing"] + unnamed,
        )

    @property
    def failed_total(self) -> int:
        return sum(count for _, count in self.failed)

    @property
    def ended(self) -> int:
        return self.ok + self.failed_total

    @property
    def left(self) -> int:
        """Points not ended: running, pending or not started."""
        return self.running + self.pending + self.not_started

    @property
    def total(self) -> int:
        return self.ended + self.left

    def text(self) -> str:
        """`12 points: 8 ok, 1 failed, 1 oom, 1 running, 1 pending`: STATES' words and order, zeros left out
        (as `ddlbench status` says it)."""
        parts = [(self.ok, "ok"), *((count, cause) for cause, count in self.failed)]
        parts += [(self.running, "running"), (self.pending, "pending"), (self.not_started, "not started")]
        return f"{self.total} point{'' if self.total == 1 else 's'}: " + ", ".join(
            f"{count} {word}" for count, word in parts if count
        )


@dataclass(frozen=True, kw_only=True)
class Estimate:
    seconds: float | None  # time left; None: unknown
    basis: str  # "predicted", "from 6 points ended", or why it is unknown

    def text(self) -> str:
        if self.seconds is None:
            return f"time left unknown ({self.basis})"
        return f"{format_duration(self.seconds)} left ({self.basis})"


def format_duration(seconds: float) -> str:
    """`~45 s`, `~4 min`, `~2.5 h`, `~3.0 days`: rounded, since it is an estimate."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"~{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"~{seconds / 3600:.1f} h"
    return f"~{seconds / 86400:.1f} days"


class Timeline:
    """What successive updates saw, for the estimate (the module docstring): since when each point runs,
    and which points ended after the first update."""

    def __init__(self, predicted_s: Mapping[str, float] | None = None):
        self.predicted_s = dict(predicted_s or {})
        self.first_s: float | None = None
        self.running_since: dict[str, float] = {}
        self.ended: set[str] = set()  # ended since the first update
        self._ended_before: set[str] = set()  # ended at the first update, and not run since

    def observe(self, states: Mapping[str, str], now: float) -> None:
        if self.first_s is None:
            self.first_s = now
            self._ended_before = {point for point, state in states.items() if has_ended(state)}
        for point, state in states.items():
            if state == "running":
                self.running_since.setdefault(point, now)
            else:
                self.running_since.pop(point, None)  # ended, or back in the queue (requeued)
            if not has_ended(state):
                self.ended.discard(point)
                self._ended_before.discard(point)
            elif point not in self._ended_before:
                self.ended.add(point)

    def estimate(self, states: Mapping[str, str], counts: Counts, now: float) -> Estimate:
        left = [point for point, state in states.items() if not has_ended(state)]
        if left and len(left) == counts.left and all(point in self.predicted_s for point in left):
            rest = {
                point: max(0.0, self.predicted_s[point] - (now - self.running_since.get(point, now))) for point in left
            }
            running = [point for point in left if states[point] == "running"]
            seconds = sum(rest.values()) / max(1, len(running))
            return Estimate(seconds=max(seconds, *(rest[p] for p in running), 0.0), basis="predicted")
        ended = len(self.ended)
        elapsed = now - (self.first_s if self.first_s is not None else now)
        if ended >= 2 and elapsed > 0:
            return Estimate(seconds=counts.left * elapsed / ended, basis=f"from {ended} points ended")
        predictions = "some points not predicted" if self.predicted_s else "no predictions"
        return Estimate(seconds=None, basis=f"{ended} point(s) ended so far, 2 needed; {predictions}")


class Progress:
    """One progress line for long work: `<title>: <counts>; <time left>`.

    On a terminal the line is redrawn in place (carriage return, clear to its end): when a count changed,
    else at most every `redraw_s`; when nothing is left it ends with a newline. Elsewhere a plain line is
    written when the counts change, else every `every_s`. `isatty`, `clock` and `width` replace the
    stream's, time.monotonic and the terminal's, for tests. Safe to update from a watcher thread."""

    def __init__(
        self,
        *,
        title: str,
        total: int | None = None,
        predicted_s: Mapping[str, float] | None = None,
        stream: TextIO | None = None,
        isatty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        redraw_s: float = 0.25,
        every_s: float = 300.0,
        width: int | None = None,
    ):
        self.title, self.total = title, total
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty() if isatty is None else isatty
        self.clock, self.redraw_s, self.every_s, self.width = clock, redraw_s, every_s, width
        self.timeline = Timeline(predicted_s)
        self.counts: Counts | None = None  # of the last update
        self.line = ""  # of the last update
        self._base = ""  # the last update's line, without the controller's silence
        self._lock = threading.RLock()  # the controller listener may be told from inside an update
        self._shown: tuple[Counts, str, float] | None = None  # counts, line, when: what was last written
        self._open = False  # a terminal line written without its newline
        # since when the SLURM controller has not answered a scheduler call (ddlbench.launch.patience), or None
        self._silent_since: float | None = None
        self._unlisten = listen(self._controller)

    def _controller(self, line: str | None) -> None:
        """Told by ddlbench.launch.patience: the line says the controller is not answering (None: it answers)."""
        with self._lock:
            now = self.clock()
            if (line is None) == (self._silent_since is None):
                return  # nothing new: the line was already said, or there was nothing to take back
            self._silent_since = None if line is None else now
            if self.counts is not None:
                self.line = self._compose(self._base)
                self._write(self.line, self.counts, now, end=not self.terminal)

    def _compose(self, base: str) -> str:
        if self._silent_since is None:
            return base
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - (self.clock() - self._silent_since)))
        return f"{base}; the SLURM controller is not answering since {since}: waiting for it"

    def update(self, statuses: States, *, now: float | None = None) -> Counts:
        """Report `statuses` (all the points, or those so far with `total`); their counts."""
        now = self.clock() if now is None else now
        states = states_of(statuses)
        counts = Counts.of(states, total=self.total)
        with self._lock:
            self.timeline.observe(states, now)
            done = "all ended" if not counts.left else self.timeline.estimate(states, counts, now).text()
            self._base = f"{self.title}: {counts.text()}; {done}"
            self.counts, self.line = counts, self._compose(self._base)
            shown_counts, shown_line, shown_at = self._shown or (None, None, -float("inf"))
            changed = counts != shown_counts
            if self.terminal and not counts.left:
                if changed or self._open:
                    self._write(self.line, counts, now, end=True)
            elif self.terminal:
                if (changed or now - shown_at >= self.redraw_s) and self.line != shown_line:
                    self._write(self.line, counts, now, end=False)
            elif changed or now - shown_at >= self.every_s:
                self._write(self.line, counts, now, end=True)
        return counts

    def close(self, note: str | None = None) -> None:
        """Leave the last line standing (with `note` added: why the watching stopped, say)."""
        self._unlisten()
        with self._lock:
            if self.counts is None:
                if note:
                    self._write(f"{self.title}: {note}", Counts(), self.clock(), end=True)
                return
            # a terminal's open line ends; a plain log gets a line only for news
            news = note or self._open or (not self.terminal and (self._shown is None or self.counts != self._shown[0]))
            if news:
                self._write(f"{self.line}; {note}" if note else self.line, self.counts, self.clock(), end=True)

    def _write(self, line: str, counts: Counts, now: float, *, end: bool) -> None:
        if self.terminal:
            width = self.width or shutil.get_terminal_size().columns
            shown = line if len(line) < width else line[: max(width - 2, 0)] + "…"  # a wrapped line cannot be redrawn
            self.stream.write(f"\r{shown}{CLEAR_TO_END}" + ("\n" if end else ""))
            self._open = not end
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._shown = (counts, line, now)


def watch(
    poll: Callable[[], States],
    *,
    progress: Progress,
    interval_s: float = 10.0,
    max_interval_s: float | None = None,
    growth: float = 1.5,
    until: Callable[[Counts], bool] | None = None,
    idle_polls: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> Counts:
    """Report `poll()` until `until(counts)` is true, by default until every point ended, or none ran or
    waited in the queue for `idle_polls` polls in a row (the workflow stopped with points not started; one
    poll alone would stop between two jobs); or until Ctrl-C. The last line stays, saying why the watching
    stopped when the work did not end. The last counts.

    Polls are `interval_s` apart; with `max_interval_s`, as submit's wait polls (ddlbench.launch.waves.
    QueueWatch): `interval_s` after a poll that saw a point end or enter or leave the queue, else the
    last pause × `growth`, up to `max_interval_s`. A point that starts running changes nothing waited for."""
    if not 0 < interval_s <= (max_interval_s or interval_s) or growth < 1:
        raise ValueError(
            f"poll {interval_s} s up to {max_interval_s} s by ×{growth}: need 0 < poll <= max, growth >= 1"
        )
    idle = 0
    counts = Counts()
    pause, seen = interval_s, None
    try:
        while True:
            counts = progress.update(poll())
            now = (counts.ended, counts.failed, counts.running + counts.pending)
            grow = max_interval_s is not None and now == seen
            pause, seen = (min(pause * growth, max_interval_s) if grow else interval_s), now
            if until is not None:
                if until(counts):
                    break
            elif not counts.left:
                break
            else:
                idle = 0 if counts.running or counts.pending else idle + 1
                if idle >= idle_polls:
                    progress.close(f"none running or queued at {idle} looks in a row: stopped watching")
                    return counts
            sleep(pause)
    except KeyboardInterrupt:
        progress.close("stopped watching (Ctrl-C); the work goes on")
        return counts
    progress.close()
    return counts


@contextmanager
def watching(poll: Callable[[], States], *, progress: Progress, interval_s: float = 5.0) -> Iterator[Progress]:
    """Report `poll()` every `interval_s` from a thread while the body runs (a Snakemake subprocess, a loop
    of points); on leaving, one last look and the last line."""
    stop = threading.Event()

    def report() -> None:
        while not stop.is_set() and _look(poll, progress):
            stop.wait(interval_s)

    thread = threading.Thread(target=report, name="ddlbench-progress", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        _look(poll, progress)
        progress.close()


def _look(poll: Callable[[], States], progress: Progress) -> bool:
    try:
        progress.update(poll())
    except Exception as exc:  # progress is a courtesy: a failed look must not end the work it watches
        log.warning("progress not shown any more: %s", exc)
        return False
    return True


def sweep_states(
    plan: Any,
    *,
    sweep_dir: Path,
    only: Collection[str] | None = None,
    every_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[list[QueuedJob]], list[PointStatus]]:
    """A queue → the PointStatus of the plan's points (`only` those, where given), as `ddlbench status`
    reads them (ddlbench.launch.status.StatusReader, the jobs index read again each time): for
    wait_for's `on_poll` with the queue it polled anyway, or for `status --watch` with query_queue().
    A record is read again when its job leaves the queue and, with `every_s`, at least that often (for
    jobs that came and went between two polls: Snakemake's); a wait that submitted the points itself
    sees each of their jobs in the queue and needs no `every_s`."""
    from ddlbench.launch.submission import read_jobs_index

    if only is not None:  # only their records are read
        plan = replace(plan, points=tuple(point for point in plan.points if point.point_id in only))
    reader = StatusReader(plan, sweep_dir=sweep_dir, every_s=every_s, clock=clock)

    def states(queue: list[QueuedJob]) -> list[PointStatus]:
        return reader.look(queue, read_jobs_index(sweep_dir))

    return states


def queued_states(
    queue: list[QueuedJob], *, jobs_index: Mapping[str, list[str]], points: Collection[str]
) -> dict[str, str]:
    """point id → running or pending, for those of `points` whose job is active in the queue (matched as
    `ddlbench status` matches them: ddlbench.launch.status.points_of_job). Laid over states_on_disk for
    work whose records sweep_status does not read (a calibration suite's)."""
    job_points: dict[str, list[str]] = {}
    for point_id, job_ids in jobs_index.items():
        for job_id in job_ids:
            job_points.setdefault(job_id, []).append(point_id)
    states = {}
    for job in queue:
        state = "running" if job.state in RUNNING_STATES else "pending" if job.state in PENDING_STATES else None
        for point_id in points_of_job(job, job_points) if state else ():
            if point_id in points:
                states[point_id] = state
    return states


def predicted_durations(config: Any, points: Sequence[Any] | None = None) -> dict[str, float]:
    """point id → predicted duration, seconds ((warm-up + steps) × predicted step time + launch time:
    ddlbench.launch.packed.expected_times), on the sweep's machine file; {} without one or where it cannot
    predict. `points`: the sweep's, by default."""
    from ddlbench.launch.packed import expected_times

    if points is None:
        from ddlbench.sweep import expand_sweep

        points = expand_sweep(config).points
    times, source = expected_times(
        list(points), getattr(config, "machine_path", None), sweep_dir=getattr(config, "sweep_dir", None)
    )
    log.debug("progress: %s", source)
    return times
