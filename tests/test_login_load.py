"""Login-node load that does not grow with the sweep (issue 29, item 4): how many stats and reads a look
at a sweep costs, how often a watcher asks squeue, and that the answers stay right. Counted under fake
clocks and counting wrappers of os.stat and io.open; the timings are benchmarks/scheduler_load.py's."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddlbench.launch.disk_status import DiskWatch, states_on_disk, sweep_files
from ddlbench.launch.planned import IDS_FILE, code_fingerprint, planned_point_ids
from ddlbench.launch.progress import Counts, Progress, sweep_states, watch
from ddlbench.launch.result_watch import ResultNap
from ddlbench.launch.runner import write_unfinished_record
from ddlbench.launch.slurm import QueuedJob
from ddlbench.launch.status import CACHE_FILE, RecordCache, StatusReader, summarize, sweep_status
from ddlbench.records import record_path
from ddlbench.sweep import expand_sweep, plan_sweep
from tests.conftest import run_cli


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def counting(under: Path):
    """Count os.stat and io.open calls on paths under `under`, by kind."""
    seen: Counter = Counter()
    real_stat, real_open = os.stat, io.open

    def stat(path, *args, **kwargs):
        seen["stat"] += str(path).startswith(str(under))
        return real_stat(path, *args, **kwargs)

    def opened(path, *args, **kwargs):
        seen["open"] += str(path).startswith(str(under))
        return real_open(path, *args, **kwargs)

    os.stat, io.open = stat, opened
    try:
        yield seen
    finally:
        os.stat, io.open = real_stat, real_open


def big_plan(tmp_path: Path, repetitions: int):
    return plan_sweep(
        {"models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2],
         "batch_size": [4, 8], "repetitions": repetitions, "results_dir": str(tmp_path / "results")}
    )  # fmt: skip


def write_records(plan, statuses: dict[str, str]) -> None:
    """Each point's record with its status, quickly: one record written properly, the rest copies of it."""
    first = plan.points[0]
    path = plan.config.sweep_dir.parent / "template.json"
    write_unfinished_record(first, out=path, status="failed", reason="template")
    template = json.loads(path.read_text())
    by_id = {point.point_id: point for point in plan.points}
    for point_id, status in statuses.items():
        target = record_path(plan.config.sweep_dir, point_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        reason = None if status == "ok" else f"{status} here"
        record = template | {
            "point_id": point_id,
            "point": by_id[point_id].to_dict(),
            "status": status,
            "reason": reason,
        }
        target.write_text(json.dumps(record))


def test_status_of_a_large_sweep_counts_right_and_a_second_status_reads_no_record(tmp_path):
    plan = big_plan(tmp_path, repetitions=500)  # 2,000 points
    ids = [point.point_id for point in plan.points]
    wanted = {point_id: ("ok", "failed", "oom", "timeout")[i % 4] for i, point_id in enumerate(ids[:1600])}
    write_records(plan, wanted)
    queue = [QueuedJob(job_id=f"7_{i}", state="RUNNING" if i < 50 else "PENDING", name="", comment="")
             for i in range(100)]  # fmt: skip
    index = {point_id: [f"7_{i}"] for i, point_id in enumerate(ids[1600:1700])}
    cache = plan.config.sweep_dir / CACHE_FILE
    sweep_dir = plan.config.sweep_dir
    for attempt in ("cold", "warm"):
        records = RecordCache.load(cache)
        with counting(sweep_dir) as seen:
            statuses = sweep_status(plan, queue=queue, jobs_index=index, sweep_dir=sweep_dir, records=records)
        records.save(cache)
        assert summarize(statuses) == (
            "2000 points: 400 ok, 400 failed, 400 oom, 400 timeout, 50 running, 50 pending, 300 not started"
        )
        assert seen["stat"] == 1900  # one per record not hidden by its queued job
        assert seen["open"] == (1600 if attempt == "cold" else 0)  # the cache read is not under points/
    by_id = {status.point_id: status for status in statuses}
    assert (by_id[ids[1]].state, by_id[ids[1]].reason) == ("failed", "failed here")
    assert by_id[ids[1650]].job_ids == ("7_50",)


def test_planned_ids_are_kept_in_the_sweep_folder_and_made_again_when_the_config_or_code_changes(tmp_path):
    plan = big_plan(tmp_path, repetitions=3)
    config, sweep_dir = plan.config, plan.config.sweep_dir
    expanded = [point.point_id for point in plan.points]
    assert planned_point_ids(config) == expanded  # no folder yet: expanded, nothing kept
    assert not (sweep_dir / IDS_FILE).exists()
    sweep_dir.mkdir(parents=True)
    assert planned_point_ids(config) == expanded
    kept = json.loads((sweep_dir / IDS_FILE).read_text())
    assert kept["ids"] == expanded
    # a kept file is what the next status uses: proven by planting other ids under the same key
    (sweep_dir / IDS_FILE).write_text(json.dumps({"key": kept["key"], "ids": ["planted"]}))
    assert planned_point_ids(config) == ["planted"]
    # another config (one more repetition) has another key: expanded again, and the file rewritten
    more = big_plan(tmp_path, repetitions=4).config
    assert more.sweep_dir == sweep_dir
    assert planned_point_ids(more) == [point.point_id for point in expand_sweep(more).points] != expanded
    assert json.loads((sweep_dir / IDS_FILE).read_text())["key"] != kept["key"]
    # a garbled file is replaced
    (sweep_dir / IDS_FILE).write_text("{not json")
    assert planned_point_ids(config) == expanded


def test_the_code_fingerprint_changes_with_any_source_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.yaml").write_text("y: 2\n")
    (package / "notes.txt").write_text("not code")
    first = code_fingerprint(package)
    (package / "notes.txt").write_text("not code, changed")
    assert code_fingerprint(package) == first
    (package / "sub" / "b.yaml").write_text("y: 3\n")
    os.utime(package / "sub" / "b.yaml", ns=(1, 1))  # same size, another time
    assert code_fingerprint(package) != first


def test_status_names_points_added_to_the_config_after_a_status_kept_its_ids(write_sweep, tmp_path):
    shape = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1])
    config = write_sweep(name="ids_kept", batch_size=[4], **shape)
    (tmp_path / "results" / "ids_kept").mkdir(parents=True)  # a sweep folder: the ids are kept there
    first = run_cli("status", "--configfile", str(config), "--no-queue")
    assert first.returncode == 0 and "1 points: 1 not started" in first.stdout, (first.stdout, first.stderr)
    assert (tmp_path / "results" / "ids_kept" / IDS_FILE).exists()
    write_sweep(name="ids_kept", batch_size=[4, 8], **shape)
    second = run_cli("status", "--configfile", str(config), "--no-queue")
    assert second.returncode == 0 and "2 points: 2 not started" in second.stdout, (second.stdout, second.stderr)


