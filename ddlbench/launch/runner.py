"""Run one point: launch its ranks, collect what they wrote, judge the outcome, write the record."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from ddlbench.analysis.inside.timeline import last_step, trace_path, write_trace
from ddlbench.errors import DdlbenchError
from ddlbench.launch.cores import CoreGrant, Neighbours, host_ledger
from ddlbench.launch.launchers import LocalLauncher, select_launcher
from ddlbench.launch.mpi import MpirunLauncher
from ddlbench.launch.processes import LaunchOutcome, describe_returncode
from ddlbench.launch.slurm import current_allocation
from ddlbench.launch.worker import failure_file, rank_file
from ddlbench.metrics import first_nonfinite_step, mean_loss_per_step, summarize_ranks
from ddlbench.point import Point
from ddlbench.provenance import collect_provenance, utc_now
from ddlbench.records import (
    MEASUREMENT_VERSION,
    Metrics,
    PointRecord,
    RankFailure,
    RankResult,
    SlurmJob,
    Status,
    write_record,
)

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """The point runner itself was told to stop (SIGTERM/SIGINT): no record is written."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    status: Status
    reason: str | None
    metrics: Metrics | None


def run_point(
    point: Point,
    *,
    out: Path,
    launcher: str = "auto",
    dump_params: Path | None = None,
    timeout_s: float | None = None,
    cores: int | None = None,
    hostfile: Path | None = None,
) -> PointRecord:
    """Run `point` and write its record to `out`, whatever the outcome; returns the record.
    `timeout_s` overrides the point's own limit (a rerun given more time) without changing the point.
    `cores` is what Snakemake granted the point (its `{threads}`); a local launch needing more ranks ×
    threads than that (or than the CPU affinity) is refused before anything starts, unless the point
    allows oversubscription (OversubscriptionRefused: no record is written, nothing was measured).
    `hostfile` lists the hosts of an mpirun launch."""
    timeout_s = point.timeout_s if timeout_s is None else timeout_s
    start_time = utc_now()
    chosen = select_launcher(launcher, cores=cores, hostfile=hostfile)
    if point.node and chosen.name == "local" and point.node not in local_host_names():
        raise DdlbenchError(
            f"point {point.point_id} is pinned to node {point.node!r} (each_node), but a local launch runs on "
            f"this host ({', '.join(sorted(local_host_names()))}); run it under SLURM, or name this host"
        )
    grant = chosen.check(point) if isinstance(chosen, LocalLauncher | MpirunLauncher) else None
    rank_dir = rank_dir_for(out)
    shutil.rmtree(rank_dir, ignore_errors=True)
    rank_dir.mkdir(parents=True)
    slurm = current_allocation() if chosen.name == "srun" else None
    log.info("point %s: %d ranks via %s", point.point_id, point.world_size, chosen.name)
    ledger = host_ledger(point.point_id) if chosen.name == "local" else contextlib.nullcontext([])
    with stop_on_signals(), ledger as neighbours:
        outcome = chosen.launch(point, rank_dir=rank_dir, dump_params=dump_params, timeout_s=timeout_s)
    record = record_point(
        point,
        out=out,
        outcome=outcome,
        launcher=chosen.name,
        grant=grant,
        slurm=slurm,
        timeout_s=timeout_s,
        start_time=start_time,
        end_time=utc_now(),
        neighbours=neighbours[0] if neighbours else None,
    )
    log.info("point %s: %s after %.1f s of launch%s", point.point_id, record.status, outcome.wall_s, _detail(record))
    return record


