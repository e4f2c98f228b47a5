"""The packed allocation's dispatcher (ddlbench.launch.allocation) as a real process under a fake SLURM:
`scontrol` answers from the environment, each point's runner is a small stand-in (or the real
`run-point` over a fake `srun`). It is sent SIGTERM as SLURM would, and its records are read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_point

from ddlbench.launch.allocation import allocation_end, left_unrun, parse_end_time
from ddlbench.records import read_record, record_path

FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") echo "$3" | tr ',' '\\n' ;;
  "show job") echo "JobId=$4 JobName=packed Partition=cpu NumNodes=2 NumCPUs=2 NodeList=n[1-2] EndTime=$FAKE_END" ;;
  *) echo "scontrol: $*: not faked" >&2; exit 1 ;;
esac
"""

# a point's stand-in runner: `done` points write their record and end, `hang` points sleep, `stubborn`
# points sleep and ignore SIGTERM; each notes its pid
RUNNER = """
import os, signal, sys, time
point_id, out, pids = sys.argv[1:4]
with open(pids, "a") as f:
    f.write(f"{os.getpid()}\\n")
if "-b1-" in point_id:  # done
    time.sleep(0.3)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        f.write('{"by": "runner"}')
    os.replace(out + ".tmp", out)
    sys.exit(0)
if "-b5-" in point_id:  # crashes without a record
    sys.exit(2)
if "-b2-" in point_id:  # stubborn
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
"""

DISPATCH = """
import json, logging, sys
from pathlib import Path
from ddlbench.launch.allocation import run_allocation
plan, runner, pids, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
command = lambda entry: [sys.executable, runner, entry.point_id, entry.out, pids]
sys.exit(run_allocation(Path(plan), command=command, poll_s=0.05, **options))
"""

DONE, STUBBORN, HANG, CRASH = 1, 2, 3, 5  # batch sizes that tell the stand-in runner what to do


@pytest.fixture
def fake_slurm(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "runner.py").write_text(RUNNER)
    (tmp_path / "dispatch.py").write_text(DISPATCH)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n1,n2",
        "FAKE_END": "Unknown",
    }


def _plan(tmp_path: Path, points: list[tuple[int, float]], **extra) -> tuple[Path, list[str]]:
    """A plan of 1-node points (batch size tells the stand-in what to do, limit_s) in that order."""
    sweep_dir = tmp_path / "sweep"
    entries = []
    for repetition, (batch, limit_s) in enumerate(points):
        point = make_point(batch_size=batch, repetition=repetition)
        entries.append(
            {
                "point_id": point.point_id,
                "spec": point.to_json(),
                "out": str(record_path(sweep_dir, point.point_id)),
                "log": str(sweep_dir / "logs" / f"{point.point_id}.log"),
                "nodes": 1,
                "node": "",
                "limit_s": limit_s,
            }
        )
    plan = {"sweep_dir": str(sweep_dir), "time_limit_s": 3600, "margin_s": 0, "serial": False, "points": entries}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan | extra))
    return path, [entry["point_id"] for entry in entries]


def _dispatch(tmp_path: Path, env: dict[str, str], plan: Path, **options) -> subprocess.Popen:
    script, runner, pids = tmp_path / "dispatch.py", tmp_path / "runner.py", tmp_path / "pids"
    command = [sys.executable, str(script), str(plan), str(runner), str(pids), json.dumps(options)]
    log = open(tmp_path / "dispatcher.log", "w")  # noqa: SIM115 (the process holds it)
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _summary(tmp_path: Path) -> dict:
    path = tmp_path / "sweep" / "packed" / "allocation-4242.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _wait(predicate, timeout_s: float = 30.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else ""
    return state != "Z"


def test_on_sigterm_every_point_is_stopped_at_once_and_every_unrun_point_has_a_record(tmp_path, fake_slurm):
    # n1: done, then stubborn; n2: hang; two more wait for nodes. One of them has a record from an earlier run
    plan, ids = _plan(tmp_path, [(DONE, 60), (HANG, 60), (STUBBORN, 60), (HANG, 60), (DONE, 60)], kill_wait_s=4)
    done, hang, stubborn, waiting, earlier = ids
    old = record_path(tmp_path / "sweep", earlier)
    old.parent.mkdir(parents=True)
    old.write_text('{"by": "an earlier run"}')
    dispatcher = _dispatch(tmp_path, fake_slurm, plan)
    try:
        _wait(lambda: {p["point_id"] for p in _summary(tmp_path).get("points", [])} == {done, hang, stubborn})
        _wait(lambda: len((tmp_path / "pids").read_text().split()) == 3)  # every runner is up
        time.sleep(0.3)
        began = time.monotonic()
        dispatcher.send_signal(signal.SIGTERM)
        assert dispatcher.wait(timeout=10) == 128 + signal.SIGTERM
        took = time.monotonic() - began
    finally:
        dispatcher.kill()
    assert took < 4, f"the dispatcher took {took:.1f} s, more than KillWait"  # the stubborn runner was killed
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not _alive(pid)
    assert json.loads(record_path(tmp_path / "sweep", done).read_text()) == {"by": "runner"}  # the runner's stays
    records = {point_id: read_record(record_path(tmp_path / "sweep", point_id)) for point_id in ids[1:]}
    for point_id in (hang, stubborn):
        assert records[point_id].status == "timeout"
        assert records[point_id].reason.startswith("stopped: the allocation ended (SIGTERM)")
    for point_id in (waiting, earlier):
        assert records[point_id].status == "timeout"
        assert records[point_id].reason.startswith("not started: the allocation ended (SIGTERM")
        assert records[point_id].provenance.slurm.job_id == "4242"
    assert all(left_unrun(record.reason) for record in records.values())
    kept = old.parent / "previous" / "record-1.json"
    assert json.loads(kept.read_text()) == {"by": "an earlier run"}  # measured data is never lost
    summary = _summary(tmp_path)
    assert summary["state"] == "stopped"
    assert sorted(summary["not_started"]) == sorted([waiting, earlier])
    assert sorted(summary["stopped"]) == sorted([hang, stubborn])


