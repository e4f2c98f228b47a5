"""The host speed probe: every point and every calibration point times the same kernels; a machine file is
rescaled by a point's probe against the calibration's, section by section, and predicts accordingly."""

from __future__ import annotations

import copy
import math
import signal
import statistics
import subprocess
import sys

import pytest

from ddlbench.analysis.aggregate import record_row
from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import predict
from ddlbench.analysis.machine.host_speed import host_speed, rescaled
from ddlbench.analysis.machine.machine_file import read_machine
from ddlbench.launch.runner import run_point
from ddlbench.records import read_record
from ddlbench.train.calibration.records import read_calibration_record
from tests.conftest import make_point, run_cli, tiny_operator_suite


def _probe(compute_s, copy_s, all_reduce_s=None, *, point_id="p", benchmark="operators", at_once=2, ranks=2):
    return {
        "point_id": point_id,
        "benchmark": benchmark,
        "at_once": at_once,
        "ranks": ranks,
        "threads": 1,
        "compute_s": compute_s,
        "copy_s": copy_s,
        "all_reduce_s": all_reduce_s,
        "n": 4,
    }


def _machine() -> dict:
    return {
        "compute": {
            "matmul_flop_per_s": {"fp32": {"value": 4e10, "n": 8}},
            "memory_bandwidth_bytes_per_s": {"value": 1e10, "n": 8},
            "first_touch_s_per_byte": {"value": 2e-10, "ci_low": 1e-10, "ci_high": 3e-10, "n": 8},
        },
        "links": {"intra_node": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9, "bandwidth_bytes_per_s": 1e9}},
        "collectives": [
            {
                "op": "all_reduce",
                "point_id": "coll",
                "alpha_s": 2e-4,
                "beta_s_per_byte": 4e-10,
                "busy": {"alpha_s": 1e-3, "beta_s_per_byte": 5e-10, "wait_per_compute_s": 0.3},
            }
        ],
        "operator_timings": [
            {
                "point_id": "ops",
                "autograd_call_s": {"value": 1e-5},
                "samples": [{"forward_s": 1e-3, "backward_s": 2e-3}],
            }
        ],
        "host_probes": [
            _probe(1e-3, 2e-3, point_id="ops", at_once=1, ranks=1),
            _probe(1.2e-3, 2.4e-3, 3e-4, point_id="ops"),
            _probe(1.6e-3, 2.0e-3, 5e-4, point_id="coll", benchmark="collectives"),
            _probe(1.0e-3, 1.0e-3, point_id="cmp", benchmark="compute", at_once=1, ranks=1),
        ],
    }


def test_a_machine_file_is_rescaled_by_the_probe_against_the_point_that_measured_each_section():
    machine = _machine()
    kept = copy.deepcopy(machine)
    point = {"compute_s": 2.4e-3, "copy_s": 3.6e-3, "all_reduce_s": 1.5e-3, "at_once": 2, "ranks": 2, "threads": 1}
    out, speeds = rescaled(machine, point)
    assert machine == kept  # the file read is left as it was
    # operators against the operators point's two-rank probe: compute 2.4/1.2 = 2
    assert speeds["operators ops"].compute == pytest.approx(2.0) and speeds["operators ops"].reference == "ops"
    sample = out["operator_timings"][0]["samples"][0]
    assert (sample["forward_s"], sample["backward_s"]) == (pytest.approx(2e-3), pytest.approx(4e-3))
    assert out["operator_timings"][0]["autograd_call_s"]["value"] == pytest.approx(2e-5)
    # collectives against the collectives point's probe: latency 1.5/0.5 = 3 on α, memory 3.6/2.0 = 1.8 on β
    coll = out["collectives"][0]
    assert coll["alpha_s"] == pytest.approx(6e-4) and coll["beta_s_per_byte"] == pytest.approx(7.2e-10)
    assert coll["busy"]["alpha_s"] == pytest.approx(3e-3) and coll["busy"]["beta_s_per_byte"] == pytest.approx(9e-10)
    assert coll["busy"]["wait_per_compute_s"] == 0.3  # a share of compute: no unit to rescale
    # the compute point probed one rank alone: a two-rank point is set against every point's two-rank probes
    # pooled (medians: compute 1.4 ms, copy 2.2 ms) rather than against a probe of another sharing
    compute = speeds["compute cmp"]
    assert compute.reference == "pooled" and compute.compute == pytest.approx(2.4 / 1.4)
    assert out["compute"]["matmul_flop_per_s"]["fp32"]["value"] == pytest.approx(4e10 * 1.4 / 2.4)
    assert out["compute"]["memory_bandwidth_bytes_per_s"]["value"] == pytest.approx(1e10 * 2.2 / 3.6)
    touch = out["compute"]["first_touch_s_per_byte"]
    assert (touch["value"], touch["ci_high"], touch["n"]) == (
        pytest.approx(2e-10 * 3.6 / 2.2),
        pytest.approx(3e-10 * 3.6 / 2.2),
        8,
    )
    link = out["links"]["intra_node"]
    assert link["alpha_s"] == pytest.approx(1e-4 * 1.5 / 0.4) and link["bandwidth_bytes_per_s"] == pytest.approx(
        1e9 * 2.2 / 3.6
    )


