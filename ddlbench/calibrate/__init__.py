"""Calibrating a machine, the orchestration: a suite of microbenchmark points (`suite`), each launched
like a training point (ddlbench.launch.calibration) and timed on its ranks (ddlbench.train.calibration),
fitted into a versioned machine file that later analyses read (ddlbench.analysis.machine), with a report
of curves against fits (`report`). `calibrate()` runs a whole suite; `ddlbench calibrate` is its command.

The layers below know nothing of this package: the worker reads a CalibrationPoint
(ddlbench.train.calibration.point), the analytical model a machine file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def calibrate(
    suite_path: Path | None,
    *,
    out: Path,
    launcher: str = "auto",
    cores: int | None = None,
    report: Path | None = None,
    raw: dict[str, Any] | None = None,
    from_records: bool = False,
) -> dict[str, Any]:
    """Run every point of the suite (each writes its record, whatever happens), fit, write the machine file
    at `out` and the report beside the records (or at `report`); return the machine. `from_records`: run
    nothing, fit the records the points already wrote (workflow/calibrate.smk ran them); a point without
    one counts as failed."""
    from ddlbench.analysis.machine.machine_file import REFERENCE_MACHINES, measured_machine, read_machine, write_machine
    from ddlbench.atomic import write_text_atomic
    from ddlbench.calibrate.report import render_calibration
    from ddlbench.calibrate.suite import load_suite
    from ddlbench.launch.calibration import run_calibration_point
    from ddlbench.records import RecordError
    from ddlbench.train.calibration.records import missing_record, read_calibration_record

    suite = load_suite(suite_path, raw=raw)
    records = []
    progress = None if from_records else _progress(suite, "calibration")
    for point in suite.points:
        if from_records:
            try:
                records.append(read_calibration_record(suite.record_path(point)))
            except RecordError as exc:
                records.append(missing_record(point, str(exc)))
            continue
        log.info("calibration point %s (%d ranks)", point.point_id, point.world_size)
        progress.update(_states(suite, records, running=point.point_id))
        records.append(run_calibration_point(point, out=suite.record_path(point), launcher=launcher, cores=cores))
    if progress is not None:
        progress.update(_states(suite, records))
        progress.close()
    machine = measured_machine(records, name=suite.machine, suite=suite.name)
    write_machine(out, machine)
    references = [read_machine(path) for path in sorted(REFERENCE_MACHINES.glob("*.yaml"))]
    write_text_atomic(report or suite.folder / "report.html", render_calibration(machine, references))
    return machine


def submit_suite(
    suite_path: Path | None, *, raw: dict[str, Any] | None = None, site_path: Path | None = None, like: Any = None
) -> None:
    """Submit the suite's points as SLURM jobs through submitit (as `ddlbench submit` does a sweep's: job
    arrays by allocation, each point an srun step writing its record) and wait for them all. The site is
    the profile's (`ddlbench profile slurm`) or `site_path`; `like`, a sweep config, puts them where its
    points run (its `slurm:` partition and memory per rank; the site's GPUs per rank)."""
    from ddlbench.calibrate.suite import load_suite
    from ddlbench.launch.admission import check_submission
    from ddlbench.launch.profile import load_default_site
    from ddlbench.launch.resources import load_site
    from ddlbench.launch.submission import plan_resources, submit_points, wait_for

    suite = load_suite(suite_path, raw=raw)
    site = load_site(site_path) if site_path else load_default_site()
    planned = plan_resources(suite.points, site, sweep=like)
    check_submission(list(planned.items()), account_required=True if site.require_account else None)
    points = list(suite.points)
    jobs = submit_points(points, planned, sweep_dir=suite.folder, name=f"{suite.name}-calibration")
    for point, job in zip(points, jobs, strict=True):
        log.info("calibration point %s: job %s", point.point_id, job.job_id)
    from ddlbench.launch.disk_status import record_state
    from ddlbench.launch.progress import queued_states
    from ddlbench.launch.submission import read_jobs_index

    progress = _progress(suite, "calibration jobs")
    paths = {point.point_id: suite.record_path(point) for point in points}

    def poll(queue) -> None:  # a record ends a point; the queue tells running from pending
        ended = {p: record_state(path) for p, path in paths.items() if path.exists()}
        queued = queued_states(queue, jobs_index=read_jobs_index(suite.folder), points=paths)
        progress.update({p: "not started" for p in paths} | queued | ended)

    wait_for(jobs, on_poll=poll)
    progress.close()


def _progress(suite, what: str):
    from ddlbench.launch.progress import Progress

    return Progress(title=f"{what} {suite.name!r}", total=len(suite.points))


def _states(suite, records, *, running: str | None = None) -> dict[str, str]:
    """The suite's points: those run so far by their records' status, `running`, the rest not started."""
    states = {point.point_id: "not started" for point in suite.points}
    states |= {record.point_id: record.status for record in records}
    if running:
        states[running] = "running"
    return states
