"""Inside a packed allocation: run its points as job steps on nodes of their own (`ddlbench run-packed`).

The one engine that runs packed points: the batch script of a packed job (ddlbench.launch.packed)
execs it on the allocation's first node, and in an allocation already held (salloc, sbatch; Snakemake
with DDLBENCH_PACK=1) `ddlbench run-packed --configfile` plans the sweep's points into it first
(ddlbench.launch.inside) and runs it on that plan. It carries out the packing's rule
(ddlbench.launch.packing) with the points' real ends: whenever nodes free up, the first waiting points in
the plan's order that fit them start, each as `ddlbench run-point --launcher srun` with
$DDLBENCH_STEP_NODES naming its nodes and $DDLBENCH_STEP_PORT a rendezvous port no other running step
uses, so that its ranks are one `srun --exclusive` step there and its record is a per-point record plus
the job and step ids.

- A point that fails, times out or is killed (`scancel JOB.STEP`) ends its own step; its runner writes
  its record (failed, timeout) and the others go on. A runner that ends without one (it crashed, or was
  stopped by hand) gets a record of status failed naming its output.
- A point starts only while its limit (timeout plus launch) fits before SLURM's end time for the job
  (SLURM_JOB_END_TIME, else `scontrol show job`; the plan's time limit from the dispatcher's start only
  where neither answers) less the site's margin, so that SLURM's time limit does not cut it.
- A watchdog stops the runner of a point that runs past its limit (plus OVERRUN_GRACE_S): SIGTERM to its
  process group, SIGKILL KILL_AFTER_S later; the point's record then says it overran, where its runner
  wrote none.
- When the allocation ends early (scancel, the time limit, preemption), SLURM sends SIGTERM and, KillWait
  seconds later, SIGKILL. The dispatcher then writes a record for every point never started, stops every
  runner in flight at once, waits for them together (within KillWait, read from `scontrol show config`
  into the plan) and writes a record for each whose runner wrote none.

Every point the dispatcher leaves unrun has a record of status timeout whose reason starts "not
started:" (never started) or "stopped: the allocation ended" (stopped in flight), so that `ddlbench
submit --pack` can say so and `ddlbench rerun --status timeout` runs them again. A record written since
the dispatcher started (by a runner) is never replaced; an older one (an earlier run of the point) is
kept aside in `points/<id>/previous/` first, as `ddlbench rerun` does.

What ran where and when is written, after every start and end, to the allocation's summary
(`<sweep>/packed/allocation-<job>.json`): each point's step nodes, span and exit code, and the
allocation's busy and idle node-seconds as measured.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.launchers import STEP_NODES_VAR, STEP_PORT_VAR
from ddlbench.launch.processes import describe_returncode
from ddlbench.launch.rendezvous import step_port
from ddlbench.launch.slurm import allocation_hosts
from ddlbench.point import Point
from ddlbench.records import SlurmJob

log = logging.getLogger(__name__)

POLL_S = 0.5
# a point's runner enforces its timeout itself, and its limit includes the launch: the watchdog waits this
# much longer before it stops a runner that has not ended
OVERRUN_GRACE_S = 10.0
KILL_AFTER_S = 10.0  # from the watchdog's SIGTERM to a runner to its SIGKILL
DEFAULT_KILL_WAIT_S = 30.0  # slurm.conf's default KillWait, where the plan does not give the cluster's
# of KillWait, kept for writing the records of the points in flight once their runners stopped
RECORD_RESERVE_S = 1.5
NOT_STARTED = "not started: "
STOPPED = "stopped: the allocation ended"
UNRUN_STATUS = "timeout"  # as for a job SLURM stopped (ddlbench.launch.submission)


def left_unrun(reason: str | None) -> bool:
    """Whether a record's reason says a packed allocation's dispatcher left its point unrun."""
    return bool(reason) and reason.startswith((NOT_STARTED, STOPPED))


@dataclass(kw_only=True)
class Entry:
    """One point of the plan file, as the dispatcher runs it."""

    point_id: str
    spec: str  # the point as JSON (run-point --spec)
    out: str  # its record
    log: str  # its runner's output
    nodes: int
    node: str  # "" or the node it is pinned to
    limit_s: float  # the longest it may run, launch included
    steps: dict[str, Any] = field(default_factory=dict)  # what happened: filled as it runs
    # not from the plan: the runner's start (monotonic), its lane (step_port), the watchdog's signals
    started: float = 0.0
    lane: int = 0
    overran_at: float | None = None
    killed: bool = False


def read_plan(path: Path) -> dict[str, Any]:
    try:
        plan = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DdlbenchError(f"cannot read the packed plan {path}: {exc}") from None
    missing = {"sweep_dir", "time_limit_s", "margin_s", "points"} - set(plan)
    if missing:
        raise DdlbenchError(f"packed plan {path} lacks {', '.join(sorted(missing))}")
    return plan


def run_allocation(
    plan_path: Path,
    *,
    environ: dict[str, str] | None = None,
    poll_s: float = POLL_S,
    overrun_grace_s: float = OVERRUN_GRACE_S,
    kill_after_s: float = KILL_AFTER_S,
    command: Callable[[Entry], list[str]] | None = None,
    described: tuple[SlurmJob, float | None] | None = None,
) -> int:
    """Run the plan's points in this allocation; 0 when every point started, 3 when some could not,
    128 + the signal's number when the allocation ended first. `command`: a point's runner (run-point);
    `described`: describe_allocation's answer where the caller has it already."""
    environ = dict(os.environ if environ is None else environ)
    began_wall, began = time.time(), time.monotonic()
    plan = read_plan(plan_path)
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise DdlbenchError("run-packed runs inside a SLURM allocation: SLURM_JOB_ID is not set")
    hosts = allocation_hosts(environ)
    entries = [Entry(**point) for point in plan["points"]]
    missing = sorted({e.node for e in entries if e.node} - set(hosts))
    if missing:
        raise DdlbenchError(f"points pinned to {', '.join(missing)}: not in this allocation ({','.join(hosts)})")
    job, scontrol_end = described or describe_allocation(job_id, environ)
    end_wall, source = allocation_end(environ, scontrol_end, fallback=began_wall + float(plan["time_limit_s"]))
    log.info(
        "allocation %s ends at %s (from %s); a point starts only if its limit ends %g s (the margin) before",
        job_id,
        time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end_wall)),
        source,
        float(plan["margin_s"]),
    )
    dispatcher = Dispatcher(
        plan=plan,
        job_id=job_id,
        job=job,
        hosts=hosts,
        entries=entries,
        environ=environ,
        began_wall=began_wall,
        began=began,
        deadline=began + (end_wall - began_wall) - float(plan["margin_s"]),
        end=(end_wall, source),
        poll_s=poll_s,
        overrun_grace_s=overrun_grace_s,
        kill_after_s=kill_after_s,
        command=command or runner_command,
    )
    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in handled}
    for signum in handled:
        signal.signal(signum, dispatcher.stop)
    try:
        return dispatcher.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@functools.cache
