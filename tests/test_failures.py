"""Failures are data: a point that raises, runs out of memory, dies, hangs or diverges still gets a record."""

from __future__ import annotations

import json

import pytest

from ddlbench.launch.runner import run_point
from ddlbench.records import read_record
from tests.conftest import make_point

pytestmark = pytest.mark.slow


def run_with_fault(tmp_path, monkeypatch, fault, **point_fields):
    monkeypatch.setenv("DDLBENCH_INJECT_FAULT", fault)
    point = make_point(**point_fields)
    out = tmp_path / "points" / point.point_id / "record.json"
    returned = run_point(point, out=out, launcher="local")
    record = read_record(out)
    # compared as JSON text, since NaN != NaN would fail a diverged record's equality
    assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(returned.to_dict(), sort_keys=True)
    assert not (out.parent / "ranks").exists()
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
    record = run_with_fault(tmp_path, monkeypatch, "kill", nodes=2)
    assert record.status == "failed"
    assert record.reason == (
        "rank 1 ended with signal SIGKILL without reporting an error (possibly the kernel's out-of-memory killer)"
    )


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