def test_a_watcher_reads_a_record_again_only_when_its_job_leaves_the_queue_or_its_turn_comes(tmp_path):
    plan = big_plan(tmp_path, repetitions=100)  # 400 points
    ids = [point.point_id for point in plan.points]
    write_records(plan, dict.fromkeys(ids[:200], "ok"))
    index = {point_id: [f"8_{i}"] for i, point_id in enumerate(ids[200:])}
    queue = [QueuedJob(job_id=f"8_{i}", state="RUNNING", name="", comment="") for i in range(200)]
    sweep_dir = plan.config.sweep_dir
    clock = FakeClock()
    reader = StatusReader(plan, sweep_dir=sweep_dir, every_s=120.0, least_per_s=0.0, clock=clock)
    with counting(sweep_dir / "points") as seen:
        reader.look(queue, index)
    assert seen["stat"] == 200  # the recorded points; the queued ones cost nothing
    with counting(sweep_dir / "points") as seen:
        statuses = reader.look(queue, index)  # at once again: nothing announced a change
    assert seen["stat"] == 0 and Counter(s.state for s in statuses) == {"ok": 200, "running": 200}
    write_records(plan, {ids[200]: "oom"})  # job 8_0 ends
    clock.now += 10
    with counting(sweep_dir / "points") as seen:
        statuses = reader.look(queue[1:], index)
    # the point whose job left, and 10 s of a 120-s round of 400 points: 33 others in turn
    assert seen["stat"] == 1 + 33 and statuses[200].state == "oom"
    clock.now += 600  # a long pause: one round at most, never more
    with counting(sweep_dir / "points") as seen:
        reader.look(queue[1:], index)
    assert seen["stat"] == 201  # every point not in the queue once


