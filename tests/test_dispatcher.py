"""The packed allocation's dispatcher (ddlbench.launch.allocation) as a real process under a fake SLURM:
`scontrol` answers from the environment, each point's runner is a small stand-in (or the real
`run-point` over a fake `srun`). It is sent SIGTERM as SLURM would, and its records are read back.
In an allocation already held (ddlbench.launch.inside), a sweep's points are planned into it first and
run by the same dispatcher."""

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

from ddlbench.config import load_sweep_config
from ddlbench.launch.allocation import allocation_end, left_unrun, parse_end_time
from ddlbench.launch.inside import inside_targets, run_inside
from ddlbench.launch.packed import Request, tasks_for, write_allocation
from ddlbench.launch.packing import pack, priority
from ddlbench.records import read_record, record_path
from ddlbench.sweep import expand_sweep

FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") echo "$3" | tr ',' '\\n' ;;
  "show job") echo "JobId=$4 JobName=packed Partition=cpu NumNodes=2 NumCPUs=2 NodeList=n[1-2] EndTime=$FAKE_END" ;;
  "show config") echo "KillWait                = 7 sec" ;;
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


def test_a_runner_that_dies_without_a_record_gives_its_nodes_back(tmp_path, fake_slurm):
    # one node: the crashed point's record says so, and the next point runs on the node it held
    plan, (crash, done) = _plan(tmp_path, [(CRASH, 30), (DONE, 30)])
    dispatcher = _dispatch(tmp_path, {**fake_slurm, "SLURM_JOB_NODELIST": "n1"}, plan)
    assert dispatcher.wait(timeout=30) == 0, (tmp_path / "dispatcher.log").read_text()
    assert read_record(record_path(tmp_path / "sweep", crash)).status == "failed"
    assert json.loads(record_path(tmp_path / "sweep", done).read_text()) == {"by": "runner"}
    ran = {p["point_id"]: p for p in _summary(tmp_path)["points"]}
    assert ran[crash]["nodes"] == ran[done]["nodes"] == ["n1"] and ran[done]["start_s"] >= ran[crash]["end_s"]


# a sweep's point run in place: writes its record, notes when and on which nodes it ran
INSIDE_RUNNER = """
import json, os, sys, time
point_id, out, starts = sys.argv[1:4]
began = time.time()
time.sleep(0.3)
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out + ".tmp", "w") as f:
    f.write('{"by": "runner"}')
os.replace(out + ".tmp", out)
with open(starts, "a") as f:
    f.write(json.dumps([point_id, os.environ["DDLBENCH_STEP_NODES"], began, time.time()]) + "\\n")
"""


def _sweep(write_sweep, **overrides):
    axes = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], timeout_s=30, warmup_steps=1, steps=1)
    return load_sweep_config(write_sweep(**(axes | overrides)))


def _run_inside(tmp_path, fake_slurm, monkeypatch, config, *, ends_in_s: float, out: Path) -> tuple[int, list]:
    """`run-packed --configfile` in a 2-node allocation that SLURM ends in `ends_in_s`; what each runner noted."""
    monkeypatch.setenv("PATH", fake_slurm["PATH"])  # scontrol is asked as a subprocess
    monkeypatch.setenv("FAKE_END", "Unknown")
    (tmp_path / "inside_runner.py").write_text(INSIDE_RUNNER)
    starts = tmp_path / "starts"

    def command(entry) -> list[str]:
        return [sys.executable, str(tmp_path / "inside_runner.py"), entry.point_id, entry.out, str(starts)]

    environ = {**fake_slurm, "SLURM_JOB_END_TIME": str(int(time.time() + ends_in_s))}
    code = run_inside(config, margin_s=0, out=out, environ=environ, command=command, poll_s=0.05)
    return code, [json.loads(line) for line in starts.read_text().splitlines()] if starts.exists() else []


