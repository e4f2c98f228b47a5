"""Nodes claimed by points that start on their own inside one allocation (ddlbench.launch.claims)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddlbench.errors import DdlbenchError
from ddlbench.launch import claims
from ddlbench.launch.claims import claimed_nodes


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setattr(claims.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(claims, "POLL_S", 0.05)
    return "4242"


def _hold(job_id: str, nodes: list[str], lane: int = 0) -> subprocess.Popen:
    """Another runner, alive, holding `nodes` and `lane` in the claims file."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = claims.claims_file(job_id)
    state = json.loads(path.read_text()) if path.exists() else {"claims": {}}
    state["claims"][str(holder.pid)] = {"nodes": nodes, "lane": lane}
    path.write_text(json.dumps(state))
    return holder


def test_a_claim_takes_free_nodes_and_gives_them_back(job):
    hosts = ["n1", "n2", "n3"]
    holder = _hold(job, ["n1"])
    try:
        with claimed_nodes(job, hosts, count=2) as (nodes, lane):
            assert nodes == ["n2", "n3"]
            assert lane == 1  # the lowest lane the holder does not hold: a rendezvous port of its own
            with (
                pytest.raises(DdlbenchError, match="no 1 free node"),
                claimed_nodes(job, hosts, count=1, timeout_s=0.2),
            ):
                pass
        with claimed_nodes(job, hosts, count=1, pin="n3") as (nodes, lane):
            assert nodes == ["n3"] and lane == 1  # given back, so free again
        with (
            pytest.raises(DdlbenchError, match="no 1 free node"),
            claimed_nodes(job, hosts, count=1, pin="n1", timeout_s=0.2),
        ):  # pinned to a held node: waits
            pass
    finally:
        holder.kill()
        holder.wait()
    # the holder died without giving its node back: the next claim drops its claim
    with claimed_nodes(job, hosts, count=1, pin="n1") as (nodes, _):
        assert nodes == ["n1"]
    assert json.loads(claims.claims_file(job).read_text())["claims"] == {}


def test_claims_written_by_an_earlier_ddlbench_are_still_honoured(job):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the format before lanes: pid -> nodes
        claims.claims_file(job).write_text(json.dumps({"claims": {str(holder.pid): ["n1"]}, "sequence": 3}))
        with claimed_nodes(job, ["n1", "n2"], count=1) as (nodes, lane):
            assert nodes == ["n2"] and lane == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_the_allocation_cannot_hold_is_refused_at_once(job):
    with (
        pytest.raises(DdlbenchError, match="needs 3 nodes; this allocation has 2"),
        claimed_nodes(job, ["n1", "n2"], count=3),
    ):
        pass
    with pytest.raises(DdlbenchError, match="pinned to node n9"), claimed_nodes(job, ["n1", "n2"], count=1, pin="n9"):
        pass


def test_packing_needs_the_variable_and_an_allocation():
    assert claims.packing_enabled({"DDLBENCH_PACK": "1", "SLURM_JOB_ID": "7"})
    assert not claims.packing_enabled({"DDLBENCH_PACK": "1"})
    assert not claims.packing_enabled({"SLURM_JOB_ID": "7", "DDLBENCH_PACK": "0"})