def test_submit_s_progress_reads_each_record_about_once_over_a_whole_sweep(tmp_path):
    plan = big_plan(tmp_path, repetitions=50)  # 200 points
    ids = [point.point_id for point in plan.points]
    index = {point_id: [f"9_{i}"] for i, point_id in enumerate(ids)}
    (plan.config.sweep_dir).mkdir(parents=True)
    (plan.config.sweep_dir / "slurm-jobs.json").write_text(json.dumps(index))
    states = sweep_states(plan, sweep_dir=plan.config.sweep_dir, only=set(ids))
    seen: Counter = Counter()
    for ended in range(0, 201, 20):  # 20 jobs end between polls
        write_records(plan, dict.fromkeys(ids[max(0, ended - 20) : ended], "ok"))
        queue = [QueuedJob(job_id=f"9_{i}", state="RUNNING", name="", comment="") for i in range(ended, 200)]
        with counting(plan.config.sweep_dir / "points") as looked:
            statuses = states(queue)
        seen += looked
        assert Counter(s.state for s in statuses) == Counter({"ok": ended, "running": 200 - ended}) - Counter()
    assert seen["stat"] == 200 and seen["open"] == 200


def test_a_running_allocation_s_summary_is_read_once_a_look_not_once_a_point(tmp_path):
    plan = big_plan(tmp_path, repetitions=50)
    ids = [point.point_id for point in plan.points]
    index = {point_id: ["42"] for point_id in ids}
    summary = plan.config.sweep_dir / "packed" / "allocation-42.json"
    summary.parent.mkdir(parents=True)
    steps = [{"point_id": p, "start_s": 1.0, "end_s": 2.0} for p in ids[:10]]
    steps += [{"point_id": p, "start_s": 3.0} for p in ids[10:30]]
    summary.write_text(json.dumps({"points": steps}))
    write_records(plan, dict.fromkeys(ids[:10], "ok"))
    for point_id in ids[:10]:  # recorded in this allocation
        path = record_path(plan.config.sweep_dir, point_id)
        record = json.loads(path.read_text())
        record["provenance"]["slurm_job_id"] = "42"
        path.write_text(json.dumps(record))
    queue = [QueuedJob(job_id="42", state="RUNNING", name="", comment="")]
    reader = StatusReader(plan, sweep_dir=plan.config.sweep_dir)
    with counting(summary) as seen:
        statuses = reader.look(queue, index)
    assert seen == {"stat": 1, "open": 1}
    assert Counter(s.state for s in statuses) == {"ok": 10, "running": 20, "pending": 170}
    with counting(plan.config.sweep_dir) as seen:
        reader.look(queue, index)  # unchanged: one stat of the summary, no record looked at again
    assert seen == {"stat": 1}


