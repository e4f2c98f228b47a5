"""Progress on long work (ddlbench.launch.progress, ddlbench.launch.disk_status): the counts, the estimate
of the time left with and without predictions, the terminal and plain outputs, the watch loops, and the
hook of `ddlbench submit`'s wait. No SLURM, no terminal: a fake queue, a StringIO and an injected clock."""

from __future__ import annotations

import io
import json
import os
import time
from types import SimpleNamespace

import pytest

from ddlbench.config import load_sweep_config
from ddlbench.launch.disk_status import adaptive_files, states_on_disk, sweep_files
from ddlbench.launch.progress import (
    CLEAR_TO_END,
    Counts,
    Progress,
    Timeline,
    predicted_durations,
    queued_states,
    sweep_states,
    watch,
    watching,
)
from ddlbench.launch.slurm import QueuedJob
from ddlbench.launch.status import PointStatus
from ddlbench.launch.submission import wait_for
from ddlbench.launch.waves import QueueWatch
from ddlbench.records import record_path
from ddlbench.sweep import expand_sweep
from tests.conftest import REPO

SWEEP = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1], ranks_per_node=[1],
             warmup_steps=1, steps=20, timeout_s=120)  # fmt: skip


def status(point_id: str, state: str) -> PointStatus:
    return PointStatus(point_id=point_id, state=state, reason=None, job_ids=())


def plain(**kw) -> tuple[Progress, io.StringIO]:
    stream = io.StringIO()
    return Progress(title="sweep 'x'", stream=stream, isatty=False, **kw), stream


def tty(**kw) -> tuple[Progress, io.StringIO]:
    stream = io.StringIO()
    return Progress(title="sweep 'x'", stream=stream, isatty=True, width=200, **kw), stream


def test_counts_group_every_non_ok_status_as_failed_by_cause_and_keep_the_waiting_apart():
    states = ["ok", "ok", "ok", "failed", "oom", "oom", "timeout", "unreadable", "running", "pending", "not started"]
    counts = Counts.of([status(f"p{i}", state) for i, state in enumerate(states)])
    assert (counts.ok, counts.running, counts.pending, counts.not_started) == (3, 1, 1, 1)
    assert counts.failed == (("failed", 1), ("oom", 2), ("timeout", 1), ("unreadable", 1))
    assert (counts.failed_total, counts.ended, counts.left, counts.total) == (5, 8, 3, 11)
    assert counts.text() == (
        "11 points: 3 ok, 1 failed, 2 oom, 1 timeout, 1 unreadable, 1 running, 1 pending, 1 not started"
    )
    # a mapping counts the same; points up to `total` it does not name, and rerun's `missing`, are not started
    assert Counts.of({"a": "ok", "b": "missing"}, total=5) == Counts(ok=1, not_started=4)