def test_in_an_allocation_held_the_points_without_a_record_are_packed_by_the_same_rule_and_run(
    tmp_path, fake_slurm, monkeypatch, write_sweep
):
    config = _sweep(write_sweep, nodes=[1, 2], batch_size=[8, 16])
    points = expand_sweep(config).points
    measured = next(p for p in points if p.nodes == 1)  # measured already: not run again
    record = record_path(config.sweep_dir, measured.point_id)
    record.parent.mkdir(parents=True)
    record.write_text('{"by": "an earlier run"}')
    missing = [p for p in points if p is not measured]
    code, ran = _run_inside(tmp_path, fake_slurm, monkeypatch, config, ends_in_s=3600, out=tmp_path / "out.json")
    assert code == 0
    assert json.loads(record.read_text()) == {"by": "an earlier run"}
    assert all(json.loads(record_path(config.sweep_dir, p.point_id).read_text()) == {"by": "runner"} for p in missing)
    # widest first, then longest, then by id (packing.priority): both 2-node points, one after the other,
    # then the 1-node one, each a step on nodes of its own
    order = [task.key for task in sorted(tasks_for(missing), key=priority)]
    assert [point_id for point_id, *_ in sorted(ran, key=lambda run: run[2])] == order
    by_id = {point_id: (nodes, began, ended) for point_id, nodes, began, ended in ran}
    assert [by_id[point_id][0] for point_id in order] == ["n1,n2", "n1,n2", "n1"]
    assert by_id[order[1]][1] >= by_id[order[0]][2] and by_id[order[2]][1] >= by_id[order[1]][2]
    # the plan is the one submit --pack writes for the same points, in the format it writes
    folder = Path(config.sweep_dir).resolve() / "packed"
    plan = json.loads((folder / "inside-4242.plan.json").read_text())
    assert [entry["point_id"] for entry in plan["points"]] == order
    assert plan["kill_wait_s"] == 7 and plan["margin_s"] == 0 and plan["serial"] is False
    (allocation,) = pack(tasks_for(missing), 2).allocations
    request = Request(options=(), time_limit_s=600, margin_s=0)
    write_allocation(allocation, request, {p.point_id: p for p in missing}, sweep_dir=config.sweep_dir, stamp="t")
    submitted = json.loads((folder / "t-0.plan.json").read_text())
    assert set(plan) == set(submitted) and plan["points"] == submitted["points"]
    # the dispatcher's summary, and its copy where Snakemake waits for it
    summary = json.loads((folder / "allocation-4242.json").read_text())
    assert summary["state"] == "done" and {p["point_id"] for p in summary["points"]} == set(order)
    assert json.loads((tmp_path / "out.json").read_text()) == summary
    assert json.loads((Path(config.sweep_dir) / "slurm-jobs.json").read_text()) == {p: ["4242"] for p in order}
    # every point has a record now: nothing to run
    assert _run_inside(tmp_path, fake_slurm, monkeypatch, config, ends_in_s=3600, out=tmp_path / "again.json")[0] == 0
    assert len((tmp_path / "starts").read_text().splitlines()) == 3


def test_in_an_allocation_that_ends_too_soon_each_point_gets_a_not_started_record(
    tmp_path, fake_slurm, monkeypatch, write_sweep
):
    config = _sweep(write_sweep, nodes=[1], batch_size=[8, 16])
    # a point may run 60 s (30 s of timeout, 30 s of launch); SLURM ends the job in 40
    code, ran = _run_inside(tmp_path, fake_slurm, monkeypatch, config, ends_in_s=40, out=tmp_path / "out.json")
    assert code == 3 and ran == []
    for point in expand_sweep(config).points:
        record = read_record(record_path(config.sweep_dir, point.point_id))
        assert record.status == "timeout" and left_unrun(record.reason)
        assert record.reason.startswith("not started: the allocation ends too soon for its limit of 60 s")
    assert json.loads((tmp_path / "out.json").read_text())["state"] == "done"


def test_snakemake_in_an_allocation_names_a_new_output_whenever_a_point_is_missing(tmp_path):
    ids = ["p1", "p2"]
    first = inside_targets(tmp_path, ids)
    assert first.output and first.runs == (first.output,) and first.log.endswith(Path(first.output).stem + ".log")
    for point_id in ids:  # run-packed ran: every record, and its output
        record_path(tmp_path, point_id).parent.mkdir(parents=True)
        record_path(tmp_path, point_id).write_text("{}")
    Path(first.output).parent.mkdir()
    Path(first.output).write_text("{}")
    (tmp_path / "packed" / "inside-4242.plan.json").write_text("{}")  # a plan is not an output
    done = inside_targets(tmp_path, ids)
    assert done.output is None and done.runs == first.runs  # the report's inputs as before: nothing to do
    record_path(tmp_path, "p2").unlink()
    second = inside_targets(tmp_path, ids)
    assert second.output not in (None, first.output) and second.runs == (first.output, second.output)
    Path(second.output).write_text("{}")
    record_path(tmp_path, "p2").write_text("{}")
    record_path(tmp_path, "p2").unlink()  # the same point missing again: a new name still, so it runs
    third = inside_targets(tmp_path, ids)
    assert third.output not in (first.output, second.output) and len(third.runs) == 3


def test_run_packed_with_a_sweep_runs_inside_an_allocation_only(write_sweep):
    env = {**os.environ, "SLURM_JOB_ID": ""}
    axes = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1], batch_size=[8])
    command = [sys.executable, "-m", "ddlbench", "run-packed", "--configfile", str(write_sweep(**axes))]
    refused = subprocess.run(command, capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "runs inside a SLURM allocation (salloc, sbatch)" in refused.stderr
    both = subprocess.run([*command, "--plan", "p.json"], capture_output=True, text=True, env=env)
    assert both.returncode == 2 and "give either --plan, or a sweep" in both.stderr
