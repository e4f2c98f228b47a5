"""Cores for local ranks: refuse silent sharing, pin ranks to disjoint cores where the host has them.

A point needs ranks × (threads + loader workers) cores. Locally it is granted the smaller of Snakemake's share (the
rule's `{threads}`, which Snakemake caps at `--cores`) and the CPUs this process may run on (its
affinity). A point that needs more is refused unless its sweep sets `oversubscribe: true`.

Points that Snakemake runs side by side all see the same affinity, so pinning each to "the first
cores" would stack them on the same ones. Each point therefore claims its cores through one lock
file per CPU (fcntl.flock, released by the kernel when the claiming process ends, even on a crash);
ranks are pinned to claimed cores only, and run unpinned, as the record then shows, when not enough
are free.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import DdlbenchError
from ddlbench.point import Point

PIN_VAR = "DDLBENCH_CPUS"  # comma-separated CPUs the worker pins itself to, before torch starts
# For launchers that start every rank with one environment (mpirun): each local rank's CPUs, the
# slices separated by ";"; a rank takes the slice of its local rank, which its MPI runtime sets
PIN_BY_LOCAL_RANK_VAR = "DDLBENCH_CPUS_BY_LOCAL_RANK"
MPI_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")  # Open MPI; MPICH/Hydra, Intel MPI
# where the per-CPU lock files live: every ddlbench on a host must share it (the default does)
LOCK_DIR_VAR = "DDLBENCH_CPU_LOCK_DIR"


class OversubscriptionRefused(DdlbenchError):
    """A point needs more cores than it was granted, and its sweep does not allow oversubscription."""


@dataclass(frozen=True, kw_only=True)
class CoreGrant:
    needed: int  # ranks × (threads + loader workers)
    granted: int  # min(Snakemake's share, the affinity's size)
    allowed: tuple[int, ...]  # this process's CPU affinity

    @property
    def oversubscribed(self) -> bool:
        return self.needed > self.granted


def grant_for(point: Point, snakemake_cores: int | None = None) -> CoreGrant:
    allowed = tuple(sorted(os.sched_getaffinity(0)))
    granted = len(allowed) if snakemake_cores is None else min(snakemake_cores, len(allowed))
    return CoreGrant(needed=point.world_size * point.cores_per_rank, granted=granted, allowed=allowed)


def check_cores(point: Point, grant: CoreGrant) -> None:
    """Refuse, in one line naming the point and both numbers, a point that would share cores silently."""
    if grant.oversubscribed and not point.oversubscribe:
        granted = (
            f"{grant.granted} are granted here (Snakemake's --cores share and the {len(grant.allowed)} CPUs "
            "of the affinity)"
        )
        raise OversubscriptionRefused(_refusal(point, granted))


@contextlib.contextmanager
def claimed_cores(grant: CoreGrant, lock_dir: Path | None = None) -> Iterator[tuple[int, ...] | None]:
    """Claim `grant.needed` free CPUs of the affinity for as long as the block runs; None when there
    are not enough free ones (or the point oversubscribes), so nothing is pinned."""
    if grant.oversubscribed:
        yield None
        return
    lock_dir = _lock_dir(lock_dir)
    held: list[tuple[int, int]] = []  # (cpu, fd)
    try:
        for cpu in grant.allowed:
            if len(held) == grant.needed:
                break
            fd = os.open(lock_dir / f"cpu{cpu}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((cpu, fd))
        yield tuple(cpu for cpu, _ in held) if len(held) == grant.needed else None
    finally:
        for _, fd in held:
            os.close(fd)  # closing the descriptor drops the lock


def rank_cpus(claimed: tuple[int, ...], rank: int, cores_per_rank: int) -> tuple[int, ...]:
    """The disjoint cores of one rank (its threads and its loader's workers): its `cores_per_rank`
    consecutive entries of the claimed set."""
    return claimed[rank * cores_per_rank : (rank + 1) * cores_per_rank]


def pin_from_environment(environ: Mapping[str, str]) -> str:
    """In a rank, before torch starts its thread pools: pin to the CPUs the launcher chose, and say
    who decided this rank's CPU binding (ddlbench, SLURM's --cpu-bind, or none)."""
    cpus = environ.get(PIN_VAR) or _slice_of_local_rank(environ)
    if cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in cpus.split(",")})
        return f"ddlbench: pinned to {cpus}"
    bind = environ.get("SLURM_CPU_BIND") or environ.get("SLURM_CPU_BIND_TYPE")
    if bind:
        listed = environ.get("SLURM_CPU_BIND_LIST", "")
        return f"slurm: {bind}{' ' + listed if listed else ''}"
    return "none"


def _slice_of_local_rank(environ: Mapping[str, str]) -> str:
    slices = environ.get(PIN_BY_LOCAL_RANK_VAR)
    local = next((environ[name] for name in MPI_LOCAL_RANK_VARS if name in environ), None)
    if not slices or local is None:
        return ""
    parts = slices.split(";")
    return parts[int(local)] if int(local) < len(parts) else ""


def check_plan_cores(points: list[Point], cores: int | None) -> None:
    """Before Snakemake schedules anything locally: refuse the first point whose ranks × threads
    exceed `--cores` (Snakemake would quietly cap its threads), naming how many such points there are."""
    if cores is None:
        return
    crowded = [point for point in points if point.world_size * point.cores_per_rank > cores and not point.oversubscribe]
    if crowded:
        others = f" (and {len(crowded) - 1} more points)" if len(crowded) > 1 else ""
        raise OversubscriptionRefused(_refusal(crowded[0], f"--cores is {cores}", others))


def _refusal(point: Point, granted: str, others: str = "") -> str:
    """The one line of a refusal: the point, what it needs, what it was granted, and the way out."""
    per_rank = f"{point.threads} threads"
    if point.loader_workers:
        per_rank = f"({per_rank} + {point.loader_workers} loader workers)"
    return (
        f"point {point.point_id}{others} needs {point.world_size} ranks × {per_rank} = "
        f"{point.world_size * point.cores_per_rank} cores, but {granted}; give more cores, or set "
        "`oversubscribe: true` in the sweep to run it with its figures flagged"
    )


# Points side by side on disjoint cores still share the host's memory bandwidth and caches. Every local
# launch notes its start and end in one ledger beside the lock files (a line each, appended), so a point can
# say, when it ends, which other points ran on this host while it did, and for how long.
LEDGER = "points.log"
LEDGER_KEEP_S = 7 * 86400.0  # lines older than a week are dropped when the ledger is rewritten


@dataclass(frozen=True)
class Neighbours:
    """Other ddlbench points that ran on this host during a launch: `window_s`, the launch's own span (s);
    `shared_s`, the seconds of it with at least one other point running (overlaps merged, not added);
    `overlaps`, each other point's id and the seconds its run overlapped this one's, longest first."""

    window_s: float
    shared_s: float
    overlaps: tuple[tuple[str, float], ...]

    def note(self) -> str:
        if not self.overlaps:
            return "alone on this host"
        ids = ", ".join(point_id for point_id, _ in self.overlaps[:3]) + (", …" if len(self.overlaps) > 3 else "")
        return (
            f"beside {len(self.overlaps)} other point(s) on this host for {self.shared_s:.1f} s of its "
            f"{self.window_s:.1f} s ({ids}): shared memory bandwidth and caches"
        )


@contextlib.contextmanager
def host_ledger(point_id: str, lock_dir: Path | None = None) -> Iterator[list[Neighbours]]:
    """Note this launch in the host's ledger for as long as the block runs; after it, the list it yielded
    holds the Neighbours of the launch (the points whose runs overlapped it, from the ledger's lines and,
    for a point still running or ended without its line, until now)."""
    path = _lock_dir(lock_dir) / LEDGER
    token = f"{os.getpid()}-{time.time_ns()}"
    start = time.time()
    _append(path, f"start {start:.3f} {token} {point_id}")
    found: list[Neighbours] = []
    try:
        yield found
    finally:
        end = time.time()
        _append(path, f"end {end:.3f} {token} {point_id}")
        found.append(_neighbours(path, token, start, end))


def _lock_dir(lock_dir: Path | None) -> Path:
    folder = lock_dir or Path(
        os.environ.get(LOCK_DIR_VAR) or Path(tempfile.gettempdir()) / f"ddlbench-cpus-{os.getuid()}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode())  # one short write with O_APPEND: lines of points never interleave
    finally:
        os.close(fd)


def _neighbours(path: Path, token: str, start: float, end: float) -> Neighbours:
    spans: dict[str, list] = {}  # token → [point_id, start, end or None]
    try:
        lines = path.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) != 4 or parts[0] not in ("start", "end"):
            continue
        kind, when, other, point_id = parts
        try:
            moment = float(when)
        except ValueError:
            continue
        span = spans.setdefault(other, [point_id, None, None])
        span[1 if kind == "start" else 2] = moment
    overlaps: list[tuple[str, float, float, float]] = []
    for other, (point_id, begun, ended) in spans.items():
        if other == token or begun is None or (ended is None and not _alive(other)):
            continue  # this launch, a line cut short, or a launch killed before its end line (when unknown)
        ended = end if ended is None else ended  # still running: until now
        low, high = max(start, begun), min(end, ended)
        if high > low:
            overlaps.append((point_id, high - low, low, high))
    union, reach = 0.0, start
    for _, _, low, high in sorted(overlaps, key=lambda item: item[2]):
        low = max(low, reach)
        if high > low:
            union, reach = union + high - low, high
    with contextlib.suppress(ValueError, IndexError):
        if lines and float(lines[0].split(" ")[1]) < end - LEDGER_KEEP_S:
            _prune(path, end - LEDGER_KEEP_S)
    return Neighbours(
        window_s=end - start,
        shared_s=min(end - start, union),
        overlaps=tuple((point_id, seconds) for point_id, seconds, _, _ in sorted(overlaps, key=lambda o: -o[1])),
    )


def _alive(token: str) -> bool:
    """Whether the process that wrote a ledger token (pid-nanoseconds) still runs on this host."""
    try:
        os.kill(int(token.split("-")[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process of that pid: it runs
        return True
    return True


def _prune(path: Path, before: float) -> None:
    """Drop the lines of launches that ended before `before` (best effort: a line appended meanwhile may
    be lost, costing only a neighbour's note)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kept = [line for line in path.read_text().splitlines() if float(line.split(" ")[1]) >= before]
        fresh = path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_text("".join(line + "\n" for line in kept))
        fresh.replace(path)
