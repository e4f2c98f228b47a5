"""Cores are never shared silently: refusal before ranks start, flags when allowed, disjoint pinning."""

from __future__ import annotations

import os
import time

import pytest

from ddlbench.launch.cores import (
    LEDGER,
    LOCK_DIR_VAR,
    CoreGrant,
    OversubscriptionRefused,
    claimed_cores,
    host_ledger,
    rank_cpus,
)
from ddlbench.launch.runner import run_point
from ddlbench.records import read_record
from tests.conftest import job_counts, make_point, run_snakemake


def test_a_point_needing_more_cores_than_granted_is_refused_before_anything_runs(tmp_path):
    point = make_point(nodes=1, ranks_per_node=2, threads=1, oversubscribe=False)
    out = tmp_path / "record.json"
    with pytest.raises(OversubscriptionRefused) as refused:
        run_point(point, out=out, launcher="local", cores=1)
    message = str(refused.value)
    assert point.point_id in message and "= 2 cores" in message and "1 are granted" in message
    assert "oversubscribe: true" in message
    assert not out.exists() and not (tmp_path / "record.json.ranks").exists()


@pytest.mark.slow
def test_an_allowed_oversubscribed_point_runs_and_says_so(tmp_path):
    point = make_point(nodes=1, ranks_per_node=2, threads=1, oversubscribe=True, steps=2)
    record = run_point(point, out=tmp_path / "record.json", launcher="local", cores=1)
    assert record.status == "ok", record.reason
    assert record.metrics.oversubscribed is True
    assert record.metrics.cores_note.startswith("launcher: 2 cores needed, 1 granted")
    assert read_record(tmp_path / "record.json").metrics.oversubscribed is True


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning 2 ranks needs 2 CPUs")
def test_local_ranks_are_pinned_to_disjoint_cores(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_DIR_VAR, str(tmp_path / "locks"))  # free of other ddlbench runs on this host
    point = make_point(nodes=1, ranks_per_node=2, threads=1, oversubscribe=False, steps=2)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    cpus = [set(rank.cpus) for rank in record.ranks]
    assert all(len(c) == 1 for c in cpus) and not cpus[0] & cpus[1]
    assert all(rank.cpu_binding.startswith("ddlbench: pinned to") for rank in record.ranks)
    assert record.metrics.oversubscribed is False


def test_concurrent_points_claim_disjoint_cores(tmp_path):
    grant = CoreGrant(needed=2, granted=2, allowed=(0, 1, 2, 3))
    with claimed_cores(grant, tmp_path) as first, claimed_cores(grant, tmp_path) as second:
        assert first == (0, 1) and second == (2, 3)
        with claimed_cores(grant, tmp_path) as third:
            assert third is None  # all four held: the third point runs unpinned rather than stacked
    with claimed_cores(grant, tmp_path) as again:
        assert again == (0, 1)  # released when the blocks ended
    assert rank_cpus((4, 5, 6, 7), 1, 2) == (6, 7)


def test_a_launch_names_the_points_that_ran_beside_it_on_the_host_and_for_how_long(tmp_path):
    """The host ledger: overlapping launches see each other, for the seconds they overlapped (merged when
    several overlap at once); one after them sees nobody; a launch killed before its end line (its process
    gone) is not counted as running on."""
    with host_ledger("a", tmp_path) as first:
        time.sleep(0.3)
        with host_ledger("b", tmp_path) as second, host_ledger("c", tmp_path) as third:
            time.sleep(0.3)
        time.sleep(0.2)
    (a,), (b,), (c,) = first, second, third
    assert [point for point, _ in a.overlaps] in (["b", "c"], ["c", "b"])
    assert a.shared_s == pytest.approx(b.window_s, abs=0.05) and 0.25 < a.shared_s < a.window_s - 0.4
    assert {point for point, _ in b.overlaps} == {"a", "c"} and b.shared_s == pytest.approx(b.window_s, abs=1e-6)
    assert {point for point, _ in c.overlaps} == {"a", "b"}
    assert "beside 2 other point(s)" in a.note() and "shared memory bandwidth" in a.note()
    dead = 2**22 + 12345  # above the kernel's default pid_max: no such process
    with open(tmp_path / LEDGER, "a") as ledger:
        ledger.write(f"start {time.time() - 5:.3f} {dead}-1 killed\n")
    with host_ledger("d", tmp_path) as later:
        time.sleep(0.05)
    (d,) = later
    assert d.overlaps == () and d.shared_s == 0 and d.note() == "alone on this host"


def test_snakemake_refuses_a_sweep_needing_more_than_its_cores(write_sweep):
    axes = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1], ranks_per_node=[2])
    sweep = write_sweep(**axes)
    refused = run_snakemake("--cores", "1", "-n", "--configfile", str(sweep))
    assert refused.returncode != 0
    assert "needs 2 ranks × 1 threads = 2 cores, but --cores is 1" in refused.stderr
    allowed = write_sweep("allowed.yaml", **axes, oversubscribe=True)
    planned = run_snakemake("--cores", "1", "-n", "--configfile", str(allowed))
    assert planned.returncode == 0, planned.stderr
    assert job_counts(planned).get("run_point") == 1
