"""Run one calibration point through a training point's launchers and write its record, whatever happens."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import ddlbench
from ddlbench.errors import DdlbenchError
from ddlbench.launch.launchers import LocalLauncher, select_launcher
from ddlbench.launch.mpi import MpirunLauncher, find_mpirun
from ddlbench.launch.processes import describe_returncode
from ddlbench.launch.runner import rank_dir_for
from ddlbench.launch.worker import failure_file, rank_file
from ddlbench.provenance import cpu_model, git_state, utc_now
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import CalibrationRankResult, CalibrationRecord, write_calibration_record

log = logging.getLogger(__name__)


def launcher_for(point: CalibrationPoint, requested: str, environ: dict[str, str] | None = None) -> str:
    """`auto` as for training points, except that an MPI point outside SLURM needs mpirun: ddlbench's own
    local processes would each be an MPI world of one."""
    environ = dict(os.environ) if environ is None else environ
    if requested == "auto" and point.backend == "mpi" and "SLURM_JOB_ID" not in environ:
        return "mpirun"
    return requested


def run_calibration_point(
    point: CalibrationPoint, *, out: Path, launcher: str = "auto", cores: int | None = None
) -> CalibrationRecord:
    start = utc_now()
    name = launcher_for(point, launcher)
    commit, _ = git_state()
    base = dict(point_id=point.point_id, point=point, start_time=start, cpu_model=cpu_model(), git_commit=commit)
    base["ddlbench_version"] = ddlbench.__version__
    if name == "mpirun" and find_mpirun(os.environ) is None:
        reason = "MPI points start under mpirun (or srun in an allocation); no mpirun or mpiexec on PATH"
        return _write(out, CalibrationRecord(status="failed", reason=reason, launcher=name, end_time=utc_now(), **base))
    chosen = select_launcher(name, cores=cores)
    try:
        if isinstance(chosen, LocalLauncher | MpirunLauncher):
            chosen.check(point)  # refuses ranks × threads beyond the cores, or nodes mpirun does not know
    except DdlbenchError as exc:
        record = CalibrationRecord(status="failed", reason=str(exc), launcher=chosen.name, end_time=utc_now(), **base)
        return _write(out, record)
    rank_dir = rank_dir_for(out)
    shutil.rmtree(rank_dir, ignore_errors=True)
    rank_dir.mkdir(parents=True)
    outcome = chosen.launch(point, rank_dir=rank_dir, dump_params=None, timeout_s=point.timeout_s)
    ranks, failures = [], []
    for rank in range(point.world_size):
        if rank_file(rank_dir, rank).exists():
            ranks.append(CalibrationRankResult.from_dict(json.loads(rank_file(rank_dir, rank).read_text())))
        if failure_file(rank_dir, rank).exists():
            failures.append(json.loads(failure_file(rank_dir, rank).read_text()))
    shutil.rmtree(rank_dir, ignore_errors=True)
    status, reason = "ok", None
    if outcome.timed_out:
        status, reason = "timeout", f"ran past its limit of {point.timeout_s:g} s"
    elif failures:
        first = min(failures, key=lambda failure: failure["time"])
        status = "oom" if first["out_of_memory"] else "failed"
        reason = f"rank {first['rank']} on {first['hostname']}: {first['error_type']}: {first['message']}"
    elif len(ranks) != point.world_size:
        codes = ", ".join(describe_returncode(code) for code in outcome.returncodes if code)
        status, reason = "failed", f"{point.world_size - len(ranks)} rank(s) wrote no result ({codes or 'no error'})"
    record = CalibrationRecord(
        status=status, reason=reason, launcher=chosen.name, end_time=utc_now(), ranks=tuple(ranks), **base
    )
    log.info("calibration point %s: %s%s", point.point_id, status, f" ({reason})" if reason else "")
    return _write(out, record)


def _write(out: Path, record: CalibrationRecord) -> CalibrationRecord:
    write_calibration_record(out, record)
    return record
