"""Where a sweep's points stand from their files alone, without squeue: for work that runs here or under a
Snakemake subprocess, so that a watcher thread can report on it (ddlbench.launch.progress.watching).

ddlbench.launch.status.sweep_status is the reading with the queue; this one reads a record's `status`
only, so it serves training and calibration records alike, and reads each version of a file once.
Torch-free.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
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
    not started. Without `since`, every record counts and nothing is seen running."""
    logs = logs or {}
    states = {}
    for point_id, path in records.items():
        recorded = _modified(path)
        log_path = logs.get(point_id)
        logged = _modified(log_path) if log_path is not None else None
        if recorded is not None and (since is None or recorded >= since):
            states[point_id] = record_state(path)
        elif since is not None and logged is not None and logged >= since:
            states[point_id] = "running"
        elif recorded is not None and not redo:
            states[point_id] = record_state(path)
        else:
            states[point_id] = "not started"
    return states


def record_state(path: Path) -> str:
    """A record's `status` (a training or a calibration record: both have it), or `unreadable`."""
    try:
        stat = path.stat()
    except OSError:
        return "unreadable"
    return _status_in(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8192)
def _status_in(path: Path, _mtime_ns: int, _size: int) -> str:
    """Read once per version of the file (records are replaced whole: ddlbench.atomic)."""
    try:
        status = json.loads(path.read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable"
    return status if isinstance(status, str) else "unreadable"


def _modified(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
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