def record_point(
    point: Point,
    *,
    out: Path,
    outcome: LaunchOutcome,
    launcher: str,
    grant: CoreGrant | None,
    slurm: SlurmJob | None,
    timeout_s: float,
    start_time: str,
    end_time: str,
    neighbours: Neighbours | None = None,
) -> PointRecord:
    """Judge what the ranks wrote into the point's rank folder, write the point's record, drop the folder.
    `neighbours`: the other points that ran on this host meanwhile (a local launch's host ledger)."""
    rank_dir = rank_dir_for(out)
    results, failures = _read_rank_files(rank_dir, point.world_size)
    verdict = judge(point, outcome, results, failures, timeout_s=timeout_s)
    if verdict.metrics is not None and grant is not None and grant.oversubscribed:
        note = f"launcher: {grant.needed} cores needed, {grant.granted} granted; " + verdict.metrics.cores_note
        verdict = replace(verdict, metrics=replace(verdict.metrics, oversubscribed=True, cores_note=note))
    if verdict.metrics is not None and neighbours is not None:
        note = f"{verdict.metrics.cores_note}; {neighbours.note()}"
        shared = round(neighbours.shared_s, 3)
        verdict = replace(verdict, metrics=replace(verdict.metrics, shared_host_s=shared, cores_note=note))
    if slurm is not None and outcome.step_id:
        nodes = ",".join(sorted({rank.slurm_node for rank in results if rank.slurm_node})) or None
        slurm = replace(slurm, step_id=outcome.step_id, step_nodes=nodes)
    record = PointRecord(
        point_id=point.point_id,
        point=point,
        status=verdict.status,
        reason=verdict.reason,
        metrics=verdict.metrics,
        provenance=collect_provenance(
            launcher=launcher,
            ranks=results,
            config_hash=point.spec_hash,
            start_time=start_time,
            end_time=end_time,
            slurm=slurm,
        ),
        ranks=tuple(results),
        failures=tuple(failures),
        measurement_version=MEASUREMENT_VERSION,
    )
    if point.trace_steps:
        write_trace(record, trace_path(out))  # the traced window, beside the record
    # the record keeps the last step's timeline of each rank (the report draws it); the trace keeps the window
    record = replace(record, ranks=tuple(replace(rank, timeline=last_step(rank.timeline)) for rank in record.ranks))
    write_record(out, record)
    shutil.rmtree(rank_dir, ignore_errors=True)
    return record


def _detail(record: PointRecord) -> str:
    return f" ({record.reason})" if record.reason else ""


def local_host_names() -> set[str]:
    """This host's names, full and short: what a local point's `node` pin must be."""
    name = socket.gethostname()
    return {name, name.split(".")[0]}


def write_unfinished_record(
    point: Point,
    *,
    out: Path,
    status: Status,
    reason: str,
    allocation: SlurmJob | None = None,
    start_time: str | None = None,
) -> PointRecord:
    """The record of a point whose run was cut short from outside (the scheduler gave up on it, or its
    packed allocation ended before or while it ran). `allocation`: the SLURM job, where the caller knows
    it already (else the controller is asked); `start_time`: when the point started, if it did."""
    now = utc_now()
    record = PointRecord(
        point_id=point.point_id,
        point=point,
        status=status,
        reason=reason,
        metrics=None,
        provenance=collect_provenance(
            launcher="srun",
            ranks=[],
            config_hash=point.spec_hash,
            start_time=start_time or now,
            end_time=now,
            slurm=allocation or current_allocation(),
        ),
        measurement_version=MEASUREMENT_VERSION,
    )
    write_record(out, record)
    return record


def write_not_run_record(point: Point, *, out: Path, status: Status, reason: str) -> PointRecord:
    """The record of a point left unrun on purpose before anything started (a sweep's `predicted_misfits:
    skip`): no ranks, no metrics, launcher `none`; `reason` says why."""
    now = utc_now()
    provenance = collect_provenance(
        launcher="none", ranks=[], config_hash=point.spec_hash, start_time=now, end_time=now
    )
    record = PointRecord(
        point_id=point.point_id, point=point, status=status, reason=reason, metrics=None, provenance=provenance,
        measurement_version=MEASUREMENT_VERSION,
    )  # fmt: skip
    write_record(out, record)
    return record


def rank_dir_for(out: Path) -> Path:
    """Scratch folder where the ranks of the point recorded at `out` write; beside the record, so on
    the shared filesystem under SLURM, and distinct for every record path."""
    return out.with_name(f"{out.name}.ranks")