def test_the_predicted_estimate_counts_running_points_at_their_rest_over_the_points_running():
    timeline = Timeline({"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 50.0})
    first = {"a": "running", "b": "running", "c": "not started", "d": "pending", "e": "ok"}
    timeline.observe(first, now=0.0)
    later = dict(first)
    timeline.observe(later, now=30.0)
    estimate = timeline.estimate(later, Counts.of(later), now=30.0)
    # (70 + 70 + 100 + 100) s of work left over 2 points running
    assert estimate.seconds == pytest.approx(170.0)
    assert estimate.text() == "~3 min left (predicted)"
    # the last point running past most of its prediction: never less than its own rest
    last = {"a": "running", "b": "ok", "c": "ok", "d": "ok", "e": "ok"}
    timeline.observe(last, now=90.0)
    assert timeline.estimate(last, Counts.of(last), now=90.0).seconds == pytest.approx(10.0)


def test_without_predictions_the_estimate_is_the_observed_rate_of_ending_once_two_points_ended():
    clock = iter([0.0, 60.0, 120.0])
    progress, _ = plain(clock=lambda: next(clock))
    points = [f"p{i}" for i in range(10)]
    progress.update({p: "ok" if p == "p0" else "not started" for p in points})  # p0 ended before: not counted
    progress.update({p: "ok" if p in ("p0", "p1") else "running" if p == "p2" else "not started" for p in points})
    assert "time left unknown (1 point(s) ended so far, 2 needed; no predictions)" in progress.line
    progress.update({p: "ok" if p in ("p0", "p1", "p2") else "not started" for p in points})
    # 2 ended in 120 s, 7 left: 7 ÷ (2 / 120 s) = 420 s
    assert progress.line.endswith("; ~7 min left (from 2 points ended)")
    assert progress.line.startswith("sweep 'x': 10 points: 3 ok, 7 not started;")


def test_predictions_missing_for_a_point_left_fall_back_to_the_rate():
    progress, _ = plain(predicted_s={"a": 10.0}, clock=lambda: 0.0)
    progress.update({"a": "running", "b": "pending"})
    assert "time left unknown (0 point(s) ended so far, 2 needed; some points not predicted)" in progress.line


def test_plain_output_writes_a_line_only_when_the_counts_change_or_after_every_s():
    now = [0.0]
    progress, stream = plain(clock=lambda: now[0], every_s=300.0)
    states = {"a": "running", "b": "pending", "c": "pending"}
    for t in (0.0, 10.0, 20.0):  # the same counts three times: one line
        now[0] = t
        progress.update(states)
    assert stream.getvalue().count("\n") == 1
    now[0] = 30.0
    progress.update(states | {"a": "ok", "b": "running"})
    now[0] = 40.0
    progress.update(states | {"a": "ok", "b": "running"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("sweep 'x': 3 points: 1 ok, 1 running, 1 pending;")
    now[0] = 331.0  # nothing changed for every_s: a line to show it is alive
    progress.update(states | {"a": "ok", "b": "running"})
    assert len(stream.getvalue().splitlines()) == 3
    assert "\r" not in stream.getvalue() and CLEAR_TO_END not in stream.getvalue()
    progress.close()  # nothing new: no line
    assert len(stream.getvalue().splitlines()) == 3


def test_a_terminal_line_is_redrawn_in_place_at_most_every_redraw_s_and_ends_when_all_ended():
    now = [0.0]
    progress, stream = tty(clock=lambda: now[0], redraw_s=0.25, predicted_s={"a": 100.0, "b": 100.0})
    progress.update({"a": "running", "b": "pending"})
    first = stream.getvalue()
    assert first.startswith("\rsweep 'x': 2 points: 1 running, 1 pending; ~3 min left (predicted)")
    assert first.endswith(CLEAR_TO_END) and "\n" not in first
    now[0] = 0.1  # the estimate changed, but within redraw_s of the last draw: not drawn
    progress.update({"a": "running", "b": "pending"})
    assert stream.getvalue() == first
    now[0] = 60.0
    progress.update({"a": "running", "b": "pending"})
    assert stream.getvalue().count("\r") == 2 and "\n" not in stream.getvalue()
    now[0] = 60.5  # past redraw_s, but the line reads the same (~2 min left): not drawn again
    progress.update({"a": "running", "b": "pending"})
    assert stream.getvalue().count("\r") == 2
    now[0] = 60.1  # a count changed: drawn at once; nothing left: the line ends
    progress.update({"a": "ok", "b": "oom"})
    assert stream.getvalue().endswith("\rsweep 'x': 2 points: 1 ok, 1 oom; all ended" + CLEAR_TO_END + "\n")
    drawn = stream.getvalue()
    progress.close()
    assert stream.getvalue() == drawn  # the last line stands already


def test_a_terminal_line_is_cut_to_the_width_so_that_it_can_be_redrawn():
    progress, stream = tty(clock=lambda: 0.0)
    progress.width = 30
    progress.update({"a": "running"})
    drawn = stream.getvalue()[1 : -len(CLEAR_TO_END)]
    assert len(drawn) == 29 and drawn.endswith("…")


def test_watch_stops_when_every_point_ended_and_leaves_the_last_line():
    looks = iter([
        {"a": "pending", "b": "pending"}, {"a": "running", "b": "pending"}, {"a": "ok", "b": "running"},
        {"a": "ok", "b": "timeout"},
    ])  # fmt: skip
    naps = []
    progress, stream = plain(clock=lambda: float(len(naps)))
    counts = watch(lambda: next(looks), progress=progress, interval_s=7, sleep=naps.append)
    assert naps == [7, 7, 7]  # four looks, a pause between each two
    assert counts == Counts(ok=1, failed=(("timeout", 1),))
    assert stream.getvalue().splitlines()[-1] == "sweep 'x': 2 points: 1 ok, 1 timeout; all ended"


def test_watch_stops_when_nothing_runs_or_waits_in_the_queue_for_idle_polls_looks():
    progress, stream = plain(clock=lambda: 0.0)
    looks = []

    def poll():
        looks.append(1)
        assert len(looks) < 10, "watch did not stop"
        return {"a": "ok", "b": "not started"}  # the workflow stopped: b will never start

    watch(poll, progress=progress, interval_s=1, idle_polls=3, sleep=lambda s: None)
    assert len(looks) == 3
    assert stream.getvalue().splitlines()[-1].endswith("none running or queued at 3 looks in a row: stopped watching")


def test_watch_leaves_a_clean_last_line_on_ctrl_c():
    def poll():
        if looked:
            raise KeyboardInterrupt
        looked.append(1)
        return {"a": "running"}

    looked: list[int] = []
    progress, stream = tty(clock=lambda: 0.0)
    watch(poll, progress=progress, interval_s=1, sleep=lambda s: None)
    assert stream.getvalue().endswith("stopped watching (Ctrl-C); the work goes on" + CLEAR_TO_END + "\n")


def test_watching_reports_from_a_thread_while_the_work_runs_and_looks_once_more_at_the_end():
    states = {"a": "running", "b": "not started"}
    progress, stream = plain()
    with watching(lambda: dict(states), progress=progress, interval_s=0.01):
        deadline = time.monotonic() + 5
        while progress.counts is None and time.monotonic() < deadline:
            time.sleep(0.01)
        states.update(a="ok", b="ok")  # the work ends just before the body does
    assert stream.getvalue().splitlines()[-1] == "sweep 'x': 2 points: 2 ok; all ended"
    assert stream.getvalue().splitlines()[0].startswith("sweep 'x': 2 points: 1 running, 1 not started;")


def test_wait_for_hands_every_polls_queue_to_on_poll():
    def job(job_id: str, state: str) -> QueuedJob:
        return QueuedJob(job_id=job_id, state=state, name="", comment="")

    queues = [[job("7_0", "RUNNING"), job("7_1", "PENDING")], [job("7_1", "RUNNING")], []]
    seen = []
    jobs = [SimpleNamespace(job_id=job_id, result=lambda: "ok") for job_id in ("7_0", "7_1")]
    polls = iter(queues)
    watch_ = QueueWatch(query=lambda: next(polls), sleep=lambda s: None)
    wait_for(jobs, watch=watch_, on_poll=seen.append)
    assert seen == queues


def test_sweep_states_read_the_queue_of_the_wait_and_the_records(write_sweep):
    config = load_sweep_config(write_sweep(**SWEEP, batch_size=[8, 16, 32]))
    plan = expand_sweep(config)
    a, b, _ = (point.point_id for point in plan.points)
    path = record_path(config.sweep_dir, a)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "status": "ok"}))  # unreadable as a full record
    queue = [QueuedJob(job_id="9", state="RUNNING", name="", comment=f"rule_run_point_wildcards_{b}")]
    states = sweep_states(plan, sweep_dir=config.sweep_dir, only={a, b})(queue)
    assert {s.point_id: s.state for s in states} == {a: "unreadable", b: "running"}  # c left out


def test_states_on_disk_tell_records_running_logs_and_earlier_records_apart(tmp_path):
    ids = ["new", "running", "rerun", "old", "none", "broken"]
    records, logs = sweep_files(tmp_path, ids)
    began = time.time()
    before, after = began - 100, began + 1

    def write(path, text, at):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (at, at))

    write(records["new"], json.dumps({"status": "oom"}), after)
    write(logs["new"], "", after)
    write(logs["running"], "", after)
    write(records["rerun"], json.dumps({"status": "failed"}), before)  # run again: its log is new
    write(logs["rerun"], "", after)
    write(records["old"], json.dumps({"status": "ok"}), before)
    write(logs["old"], "", before)
    write(records["broken"], "{", after)
    states = states_on_disk(records, logs, since=began)
    assert states == {"new": "oom", "running": "running", "rerun": "running", "old": "ok", "none": "not started"} | {
        "broken": "unreadable"
    }
    assert states_on_disk(records, logs, since=began, redo=True)["old"] == "not started"  # it runs again
    assert states_on_disk(records, logs)["rerun"] == "failed"  # no `since`: records only


