"""Where a sweep's points stand from their files alone, without squeue: for work that runs here or under a
Snakemake subprocess, so that a watcher thread can report on it (ddlbench.launch.progress.watching).

ddlbench.launch.status.sweep_status is the reading with the queue; this one reads a record's `status`
only, so it serves training and calibration records alike, and reads each version of a file once (however
many records: no cache size to thrash at). DiskWatch is its reading for a watcher: a bounded number of
stats per look. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ddlbench.records import record_path


def states_on_disk(
    records: Mapping[str, Path],
    logs: Mapping[str, Path] | None = None,
    *,
    since: float | None = None,
    redo: bool = False,
) -> dict[str, str]:
    """point id → state from files alone, without squeue: for a Snakemake subprocess or a loop here.

    `since` is when the work began (time.time(): files' modification times). A record written since then
    gives its status. Else a point whose log was written since then is running: Snakemake creates a job's
    log as it starts it, and the earlier record of a point run again stays until the new one replaces it.
    Else its earlier record's status, or with `redo` (every point runs again) not started; without a record,
    not started. Without `since`, every record counts and nothing is seen running.
    One stat for a point with a record written since `since` (and a read when it changed), two otherwise."""
    logs = logs or {}
    return {
        point_id: state_on_disk(path, logs.get(point_id), since=since, redo=redo) for point_id, path in records.items()
    }


def state_on_disk(record: Path, log: Path | None, *, since: float | None = None, redo: bool = False) -> str:
    """One point's state for states_on_disk, from its record and its log."""
    stat = _stat(record)
    if stat is not None and (since is None or stat.st_mtime >= since):
        return _status_in(record, stat.st_mtime_ns, stat.st_size)
    logged = _stat(log) if log is not None and since is not None else None
    if logged is not None and logged.st_mtime >= since:
        return "running"
    if stat is not None and not redo:
        return _status_in(record, stat.st_mtime_ns, stat.st_size)
    return "not started"


class DiskWatch:
    """states_on_disk for a watcher that looks again and again (`status --watch` without the queue), at a
    filesystem cost that does not grow with the number of looks: each look reads again the points that
    were running, then the others in turn, as many as (seconds since the last look) × max(points ÷
    `every_s`, `least_per_s`) allows, those running first; the rest keep the state of their last look.
    A point is looked at when first named. One look is at most two stats (state_on_disk), so at
    `every_s` = 120 at most one stat per point per minute for sweeps over 1,200 points, and at most
    2 × `least_per_s` a second in all below. `clock` replaces time.monotonic (tests)."""

    def __init__(
        self,
        *,
        since: float | None = None,
        redo: bool = False,
        every_s: float = 120.0,
        least_per_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.since, self.redo, self.every_s, self.least_per_s, self._clock = since, redo, every_s, least_per_s, clock
        self.states: dict[str, str] = {}
        self.looks = 0
        self._turn: deque[str] = deque()
        self._credit = 0.0
        self._last: float | None = None

    def __call__(self, records: Mapping[str, Path], logs: Mapping[str, Path] | None = None) -> dict[str, str]:
        logs = logs or {}
        now = self._clock()
        elapsed = 0.0 if self._last is None else now - self._last
        self._last = now
        rate = max(len(records) / self.every_s, self.least_per_s)
        self._credit = min(self._credit + elapsed * rate, float(len(records)))
        new = [point_id for point_id in records if point_id not in self.states]
        running = [point_id for point_id in records if self.states.get(point_id) == "running"]
        due = dict.fromkeys(new)
        for point_id in running:
            if self._credit < 1:
                break
            due[point_id] = None
            self._credit -= 1
        for _ in range(len(self._turn)):
            if self._credit < 1:
                break
            point_id = self._turn.popleft()
            if point_id not in records:  # no longer named: out of the round
                continue
            self._turn.append(point_id)
            if point_id not in due:
                due[point_id] = None
                self._credit -= 1
        for point_id in due:
            if point_id not in self.states:
                self._turn.append(point_id)
            self.states[point_id] = state_on_disk(
                records[point_id], logs.get(point_id), since=self.since, redo=self.redo
            )
        self.looks += len(due)
        return {point_id: self.states[point_id] for point_id in records}


def record_state(path: Path) -> str:
    """A record's `status` (a training or a calibration record: both have it), or `unreadable`."""
    stat = _stat(path)
    if stat is None:
        return "unreadable"
    return _status_in(path, stat.st_mtime_ns, stat.st_size)


_READ: dict[Path, tuple[int, int, str]] = {}  # path → mtime ns, size, status: every record read, once per version


def _status_in(path: Path, mtime_ns: int, size: int) -> str:
    """Read once per version of the file (records are replaced whole: ddlbench.atomic)."""
    known = _READ.get(path)
    if known is not None and known[:2] == (mtime_ns, size):
        return known[2]
    try:
        status = json.loads(path.read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        status = "unreadable"
    status = status if isinstance(status, str) else "unreadable"
    _READ[path] = (mtime_ns, size, status)
    return status


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def sweep_files(
    sweep_dir: Path, point_ids: Iterable[str], *, log_dir: Path | None = None
) -> tuple[dict[str, Path], dict[str, Path]]:
    """Each point's record and log, for states_on_disk: <sweep>/logs/run_point/<id>.log where Snakemake
    (workflow/rules/points.smk) and packed allocations write it; a calibration suite's are in
    <suite folder>/logs (workflow/calibrate.smk)."""
    log_dir = log_dir or sweep_dir / "logs" / "run_point"
    ids = list(point_ids)
    return {p: record_path(sweep_dir, p) for p in ids}, {p: log_dir / f"{p}.log" for p in ids}


def adaptive_files(sweep_dir: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The adaptive sweep's points so far (every round planned: <sweep>/adaptive/rounds/<N>.json), each
    with its record and its launch's log (workflow/adaptive.smk), for states_on_disk."""
    folder = sweep_dir / "adaptive"
    records: dict[str, Path] = {}
    logs: dict[str, Path] = {}
    for path in sorted((folder / "rounds").glob("*.json")):
        try:
            launches = json.loads(path.read_text())["launches"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not a round: the next look reads it
        for launch in launches:
            for point_id in launch["points"]:
                records[point_id] = folder / "points" / point_id / "record.json"
                logs[point_id] = folder / "logs" / f"{launch['id']}.log"
    return records, logs