def test_a_probe_with_nothing_to_compare_rescales_nothing():
    machine = _machine()
    other_threads = {"compute_s": 9e-3, "copy_s": 9e-3, "all_reduce_s": 9e-3, "at_once": 2, "ranks": 2, "threads": 4}
    out, speeds = rescaled(machine, other_threads)
    assert all(s.reference == "none" for s in speeds.values())
    assert out["operator_timings"] == machine["operator_timings"] and out["collectives"] == machine["collectives"]
    # one rank: no all-reduce of its own, and the calibration's latency is of two ranks: α stays
    alone = {"compute_s": 2e-3, "copy_s": 2e-3, "all_reduce_s": None, "at_once": 1, "ranks": 1, "threads": 1}
    s = host_speed(alone, machine["host_probes"], point_id="ops")
    assert (s.compute, s.memory, s.latency, s.reference) == (pytest.approx(2.0), pytest.approx(1.0), None, "ops")
    out, _ = rescaled(machine, alone)
    assert out["collectives"][0]["alpha_s"] == machine["collectives"][0]["alpha_s"]


@pytest.mark.slow
def test_a_point_probes_its_host_on_every_rank_and_a_calibration_in_turn_and_predictions_follow_the_ratio(tmp_path):
    """A real two-rank point probes at its start and end on both ranks (the all-reduce over both), its record
    and table row carry the medians; a real calibration keeps each point's probes per turn; and a machine file
    rescaled by a probe twice as slow as the calibration's predicts each step twice as long."""
    point = make_point(nodes=1, ranks_per_node=2, threads=1, steps=2)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    probes = [p for rank in record.ranks for p in rank.host_probe]
    assert sorted(p["when"] for p in probes) == ["end", "end", "start", "start"]
    assert all(p["compute_s"] > 0 and p["copy_s"] > 0 and p["all_reduce_s"] > 0 for p in probes)
    kept = read_record(tmp_path / "record.json").metrics.host_probe
    assert kept["at_once"] == 2 and kept["ranks"] == 2 and kept["n"] == 4  # both ranks on this host
    for name in ("compute_s", "copy_s", "all_reduce_s"):
        assert kept[name] == pytest.approx(statistics.median(p[name] for p in probes), rel=1e-12)
    assert record_row(record)["host_compute_s"] == kept["compute_s"]

    path = tiny_operator_suite(tmp_path, "probe", ("all_reduce", "broadcast"))  # ddp broadcasts at its start
    out = tmp_path / "machine.yaml"
    ran = run_cli("calibrate", "--configfile", str(path), "--out", str(out), env={"DDLBENCH_HOSTFILE": ""})
    assert ran.returncode == 0, ran.stderr[-3000:]
    machine = read_machine(out)
    turns = {(p["benchmark"], p["at_once"], p["n"], p["all_reduce_s"] is not None) for p in machine["host_probes"]}
    # the operators point also probes between shapes, in each turn (operator_kernel.PROBE_EVERY): at least once a
    # pass, two passes, without the all-reduces (only the turn's ranks probe)
    (ops,) = (tmp_path / "results" / "probe" / "calibration" / "points").glob("operators-*/record.json")
    during = [p for rank in read_calibration_record(ops).ranks for p in rank.host_probe if p["when"] == "during"]
    alone = sum(p["turn"] == "alone" for p in during)
    assert alone >= 2 and sum(p["turn"] == "all" for p in during) == 2 * alone
    assert all(p["all_reduce_s"] is None for p in during)
    # rank 0 alone at the start and end (2 probes), then both ranks (4), with the all-reduces only then
    assert turns == {("collectives", 1, 2, False), ("collectives", 2, 4, True), ("compute", 1, 2, False)} | {
        ("operators", 1, 2 + alone, False),
        ("operators", 2, 4 + 2 * alone, True),
    }

    # every calibration probe set alike, the point's twice as slow in all three: every time doubles
    for probe in machine["host_probes"]:
        probe.update(compute_s=1e-3, copy_s=1e-3, all_reduce_s=1e-4 if probe["all_reduce_s"] else None)
    setting = Setting.of_point(make_point(nodes=1, ranks_per_node=2, threads=1, strategy="ddp"))
    plain = predict(setting, MachineModel.from_dict(machine))
    slow = {"compute_s": 2e-3, "copy_s": 2e-3, "all_reduce_s": 2e-4, "at_once": 2, "ranks": 2, "threads": 1}
    doubled = predict(setting, MachineModel.from_dict(rescaled(machine, slow)[0]))
    assert plain.comm_s > 0 and plain.compute_s > 0
    for name in ("step_time_s", "compute_s", "comm_s"):
        # to rounding: every time the model reads scales, the autograd engine's chains and a backward's floor too
        assert getattr(doubled, name) == pytest.approx(2 * getattr(plain, name), rel=1e-9), name
    # compute alone twice as slow: its share of the compute (operator fits, FLOP rates) doubles and the rest (the
    # update and memory first touched, at the copy's rate) stays; memory alone twice as slow, the other way round
    slower = predict(
        setting, MachineModel.from_dict(rescaled(machine, slow | {"copy_s": 1e-3, "all_reduce_s": 1e-4})[0])
    )
    bound = predict(
        setting, MachineModel.from_dict(rescaled(machine, slow | {"compute_s": 1e-3, "all_reduce_s": 1e-4})[0])
    )
    assert plain.compute_s < slower.compute_s < 2 * plain.compute_s
    assert plain.compute_s < bound.compute_s < 2 * plain.compute_s