def test_the_watchdog_stops_a_point_that_overruns_its_limit(tmp_path, fake_slurm):
    # a runner that ends on SIGTERM and one that must be killed, both past a 1 s limit; one is fine, one crashes
    plan, ids = _plan(tmp_path, [(HANG, 1), (STUBBORN, 1), (DONE, 30), (CRASH, 30)])
    hang, stubborn, done, crash = ids
    dispatcher = _dispatch(tmp_path, fake_slurm, plan, overrun_grace_s=0.5, kill_after_s=1.0)
    assert dispatcher.wait(timeout=30) == 0, (tmp_path / "dispatcher.log").read_text()
    for point_id in (hang, stubborn):
        record = read_record(record_path(tmp_path / "sweep", point_id))
        assert record.status == "timeout"
        assert record.reason.startswith("ran past its limit of 1 s")
        assert not left_unrun(record.reason)  # it ran: a rerun needs more time, not another allocation
    assert json.loads(record_path(tmp_path / "sweep", done).read_text()) == {"by": "runner"}
    crashed = read_record(record_path(tmp_path / "sweep", crash))
    assert crashed.status == "failed"
    assert crashed.reason.startswith("its runner ended with exit code 2 without writing a record (see ")
    summary = {p["point_id"]: p for p in _summary(tmp_path)["points"]}
    assert summary[hang]["overran"] and summary[stubborn]["overran"]
    assert summary[stubborn]["returncode"] == -signal.SIGKILL
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not _alive(pid)


def test_points_start_only_while_their_limit_fits_before_slurms_end_time(tmp_path, fake_slurm):
    # SLURM ends the job in 60 s, though the plan's time limit (from the dispatcher's start) is an hour
    end = time.time() + 60
    fake_slurm["FAKE_END"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    plan, ids = _plan(tmp_path, [(DONE, 30), (DONE, 90), (DONE, 30)])
    dispatcher = _dispatch(tmp_path, fake_slurm, plan)
    assert dispatcher.wait(timeout=30) == 3, (tmp_path / "dispatcher.log").read_text()
    first, too_long, third = (record_path(tmp_path / "sweep", point_id) for point_id in ids)
    assert json.loads(first.read_text()) == json.loads(third.read_text()) == {"by": "runner"}
    record = read_record(too_long)
    assert record.status == "timeout" and left_unrun(record.reason)
    assert record.reason.startswith("not started: the allocation ends too soon for its limit of 90 s")
    summary = _summary(tmp_path)
    assert summary["state"] == "done" and summary["not_started"] == [ids[1]]
    assert summary["ends_from"] == "scontrol show job"
    assert abs(time.mktime(time.strptime(summary["ends"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone - end) <= 1


def test_slurms_end_time_comes_from_the_environment_then_scontrol_then_the_plan():
    assert allocation_end({"SLURM_JOB_END_TIME": "1800000000"}, 1.0, fallback=2.0) == (
        1800000000.0,
        "SLURM_JOB_END_TIME",
    )
    assert allocation_end({}, 1.0, fallback=2.0) == (1.0, "scontrol show job")
    assert allocation_end({"SLURM_JOB_END_TIME": "0"}, None, fallback=2.0)[0] == 2.0
    assert parse_end_time("2026-11-27T10:00:00") == time.mktime((2026, 11, 27, 10, 0, 0, 0, 0, -1))
    assert parse_end_time("Unknown") is None


def test_the_real_runner_stopped_by_sigterm_leaves_its_record_to_the_dispatcher(tmp_path, fake_slurm):
    """`ddlbench run-packed` as the batch script runs it: real runners (`run-point --launcher srun`) over a
    fake srun that hangs; SIGTERM reaches the dispatcher alone, as the time limit's `--signal=B:TERM` does."""
    srun = tmp_path / "bin" / "srun"
    srun.write_text('#!/bin/bash\necho "srun: launching StepId=4242.0 on host n1" >&2\nexec sleep 600\n')
    srun.chmod(0o755)
    plan, ids = _plan(tmp_path, [(HANG, 60), (HANG, 60), (HANG, 60)], kill_wait_s=10)
    command = [sys.executable, "-m", "ddlbench", "run-packed", "--plan", str(plan)]
    with open(tmp_path / "dispatcher.log", "w") as log:
        dispatcher = subprocess.Popen(command, env=fake_slurm, stdout=log, stderr=subprocess.STDOUT)
    try:
        logs = [tmp_path / "sweep" / "logs" / f"{point_id}.log" for point_id in ids[:2]]
        _wait(lambda: all(p.exists() and "ranks via srun" in p.read_text() for p in logs), timeout_s=60)
        time.sleep(0.5)
        dispatcher.send_signal(signal.SIGTERM)
        assert dispatcher.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        dispatcher.kill()
    records = [read_record(record_path(tmp_path / "sweep", point_id)) for point_id in ids]
    assert [record.reason.split(" (")[0] for record in records] == [
        "stopped: the allocation ended",
        "stopped: the allocation ended",
        "not started: the allocation ended",
    ]
    assert "no record written" in logs[0].read_text()  # the runner's own word: interrupted
    leftover = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True)
    assert not [pid for pid in leftover.stdout.split() if _alive(int(pid)) and _child_of_test(int(pid), tmp_path)]


def _child_of_test(pid: int, tmp_path: Path) -> bool:
    try:
        return str(tmp_path) in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return False