def test_result_nap_looks_at_each_job_at_most_once_a_minute_and_finds_an_end(tmp_path):
    clock = FakeClock()
    ended: set[str] = set()
    looks: Counter = Counter()

    def exists(path):
        looks[path] += 1
        return path in ended

    jobs = [SimpleNamespace(job_id=f"1_{i}", paths=SimpleNamespace(result_pickle=f"1_{i}")) for i in range(10_000)]
    nap = ResultNap(lambda: jobs, exists=exists, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        nap(120.0)  # QueueWatch's longest pause, nothing ending
    assert clock.now == 600.0
    assert nap.stats <= 10_000 * 600 / 60 and max(looks.values()) <= 10  # ≤ 1 per job per minute
    assert nap.stats >= 10_000 * 5 * 110 / 60 - 1  # and the budget spent: 110 s of each pause looked
    ended.add("1_1234")
    began = clock.now
    nap(120.0)
    assert clock.now - began <= 10 + 60 + 2 + 1 and "1_1234" in nap.finished  # within a round


def test_result_nap_of_a_small_sweep_looks_once_a_second_in_all(tmp_path):
    clock = FakeClock()
    jobs = [SimpleNamespace(job_id=str(i), paths=SimpleNamespace(result_pickle=tmp_path / str(i))) for i in range(6)]
    nap = ResultNap(lambda: jobs, clock=clock, sleep=clock.sleep)
    nap(70.0)
    assert nap.stats == 60  # after the least 10 s, one a second
    (tmp_path / "3").write_bytes(b"")
    began = clock.now
    nap(120.0)
    assert clock.now - began <= 10 + 6 + 2 and nap.finished == {"3"}


def test_watch_polls_like_submit_the_pause_grows_while_nothing_ends_and_resets_when_one_does():
    pauses: list[float] = []
    counts = iter([{"a": "running", "b": "pending"}] * 9 + [{"a": "ok", "b": "running"}] * 3 + [{"a": "ok", "b": "ok"}])
    progress = Progress(title="t", stream=io.StringIO(), isatty=False)
    final = watch(lambda: next(counts), progress=progress, interval_s=10, max_interval_s=120, sleep=pauses.append)
    assert pauses == [10, 15, 22.5, 33.75, 50.625, 75.9375, 113.90625, 120, 120, 10, 15, 22.5]
    assert final == Counts(ok=2)
    minutes = sum(pauses[3:9]) / 60  # once the pause passed 30 s: the steady state
    assert 6 / minutes <= 2  # polls a minute


def test_status_watch_asks_squeue_at_most_twice_a_minute_once_nothing_ends(tmp_path, monkeypatch):
    import ddlbench.launch.progress as progress_module
    import ddlbench.launch.slurm as slurm
    from ddlbench.cli import sweep as cli_sweep
    from ddlbench.config import load_sweep_config

    path = tmp_path / "sweep.yaml"
    sweep = {"name": "watched", "results_dir": str(tmp_path / "results"), "models": ["resnet8"],
             "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2], "repetitions": 5}  # fmt: skip
    path.write_text(json.dumps(sweep))
    config = load_sweep_config(path)
    ids = [point.point_id for point in expand_sweep(config).points]
    queue = [QueuedJob(job_id=f"5_{i}", state="RUNNING", name="", comment=f"rule_run_point_wildcards_{p}")
             for i, p in enumerate(ids)]  # fmt: skip
    clock = FakeClock()
    calls: list[float] = []

    def squeue():
        calls.append(clock.now)
        if clock.now > 3600:
            return []  # the workflow stopped: the watcher ends after a few idle looks
        return queue

    real_watch = progress_module.watch
    monkeypatch.setattr(slurm, "query_queue", squeue)
    monkeypatch.setattr(cli_sweep.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(progress_module, "watch", lambda poll, **kw: real_watch(poll, **kw, sleep=clock.sleep))
    args = SimpleNamespace(interval=10.0, no_queue=False)
    assert cli_sweep._watch(args, config) == 0
    steady = [at for at in calls if 600 <= at <= 3600]
    assert len(steady) <= (3600 - 600) / 120 + 1  # 0.5 a minute at the 120-s pause
    assert len([at for at in calls if at < 60]) <= 4


def test_disk_watch_looks_at_each_point_at_most_once_a_round_and_finds_what_changed(tmp_path):
    ids = [f"p{i}" for i in range(2400)]
    records, logs = sweep_files(tmp_path, ids)
    for point_id in ids[:1200]:
        records[point_id].parent.mkdir(parents=True)
        records[point_id].write_text(json.dumps({"status": "ok"}))
    clock = FakeClock()
    disk = DiskWatch(since=None, every_s=120.0, least_per_s=0.0, clock=clock)
    with counting(tmp_path) as seen:
        assert Counter(disk(records, logs).values()) == {"ok": 1200, "not started": 1200}
    first = seen["stat"]
    for _ in range(12):
        clock.now += 10
        with counting(tmp_path) as seen:
            disk(records, logs)
        assert seen["stat"] <= 2 * 2400 * 10 / 120  # ≤ 2 stats a look, a round of 120 s
    records["p2000"].parent.mkdir(parents=True)
    records["p2000"].write_text(json.dumps({"status": "oom"}))
    for _ in range(12):  # within a round it is seen
        clock.now += 10
        states = disk(records, logs)
    assert states["p2000"] == "oom" and first <= 2 * 2400


def test_states_on_disk_read_each_record_once_above_the_old_cache_size(tmp_path):
    ids = [f"p{i}" for i in range(9000)]
    records, _ = sweep_files(tmp_path, ids)
    for point_id in ids:
        records[point_id].parent.mkdir(parents=True)
        records[point_id].write_text('{"status": "ok"}')
    assert Counter(states_on_disk(records).values()) == {"ok": 9000}
    with counting(tmp_path) as seen:
        assert Counter(states_on_disk(records).values()) == {"ok": 9000}
    assert seen == {"stat": 9000}  # no record read again: 8,192 entries used to thrash


@pytest.mark.parametrize("broken", ["{", json.dumps({"schema_version": 1, "status": "ok"})])
def test_a_record_missing_what_a_record_has_is_unreadable(tmp_path, broken):
    plan = big_plan(tmp_path, repetitions=1)
    path = record_path(plan.config.sweep_dir, plan.points[0].point_id)
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    statuses = sweep_status(plan, queue=[], jobs_index={}, sweep_dir=plan.config.sweep_dir)
    assert statuses[0].state == "unreadable" and str(path) in statuses[0].reason