def judge(
    point: Point,
    outcome: LaunchOutcome,
    results: list[RankResult],
    failures: list[RankFailure],
    *,
    timeout_s: float | None = None,
) -> Verdict:
    """Status and reason of a launch, most telling first: the time limit; running out of memory (a rank's
    allocation failure, or SLURM killing the step at its memory limit); a rank that died without a word (its
    peers then fail with 'connection reset', which is not the cause; out of memory where SIGKILL ended it and the
    kernel's out-of-memory killer ended a process on this host meanwhile); the earliest exception; a missing
    result; a loss that stopped being finite."""
    if outcome.timed_out:
        return Verdict(
            status="timeout",
            reason=f"ran past its limit of {timeout_s or point.timeout_s:g} s; the ranks still running were stopped",
            metrics=None,
        )
    if outcome.launcher_messages:
        return Verdict(status="oom", reason=f"SLURM stopped the ranks: {outcome.launcher_messages[0]}", metrics=None)
    oom = next((failure for failure in failures if failure.out_of_memory), None)
    if oom is not None:
        return Verdict(status="oom", reason=_failure_reason(oom), metrics=None)
    reported = {failure.rank for failure in failures}
    for code, stopped, ranks in zip(outcome.returncodes, outcome.stopped, outcome.ranks_of_process, strict=True):
        if code != 0 and not stopped and not reported & set(ranks):
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"the launcher of ranks {ranks[0]}-{ranks[-1]}"
            reason = f"{who} ended with {describe_returncode(code)} without reporting an error"
            killed = outcome.host_oom_kills
            if code == -signal.SIGKILL and killed:
                reason += (
                    f": the kernel's out-of-memory killer ended {killed} process{'es' if killed > 1 else ''} on this "
                    "host while the ranks ran (/proc/vmstat oom_kill)"
                )
                return Verdict(status="oom", reason=reason, metrics=None)
            if code == -signal.SIGKILL:
                reason += (
                    " (possibly the kernel's out-of-memory killer)"
                    if killed is None
                    else " (not the kernel's out-of-memory killer: it ended no process on this host meanwhile)"
                )
            return Verdict(status="failed", reason=reason, metrics=None)
    if failures:
        return Verdict(status="failed", reason=_failure_reason(failures[0]), metrics=None)
    missing = sorted(set(range(point.world_size)) - {result.rank for result in results})
    if missing:
        return Verdict(status="failed", reason=f"ranks {missing} ended without writing a result", metrics=None)
    try:
        metrics = summarize_ranks(point, results)
        losses = mean_loss_per_step(results)
    except ValueError as exc:  # results the ranks wrote but that do not add up: still a record
        return Verdict(status="failed", reason=f"rank results are inconsistent: {exc}", metrics=None)
    diverged_at = first_nonfinite_step(losses)
    if diverged_at is not None:
        reason = f"diverged: loss is {losses[diverged_at]} at step {diverged_at} (warm-up included)"
        return Verdict(status="failed", reason=reason, metrics=metrics)
    return Verdict(status="ok", reason=None, metrics=metrics)


def _failure_reason(failure: RankFailure) -> str:
    return f"rank {failure.rank} on {failure.hostname}: {failure.error_type}: {failure.message}"


def _read_rank_files(rank_dir: Path, world_size: int) -> tuple[list[RankResult], list[RankFailure]]:
    results, failures = [], []
    for rank in range(world_size):
        if rank_file(rank_dir, rank).exists():
            results.append(RankResult.from_dict(json.loads(rank_file(rank_dir, rank).read_text())))
        if failure_file(rank_dir, rank).exists():
            failures.append(RankFailure(**json.loads(failure_file(rank_dir, rank).read_text())))
    failures.sort(key=lambda failure: failure.time)  # the earliest first: the others usually followed it
    return results, failures


class stop_on_signals:
    """Turn SIGTERM/SIGINT into Interrupted while ranks run, so they are stopped rather than orphaned.

    Only the first signal interrupts: the stop of the ranks it starts is not cut short by a second one
    (in a packed allocation that ends, SLURM and the dispatcher both send SIGTERM)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self) -> None:
        self.previous = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        self.interrupted = False
        for sig in self.SIGNALS:
            signal.signal(sig, self._raise)

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _raise(self, signum: int, frame: object) -> None:
        if self.interrupted:
            log.warning("%s while the ranks are being stopped: ignored", signal.Signals(signum).name)
            return
        self.interrupted = True
        raise Interrupted(f"stopped by {signal.Signals(signum).name}")