def test_adaptive_files_follow_the_rounds_planned_so_far(tmp_path):
    rounds = tmp_path / "adaptive" / "rounds"
    rounds.mkdir(parents=True)
    (rounds / "0.json").write_text(json.dumps({"launches": [{"id": "r0-l0", "points": ["p1", "p2"]}]}))
    (rounds / "1.json").write_text("{")  # being written
    records, logs = adaptive_files(tmp_path)
    assert records == {p: tmp_path / "adaptive" / "points" / p / "record.json" for p in ("p1", "p2")}
    assert logs["p2"] == tmp_path / "adaptive" / "logs" / "r0-l0.log"


def test_predicted_durations_come_from_the_machine_file_and_are_empty_without_one(write_sweep):
    common = SWEEP | dict(batch_size=[8])
    assert predicted_durations(load_sweep_config(write_sweep("bare.yaml", **common))) == {}
    machine = REPO / "workflow" / "machines" / "dgx_h100_4ndr.yaml"
    config = load_sweep_config(write_sweep("machine.yaml", **common, machine=str(machine)))
    (point,) = expand_sweep(config).points
    (seconds,) = predicted_durations(config).values()
    assert 15.0 < seconds < point.timeout_s  # the launch time assumed, and some steps on an H100 node


def test_queued_states_lay_the_queue_over_records_sweep_status_cannot_read(tmp_path):
    records, _ = sweep_files(tmp_path, ["compute", "allreduce", "broadcast"])
    for point_id, state in (("compute", "ok"), ("allreduce", "failed")):  # an earlier try of allreduce
        records[point_id].parent.mkdir(parents=True)
        records[point_id].write_text(json.dumps({"schema_version": 1, "status": state}))  # a calibration record
    queue = [
        QueuedJob(job_id="5_1", state="RUNNING", name="", comment=""),
        QueuedJob(job_id="5_2", state="PENDING", name="", comment=""),
        QueuedJob(job_id="6", state="RUNNING", name="", comment="rule_run_point_wildcards_elsewhere"),  # not ours
        QueuedJob(job_id="4_0", state="COMPLETED", name="", comment=""),
    ]
    index = {"compute": ["4_0"], "allreduce": ["4_1", "5_1"], "broadcast": ["5_2"]}
    states = states_on_disk(records) | queued_states(queue, jobs_index=index, points=records)
    assert states == {"compute": "ok", "allreduce": "running", "broadcast": "pending"}