def cluster_kill_wait_s() -> float:
    """The cluster's KillWait (`scontrol show config`, read once with the cluster's facts on the login node):
    from SLURM's SIGTERM at a job's end to its SIGKILL; DEFAULT_KILL_WAIT_S where the controller does not say."""
    from ddlbench.launch.slurm import SlurmError, query_cluster

    try:
        kill_wait = query_cluster().kill_wait_s
    except SlurmError as exc:
        log.warning("cannot read KillWait (%s); assuming %g s", exc, DEFAULT_KILL_WAIT_S)
        return DEFAULT_KILL_WAIT_S
    return float(kill_wait) if kill_wait is not None else DEFAULT_KILL_WAIT_S


def runner_command(entry: Entry) -> list[str]:
    command = [sys.executable, "-m", "ddlbench", "run-point", "--launcher", "srun"]
    return [*command, "--spec", entry.spec, "--out", entry.out]


def describe_allocation(job_id: str, environ: dict[str, str]) -> tuple[SlurmJob, float | None]:
    """The job as the controller describes it (for the records the dispatcher writes) and its EndTime as a
    UNIX time; one `scontrol show job` call, tried again for a short while only (the points wait for it).
    Where it fails, the job from SLURM_* variables and no end time."""
    from ddlbench.launch.patience import Patience
    from ddlbench.launch.slurm import SlurmError, job_from_environment, parse_allocation, parse_oneliner, run_slurm

    try:
        text = run_slurm(["scontrol", "show", "job", "-o", job_id], timeout_s=20, patience=Patience(patience_s=30))
    except SlurmError as exc:
        log.warning("cannot describe allocation %s: %s", job_id, exc)
        return job_from_environment(environ, job_id), None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return parse_allocation(job_id, text), parse_end_time(parse_oneliner(line).get("EndTime", ""))


