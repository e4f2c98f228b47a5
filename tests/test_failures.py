"""Failures are data: a point that raises, runs out of memory, dies, hangs or diverges still gets a record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ddlbench.launch.processes import host_oom_kills
from ddlbench.launch.runner import rank_dir_for, run_point
from ddlbench.records import read_record
from tests.conftest import BIN, make_point

pytestmark = pytest.mark.slow


def run_with_fault(tmp_path, monkeypatch, fault, **point_fields):
    monkeypatch.setenv("DDLBENCH_INJECT_FAULT", fault)
    point = make_point(**point_fields)
    out = tmp_path / "points" / point.point_id / "record.json"
    returned = run_point(point, out=out, launcher="local")
    record = read_record(out)
    # compared as JSON text, since NaN != NaN would fail a diverged record's equality
    assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(returned.to_dict(), sort_keys=True)
    assert list(out.parent.iterdir()) == [out]  # the ranks' scratch folder is gone
    return record


def test_exception_in_a_rank_is_a_failed_record(tmp_path, monkeypatch):
    record = run_with_fault(tmp_path, monkeypatch, "raise", nodes=2)
    assert record.status == "failed"
    assert record.reason.startswith("rank 1 on ")
    assert "InjectedFault: fault injected by DDLBENCH_INJECT_FAULT" in record.reason
    assert record.metrics is None
    assert record.failures[0].rank == 1 and "Traceback" in record.failures[0].traceback


def test_allocation_failure_is_an_oom_record(tmp_path, monkeypatch):
    record = run_with_fault(tmp_path, monkeypatch, "oom")
    assert record.status == "oom"
    assert "allocate" in record.reason


def test_rank_killed_without_a_word_is_a_failed_record(tmp_path, monkeypatch):
    """The rank SIGKILLs itself: where the kernel counts its out-of-memory kills (/proc/vmstat), the count did
    not move, so the record says failed and not the killer; where it does not, it says the killer may be why."""
    record = run_with_fault(tmp_path, monkeypatch, "kill", nodes=2)
    assert record.status == "failed"
    why = (
        "possibly the kernel's out-of-memory killer"
        if host_oom_kills() is None
        else "not the kernel's out-of-memory killer: it ended no process on this host meanwhile"
    )
    assert record.reason == f"rank 1 ended with signal SIGKILL without reporting an error ({why})"


def test_a_rank_the_kernel_killed_for_memory_is_an_oom_record(tmp_path):
    """The judge beside the real kill above: a rank ended by SIGKILL while the kernel's out-of-memory killer
    ended a process on the host is out of memory (the kernel's own kill is not one a test may cause); the count
    is read from /proc/vmstat's oom_kill line."""
    from ddlbench.launch.processes import LaunchOutcome
    from ddlbench.launch.runner import judge
    from ddlbench.records import RankFailure

    def outcome(kills):
        return LaunchOutcome(
            returncodes=(1, -signal.SIGKILL),
            ranks_of_process=((0,), (1,)),
            timed_out=False,
            stopped=(False, False),
            wall_s=1.0,
            host_oom_kills=kills,
        )

    point = make_point(nodes=2)
    # its peer, left alone, failed on the broken connection (as set 29's zero2 rank 0 did)
    reset = RankFailure(
        rank=0, hostname="vm", error_type="RuntimeError", message="Connection reset by peer", traceback="",
        out_of_memory=False, time=1.0,
    )  # fmt: skip
    verdict = judge(point, outcome(2), [], [reset])
    assert verdict.status == "oom"
    assert verdict.reason == (
        "rank 1 ended with signal SIGKILL without reporting an error: the kernel's out-of-memory killer ended 2 "
        "processes on this host while the ranks ran (/proc/vmstat oom_kill)"
    )
    assert judge(point, outcome(0), [], [reset]).status == "failed"
    assert "possibly" in judge(point, outcome(None), [], [reset]).reason
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 123\noom_kill 7\nnuma_hit 5\n")
    assert host_oom_kills(vmstat) == 7
    vmstat.write_text("nr_free_pages 123\n")  # a kernel before 4.13
    assert host_oom_kills(vmstat) is None
    assert host_oom_kills(tmp_path / "absent") is None
    if Path("/proc/vmstat").exists() and "oom_kill " in Path("/proc/vmstat").read_text():
        assert isinstance(host_oom_kills(), int) and host_oom_kills() >= 0


def test_hanging_point_is_a_timeout_record(tmp_path, monkeypatch):
    record = run_with_fault(tmp_path, monkeypatch, "hang", nodes=2, timeout_s=15.0)
    assert record.status == "timeout"
    assert "limit of 15 s" in record.reason


def test_nan_loss_is_a_diverged_failure_with_its_figures(tmp_path, monkeypatch):
    record = run_with_fault(tmp_path, monkeypatch, "nan")
    assert record.status == "failed"
    assert record.reason.startswith("diverged: loss is nan at step 1")
    assert record.metrics is not None


def test_fault_aimed_at_another_point_leaves_this_one_alone(tmp_path, monkeypatch):
    record = run_with_fault(tmp_path, monkeypatch, "raise@no-such-point")
    assert record.status == "ok"


def workers_of(rank_dir: Path) -> list[int]:
    """Pids of live rank processes started for `rank_dir` (it is on their command line)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "ddlbench.launch.worker" in cmdline and str(rank_dir) in cmdline and "zombie" not in state:
            pids.append(int(proc.name))
    return pids


def test_sigterm_stops_every_rank_and_leaves_no_record(tmp_path):
    """What Snakemake's Ctrl-C or a scancel does to a point: ranks must not be orphaned, no half record."""
    point = make_point(nodes=2, timeout_s=300.0)
    out = tmp_path / "record.json"
    runner = subprocess.Popen(
        [str(BIN / "ddlbench"), "run-point", "--spec", point.to_json(), "--out", str(out), "--launcher", "local"],
        env={**os.environ, "DDLBENCH_INJECT_FAULT": "hang"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(workers_of(rank_dir_for(out))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers_of(rank_dir_for(out))) == 2, "the ranks never started"
    time.sleep(2)  # let them reach the injected hang
    runner.send_signal(signal.SIGTERM)
    output, _ = runner.communicate(timeout=60)
    assert runner.returncode == 143, output
    assert "interrupted" in output and "no record written" in output
    assert not out.exists()
    assert workers_of(rank_dir_for(out)) == []
