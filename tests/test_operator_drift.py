"""An operators point on a host whose speed drifts: each repetition is set to one host speed by the probes
taken around it (ddlbench.analysis.machine.operator_timings), so two kinds timed minutes apart keep their true
ratio; a lone slow probe moves nothing; a record without times is kept as timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddlbench.analysis.machine.operator_timings import operator_timings


def shape(kind: str) -> dict:
    return {"kind": kind, "batch": 4, "in_channels": 8, "out_channels": 8, "height": 8, "width": 8, "kernel": 3}


def probe(t: float, compute_s: float, when: str = "during") -> dict:
    return {"time": t, "compute_s": compute_s, "copy_s": 1e-3, "turn": "all", "when": when}


def entry(kind: str, t: float | None, seconds: float) -> dict:
    timed = {"kind": "operator", "shape": shape(kind), "precision": "fp32", "at_once": 1}
    return timed | {"forward_s": [seconds], "backward_s": [2 * seconds]} | ({} if t is None else {"time": t})


def record(measurements: list[dict], probes: list[dict]) -> SimpleNamespace:
    rank = SimpleNamespace(rank=0, threads=1, measurements=tuple(measurements), host_probe=tuple(probes))
    return SimpleNamespace(point=SimpleNamespace(precisions=("fp32",)), point_id="ops", ranks=(rank,))


def samples(rec) -> dict[str, dict]:
    (timings,) = operator_timings(rec)
    return {sample["kind"]: sample for sample in timings["samples"]}


def test_a_host_twice_as_slow_for_the_later_kind_leaves_the_kinds_true_ratio():
    # the probe reads 4 ms for the first half of the point and 8 ms for the second: the host halved its speed.
    # conv costs 1 ms and linear 2 ms at the first half's speed; linear, timed in the second half, reads 4 ms
    probes = [probe(0, 4e-3, "start"), probe(10, 4e-3), probe(20, 4e-3), probe(30, 8e-3), probe(40, 8e-3)]
    probes.append(probe(50, 8e-3, "end"))
    timed = [entry("conv2d", 5, 1e-3), entry("conv2d", 15, 1e-3), entry("linear", 35, 4e-3), entry("linear", 45, 4e-3)]
    got = samples(record(timed, probes))
    assert got["linear"]["forward_s"] / got["conv2d"]["forward_s"] == pytest.approx(2.0, rel=1e-12)
    assert got["linear"]["backward_s"] / got["conv2d"]["backward_s"] == pytest.approx(2.0, rel=1e-12)
    # each at the speed of the probes' median (6 ms), the figure later points are set against
    assert got["conv2d"]["forward_s"] == pytest.approx(1e-3 * 6 / 4, rel=1e-12)
    assert got["linear"]["forward_s"] == pytest.approx(4e-3 * 6 / 8, rel=1e-12)
    # between two probes the speed is read on the line joining them
    halfway = samples(record([entry("conv2d", 25, 1e-3)], probes))
    assert halfway["conv2d"]["forward_s"] == pytest.approx(1e-3 * 6 / 6, rel=1e-12)


def test_one_slow_probe_among_steady_ones_changes_nothing():
    probes = [probe(0, 4e-3, "start"), probe(10, 4e-3), probe(20, 12e-3), probe(30, 4e-3), probe(40, 4e-3, "end")]
    got = samples(record([entry("conv2d", 19, 1e-3), entry("linear", 21, 2e-3)], probes))
    assert got["conv2d"]["forward_s"] == pytest.approx(1e-3, rel=1e-12)
    assert got["linear"]["forward_s"] == pytest.approx(2e-3, rel=1e-12)


def test_entries_without_a_time_or_a_rank_with_one_probe_are_kept_as_timed():
    drifting = [probe(0, 4e-3, "start"), probe(50, 8e-3, "end")]
    old = samples(record([entry("conv2d", None, 1e-3), entry("linear", None, 4e-3)], drifting))
    assert (old["conv2d"]["forward_s"], old["linear"]["forward_s"]) == (1e-3, 4e-3)
    lone = samples(record([entry("conv2d", 5, 1e-3)], [probe(0, 4e-3, "start")]))
    assert lone["conv2d"]["forward_s"] == 1e-3