def parse_end_time(text: str) -> float | None:
    """A job's EndTime as `scontrol show job` prints it (local time, 2026-11-27T10:00:00) as a UNIX time;
    None for Unknown, None or another format (SLURM_TIME_FORMAT)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def allocation_end(environ: dict[str, str], scontrol_end: float | None, *, fallback: float) -> tuple[float, str]:
    """SLURM's end time for this job (UNIX time) and where it came from: SLURM_JOB_END_TIME (Slurm
    23.02 and later set it), else `scontrol show job`'s EndTime, else `fallback`: the plan's time limit
    from the dispatcher's start, later than SLURM's by the batch script's start-up."""
    text = environ.get("SLURM_JOB_END_TIME", "").strip()
    if text.isdigit() and int(text) > 0:
        return float(text), "SLURM_JOB_END_TIME"
    if scontrol_end is not None:
        return scontrol_end, "scontrol show job"
    log.warning("SLURM's end time for the job is not known: counting the plan's time limit from now")
    return fallback, "the plan's time limit from the dispatcher's start"


@dataclass(kw_only=True)
class Dispatcher:
    """The dispatcher's state: which points wait, run and were left unrun, and which nodes are free."""

    plan: dict[str, Any]
    job_id: str
    job: SlurmJob
    hosts: list[str]
    entries: list[Entry]
    environ: dict[str, str]
    began_wall: float
    began: float
    deadline: float  # monotonic: no point starts that would end after it
    end: tuple[float, str]  # SLURM's end time (UNIX) and its source, for the summary
    poll_s: float
    overrun_grace_s: float
    kill_after_s: float
    command: Callable[[Entry], list[str]]
    signum: int | None = None
    signalled: float = 0.0  # monotonic time of the signal

    def __post_init__(self) -> None:
        self.free = list(self.hosts)
        self.waiting = list(self.entries)
        self.running: dict[subprocess.Popen, Entry] = {}
        self.unrun: list[Entry] = []
        self.kill_wait_s = float(self.plan.get("kill_wait_s") or DEFAULT_KILL_WAIT_S)
        # each record as it was before the dispatcher started: a record that differs was written since
        self.before = {entry.point_id: _stamp(Path(entry.out)) for entry in self.entries}
        self.summary_path = Path(self.plan["sweep_dir"]) / "packed" / f"allocation-{self.job_id}.json"

    def stop(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum, self.signalled = signum, time.monotonic()

    def run(self) -> int:
        changed = True  # the summary is written when a point starts or ends, not every poll
        while self.signum is None:
            changed |= self.start_ready()
            if changed and (self.running or self.waiting):
                self.write_summary("running")
                changed = False
            if not self.running:
                break
            time.sleep(self.poll_s)
            if self.signum is not None:
                break  # the runners SLURM stopped with the dispatcher are taken in as stopped, not as ended
            changed |= self.reap()
            self.watch()
        if self.signum is not None:
            return self.shut_down()
        for entry in list(self.waiting):  # nothing runs, so nothing will free nodes for them
            self.leave_unrun(
                entry, f"{NOT_STARTED}it needs {entry.nodes} node(s); the allocation has {len(self.hosts)}"
            )
        self.write_summary("done")
        return 3 if self.unrun else 0

    def start_ready(self) -> bool:
        """Start the waiting points that fit the free nodes, in the plan's order; whether any did."""
        started = False
        now = time.monotonic()
        for entry in list(self.waiting):
            if self.plan.get("serial") and self.running:
                break  # one point at a time: the plan's nodes share what the points measure
            if now + entry.limit_s > self.deadline:  # later starts end later still
                left = max(self.deadline - now, 0.0)
                reason = (
                    f"{NOT_STARTED}the allocation ends too soon for its limit of {entry.limit_s:.0f} s "
                    f"({left:.0f} s left before SLURM's end time less the margin)"
                )
                self.leave_unrun(entry, reason)
                continue
            if entry.node:
                if entry.node not in self.free:
                    continue
                taken = [entry.node]
            else:
                if entry.nodes > len(self.free):
                    continue
                taken = self.free[: entry.nodes]
            for host in taken:
                self.free.remove(host)
            self.waiting.remove(entry)
            self.running[self.start(entry, taken)] = entry
            started = True
        return started

    def start(self, entry: Entry, nodes: list[str]) -> subprocess.Popen:
        Path(entry.log).parent.mkdir(parents=True, exist_ok=True)
        lanes = {other.lane for other in self.running.values()}
        entry.lane = next(lane for lane in range(len(self.running) + 1) if lane not in lanes)
        port = step_port(self.job_id, entry.lane)
        env = {**self.environ, STEP_NODES_VAR: ",".join(nodes), STEP_PORT_VAR: str(port)}
        with open(entry.log, "w") as output:
            process = subprocess.Popen(
                self.command(entry), env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        entry.started = time.monotonic()
        entry.steps = {"nodes": nodes, "start_s": round(entry.started - self.began, 3), "port": port}
        log.info("point %s started on %s", entry.point_id, ",".join(nodes))
        return process

    def reap(self) -> bool:
        """Take in the runners that ended; whether any did."""
        ended = False
        for process, entry in list(self.running.items()):
            code = process.poll()
            if code is None:
                continue
            del self.running[process]
            ended = True
            entry.steps.update(end_s=round(time.monotonic() - self.began, 3), returncode=code)
            self.free.extend(entry.steps["nodes"])
            self.free.sort(key=self.hosts.index)
            log.info("point %s ended (exit %d) on %s", entry.point_id, code, ",".join(entry.steps["nodes"]))
            if self.recorded(entry):
                continue
            if entry.overran_at is not None:
                ran = entry.overran_at - entry.started
                reason = (
                    f"ran past its limit of {entry.limit_s:g} s (launch included) without its runner ending it; "
                    f"the dispatcher stopped the runner after {ran:.0f} s"
                )
                self.write_record(entry, "timeout", reason)
            else:  # a runner that crashed, or that someone stopped: still a record, naming its output
                reason = f"its runner ended with {describe_returncode(code)} without writing a record (see {entry.log})"
                self.write_record(entry, "failed", reason)
        return ended

    def watch(self) -> None:
        """The watchdog: SIGTERM to a runner past its limit and grace, SIGKILL if it is still there later."""
        now = time.monotonic()
        for process, entry in self.running.items():
            if entry.overran_at is None and now - entry.started > entry.limit_s + self.overrun_grace_s:
                log.warning("point %s ran past its limit of %g s: stopping its runner", entry.point_id, entry.limit_s)
                entry.overran_at = now
                entry.steps["overran"] = True
                _signal_group(process.pid, signal.SIGTERM)
            elif entry.overran_at is not None and not entry.killed and now - entry.overran_at > self.kill_after_s:
                log.warning("point %s: its runner did not stop within %g s: killed", entry.point_id, self.kill_after_s)
                entry.killed = True
                _kill(process)

    def shut_down(self) -> int:
        """The allocation is ending: record the points never started, stop the runners in flight at once,
        wait for them together within KillWait, record those whose runners wrote nothing."""
        name = signal.Signals(self.signum).name
        log.warning(
            "allocation stopping (%s): %d point(s) in flight, %d not started; KillWait %g s",
            name,
            len(self.running),
            len(self.waiting),
            self.kill_wait_s,
        )
        elapsed = self.signalled - self.began
        for entry in list(self.waiting):  # first: they need nothing stopped, and KillWait may be short
            self.leave_unrun(entry, f"{NOT_STARTED}the allocation ended ({name} after {elapsed:.0f} s of it)")
        for process in self.running:
            _signal_group(process.pid, signal.SIGTERM)
        end = self.signalled + max(self.kill_wait_s - RECORD_RESERVE_S, 1.0)
        while any(process.poll() is None for process in self.running) and time.monotonic() < end:
            time.sleep(0.05)
        late = [process for process in self.running if process.poll() is None]
        for process in late:
            log.warning("point %s: its runner did not stop in time: killed", self.running[process].point_id)
            _kill(process)
        end = time.monotonic() + 0.5
        while any(process.poll() is None for process in late) and time.monotonic() < end:
            time.sleep(0.05)
        for process, entry in self.running.items():
            entry.steps.update(end_s=round(time.monotonic() - self.began, 3), returncode=process.poll(), stopped=True)
            if not self.recorded(entry):
                ran = time.monotonic() - entry.started
                reason = f"{STOPPED} ({name}) {ran:.0f} s into the point's run; its runner wrote no record"
                self.leave_unrun(entry, reason)
        self.write_summary("stopped")
        return 128 + self.signum

    def recorded(self, entry: Entry) -> bool:
        """Whether the point's record was written since the dispatcher started (by its runner)."""
        now = _stamp(Path(entry.out))
        return now is not None and now != self.before[entry.point_id]

    def leave_unrun(self, entry: Entry, reason: str) -> None:
        if entry in self.waiting:
            self.waiting.remove(entry)
        self.unrun.append(entry)
        log.warning("point %s %s", entry.point_id, reason)
        self.write_record(entry, UNRUN_STATUS, reason)

    def write_record(self, entry: Entry, status: str, reason: str) -> None:
        """The point's record, written by the dispatcher: never over one written since it started; an
        older one is kept aside first. A failure to write is logged, not raised: the others still get theirs."""
        from ddlbench.launch.runner import write_unfinished_record

        out = Path(entry.out)
        try:
            if self.recorded(entry):
                return
            if self.before[entry.point_id] is not None:
                _keep_previous(out)
            start_time = _iso(self.began_wall + entry.started - self.began) if entry.started else None
            point = Point.from_dict(json.loads(entry.spec))
            write_unfinished_record(
                point, out=out, status=status, reason=reason, allocation=self.job, start_time=start_time
            )
        except (OSError, ValueError, TypeError, DdlbenchError) as exc:
            log.error("point %s: cannot write its record %s: %s", entry.point_id, out, exc)

    def write_summary(self, state: str) -> None:
        _write_summary(
            self.summary_path,
            job_id=self.job_id,
            hosts=self.hosts,
            began_wall=self.began_wall,
            began=self.began,
            entries=self.entries,
            unrun=self.unrun,
            state=state,
            end=self.end,
        )


def _stamp(path: Path) -> tuple[int, int] | None:
    """What tells one version of a file from another (records are replaced by rename: a new inode)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _keep_previous(path: Path) -> None:
    """Copy an earlier record of the point aside before the dispatcher's replaces it (as `ddlbench rerun`)."""
    folder = path.parent / "previous"
    folder.mkdir(exist_ok=True)
    number = len(list(folder.glob("record-*.json"))) + 1
    shutil.copy2(path, folder / f"record-{number}.json")


def _iso(unix: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL a runner's process group; its launcher (srun, in a session of its own) gets SIGTERM, on
    which it cancels its step rather than leaving it to run on."""
    for child in _descendants(process.pid):
        with contextlib.suppress(OSError):
            pgid = os.getpgid(child)
            if pgid != process.pid:
                _signal_group(pgid, signal.SIGTERM)
    _signal_group(process.pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, from /proc (Linux); [] where it cannot be read."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command's name, which may hold spaces
        parents.setdefault(ppid, []).append(int(name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _write_summary(
    path: Path,
    *,
    job_id: str,
    hosts: list[str],
    began_wall: float,
    began: float,
    entries: list[Entry],
    unrun: list[Entry],
    state: str,
    end: tuple[float, str],
) -> None:
    """The allocation as it ran so far: busy node-seconds = Σ step nodes × (end − start) of the points,
    allocated = nodes × seconds since the dispatcher started (the batch script's start-up before it is
    not counted)."""
    elapsed = time.monotonic() - began
    points = []
    busy = 0.0
    for entry in entries:
        if not entry.steps:
            continue
        stop = entry.steps.get("end_s", elapsed)
        busy += len(entry.steps["nodes"]) * (stop - entry.steps["start_s"])
        points.append({"point_id": entry.point_id, **entry.steps})
    allocated = len(hosts) * elapsed
    summary = {
        "job_id": job_id,
        "state": state,
        "nodes": hosts,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began_wall)),
        "ends": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end[0])),  # SLURM's end time for the job
        "ends_from": end[1],
        "elapsed_s": round(elapsed, 3),
        "allocated_node_s": round(allocated, 3),
        "busy_node_s": round(busy, 3),
        "idle_share": round(1 - busy / allocated, 4) if allocated > 0 else None,
        "points": points,
        "not_started": [entry.point_id for entry in unrun if not entry.steps],
        "stopped": [entry.point_id for entry in unrun if entry.steps],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(summary, indent=1) + "\n")
