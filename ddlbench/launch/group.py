"""Several points in one launch: the ranks start once, join once, and run the points one after another.

Why: a launch costs seconds whatever its steps (interpreter, torch import, process group, first-use
allocations: about 3.3 s of a 3.4 s launch of 8 short resnet8 steps on this project's 2-core host), so
short runs, the adaptive sweep's samples, are mostly launch. A group pays that once.

- The points of a group share a layout (LAYOUT: the launcher's and the ranks' shape); each keeps its
  own record, judged from its own rank folder exactly as a point launched alone (runner.record_point);
  the record's start and end are the point's span inside the launch (rank 0 writes it once every rank
  is done with the point).
- A point that neither finished on every rank nor failed on a rank of its own (the launch ended, by a
  failure or the time limit, while it or an earlier point ran) is run again alone (run_point): one
  point's failure never costs the others their measurement, and each time limit is the point's own.
- The launch's record (LaunchRecord, written last): nodes, start, end and wall time of everything done
  here, reruns included, and node_s = nodes × wall (node-seconds, measured): what the group cost.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.launchers import LocalLauncher, select_launcher
from ddlbench.launch.mpi import MpirunLauncher
from ddlbench.launch.processes import LaunchOutcome
from ddlbench.launch.runner import local_host_names, rank_dir_for, record_point, run_point, stop_on_signals
from ddlbench.launch.slurm import current_allocation
from ddlbench.launch.worker import failure_file, span_file
from ddlbench.launches import LAYOUT, LaunchRecord, PointSpan
from ddlbench.point import Point
from ddlbench.provenance import utc_now
from ddlbench.records import PointRecord

log = logging.getLogger(__name__)


def check_layout(points: list[Point]) -> None:
    """Refuse a group whose points could not share one launch, naming the field and the points."""
    if not points:
        raise DdlbenchError("a group launch needs at least one point")
    first = points[0]
    for point in points[1:]:
        for name in LAYOUT:
            if getattr(point, name) != getattr(first, name):
                raise DdlbenchError(
                    f"points {first.point_id} and {point.point_id} differ in {name} "
                    f"({getattr(first, name)!r} against {getattr(point, name)!r}); a group launch shares one "
                    f"layout ({', '.join(LAYOUT)})"
                )
    ids = [p.point_id for p in points]
    if len(set(ids)) != len(ids):
        raise DdlbenchError(f"a group launch lists a point twice: {sorted({i for i in ids if ids.count(i) > 1})}")


def run_group(
    points: list[Point],
    *,
    outs: list[Path],
    launch_out: Path,
    launch_id: str,
    launcher: str = "auto",
    cores: int | None = None,
) -> LaunchRecord:
    """Run `points` in one launch (see the module docstring), each record at its `outs` entry; write and
    return the launch's record at `launch_out`."""
    check_layout(points)
    if len(outs) != len(points):
        raise DdlbenchError(f"{len(points)} points but {len(outs)} record paths")
    first = points[0]
    started = time.monotonic()
    start_time = utc_now()
    chosen = select_launcher(launcher, cores=cores)
    if first.node and chosen.name == "local" and first.node not in local_host_names():
        raise DdlbenchError(f"points pinned to node {first.node!r} cannot run in a local launch on this host")
    grant = chosen.check(first) if isinstance(chosen, LocalLauncher | MpirunLauncher) else None
    scratch = launch_out.with_name(f"{launch_out.name}.ranks")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    entries = []
    for point, out in zip(points, outs, strict=True):
        rank_dir = rank_dir_for(out)
        shutil.rmtree(rank_dir, ignore_errors=True)
        rank_dir.mkdir(parents=True)
        entries.append({"spec": point.to_dict(), "rank_dir": str(rank_dir.resolve())})
    group = scratch / "group.json"
    write_text_atomic(group, json.dumps({"points": entries}, indent=1) + "\n")
    slurm = current_allocation() if chosen.name == "srun" else None
    timeout_s = sum(p.timeout_s for p in points)  # each point's own limit holds when it is run again alone
    log.info("group %s: %d points, %d ranks via %s", launch_id, len(points), first.world_size, chosen.name)
    with stop_on_signals():
        outcome = chosen.launch(first, rank_dir=scratch, dump_params=None, timeout_s=timeout_s, group=group)
    spans, again = [], []
    for point, out in zip(points, outs, strict=True):
        rank_dir = rank_dir_for(out)
        span = _read_span(rank_dir)
        if span is None and not _failed_here(rank_dir, point.world_size):
            again.append((point, out))
            continue
        # a point that finished had a clean launch of its own part; one that failed is judged by the launch
        mine = _clean(outcome) if span is not None else outcome
        begin, end = span or (start_time, utc_now())
        record = record_point(
            point,
            out=out,
            outcome=mine,
            launcher=chosen.name,
            grant=grant,
            slurm=slurm,
            timeout_s=point.timeout_s,
            start_time=begin,
            end_time=end,
        )
        spans.append(
            PointSpan(point_id=point.point_id, status=record.status, start_time=begin, end_time=end, alone=False)
        )
    for point, out in again:
        log.info("group %s: point %s did not finish in the group's launch; running it alone", launch_id, point.point_id)
        record = run_point(point, out=out, launcher=launcher, cores=cores)
        spans.append(_span_of(record))
    shutil.rmtree(scratch, ignore_errors=True)
    wall = time.monotonic() - started
    launch = LaunchRecord(
        launch_id=launch_id,
        nodes=first.nodes,
        launcher=chosen.name,
        start_time=start_time,
        end_time=utc_now(),
        wall_s=wall,
        node_s=first.nodes * wall,
        points=tuple(spans),
    )
    write_text_atomic(launch_out, json.dumps(launch.to_dict(), indent=1) + "\n")
    return launch


def _read_span(rank_dir: Path) -> tuple[str, str] | None:
    path = span_file(rank_dir)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data["start_time"], data["end_time"]


def _failed_here(rank_dir: Path, world_size: int) -> bool:
    return any(failure_file(rank_dir, rank).exists() for rank in range(world_size))


def _clean(outcome: LaunchOutcome) -> LaunchOutcome:
    """The launch as the finished point saw it: every process ran its part to the end."""
    return LaunchOutcome(
        returncodes=tuple(0 for _ in outcome.returncodes),
        ranks_of_process=outcome.ranks_of_process,
        timed_out=False,
        stopped=tuple(False for _ in outcome.stopped),
        wall_s=outcome.wall_s,
    )


def _span_of(record: PointRecord) -> PointSpan:
    return PointSpan(
        point_id=record.point_id,
        status=record.status,
        start_time=record.provenance.start_time,
        end_time=record.provenance.end_time,
        alone=True,
    )