# A process that keeps core 0 busy for up to 2 minutes (the test stops and continues it, then kills it)
BUSY = "import os, time\nos.sched_setaffinity(0, {0})\nend = time.time() + 120\nwhile time.time() < end: pass\n"
# A probe on core 0 that answers each line it reads with its two figures: compute_s and a 0.2 ms call's time
PROBE = (
    "import os, sys, torch, torch.nn.functional as F\nos.sched_setaffinity(0, {0})\ntorch.set_num_threads(1)\n"
    "from ddlbench.train.host_probe import time_per_call, probe_host\n"
    "x = torch.randn(1, 16, 16, 16, requires_grad=True)\nw = torch.randn(16, 16, 3, 3, requires_grad=True)\n"
    "def short():\n    x.grad = w.grad = None\n    F.conv2d(x, w, padding=1).sum().backward()\n"
    "cpu = torch.device('cpu')\n"
    "for _ in sys.stdin:\n"
    "    print(probe_host(cpu, all_reduce=False)['compute_s'], time_per_call(short, cpu), flush=True)\n"
)
SHARED_ROUNDS = 9  # shared probes, each between two alone ones
SHARED_LEAST = 1.4  # the least median ratio shared ÷ alone: a probe blind to time-slicing reads about 1


@pytest.mark.serial
@pytest.mark.slow
def test_the_probe_sees_its_core_shared_with_a_busy_process():
    """On a core another process keeps busy, the scheduler gives the probe about half of it: its compute figure
    roughly doubles. Also for a call of about 0.2 ms, far shorter than any scheduler slice (1.5 ms on 2 CPUs,
    3 ms on 8 or more), which a median of single calls reads at the core's full speed: the timing's blocks span
    slices whatever the host's.
    One probe process, asked SHARED_ROUNDS times with the busy process continued (SIGCONT) and before and after
    each with it stopped (SIGSTOP): each shared figure is set against the geometric mean of the alone ones
    either side, a second apart, so the host's own drift (a CI host's alone probes, seconds apart in fresh
    processes, read 4.1 to 6.7 ms) cancels; the median of the ratios must exceed SHARED_LEAST (9 rounds here:
    2.1-2.2 for the convolution, 1.7-2.2 for the short call)."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hog = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        hog.send_signal(signal.SIGSTOP)

        def figures() -> tuple[float, float]:
            probe.stdin.write("\n")
            probe.stdin.flush()
            compute_s, short_s = probe.stdout.readline().split()
            return float(compute_s), float(short_s)

        figures()  # the first call in a process builds oneDNN's primitive
        alone, shared = [figures()], []
        for _ in range(SHARED_ROUNDS):
            hog.send_signal(signal.SIGCONT)
            shared.append(figures())
            hog.send_signal(signal.SIGSTOP)
            alone.append(figures())
    finally:
        hog.kill()
        hog.wait()
        probe.kill()
        probe.wait()
    for kernel in (0, 1):
        ratios = [s[kernel] / math.sqrt(alone[i][kernel] * alone[i + 1][kernel]) for i, s in enumerate(shared)]
        assert statistics.median(ratios) > SHARED_LEAST, f"kernel {kernel}: shared {shared} against alone {alone}"
