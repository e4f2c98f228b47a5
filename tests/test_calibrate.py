"""`ddlbench calibrate`: the suite, the α–β fit, and a machine file written from real runs (gloo and MPI)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.machine.fit import bus_factor, fit_alpha_beta
from ddlbench.analysis.machine.machine_file import REFERENCE_MACHINES, read_machine
from ddlbench.calibrate.suite import DEFAULT_SUITE, load_suite
from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.train.calibration.kernels import BESIDE_OPS, UPDATE_TENSORS
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import read_calibration_record
from ddlbench.train.strategies.sharded import DEFAULT_BUCKET_CAP_MB
from tests.conftest import REPO, leave_spawned_rank, run_cli, run_snakemake, tiny_operator_suite


def test_fit_recovers_latency_and_bandwidth():
    sizes = [2.0**k for k in range(8, 24, 2)]
    alpha, beta = 30e-6, 1 / 5e9
    fit = fit_alpha_beta(sizes, [alpha + beta * n for n in sizes])
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(5e9, rel=1e-9)
    assert fit.rel_error_max < 1e-9
    # relative residuals: 10 % noise on each time moves neither figure by more than a few tens of percent
    noisy = [(alpha + beta * n) * (1.1 if i % 2 else 0.9) for i, n in enumerate(sizes)]
    rough = fit_alpha_beta(sizes, noisy)
    assert rough.alpha_s == pytest.approx(alpha, rel=0.3) and rough.beta_s_per_byte == pytest.approx(beta, rel=0.3)
    assert rough.rel_error_max == pytest.approx(0.1, abs=0.05)


def test_fit_keeps_latency_and_slope_non_negative():
    # times that fall with size would give a negative slope: a constant (α only) is fitted instead
    fit = fit_alpha_beta([1e3, 1e4, 1e5], [3e-5, 2e-5, 1e-5])
    assert fit.beta_s_per_byte == 0 and fit.alpha_s > 0 and fit.bandwidth_bytes_per_s is None
    assert fit.clamped == "beta"
    # pure bandwidth: the intercept would be negative, so the line goes through the origin
    fit = fit_alpha_beta([1e3, 1e4, 1e5], [0.9e-6, 1e-5, 1.05e-4])
    assert fit.alpha_s == 0 and fit.beta_s_per_byte > 0 and fit.clamped == "alpha"


def test_bus_bandwidth_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("all_gather", 4) == 0.75
    assert bus_factor("broadcast", 8) == 1.0


def test_default_suite_expands_to_compute_collective_fsdp_spatial_and_layer_timing_points():
    suite = load_suite(DEFAULT_SUITE)
    kinds = [(p.benchmark, p.backend, p.nodes, p.ranks_per_node) for p in suite.points]
    assert kinds == [
        ("compute", "", 1, 1),
        ("collectives", "torch", 1, 2),
        ("collectives", "torch", 2, 1),
        ("collectives", "mpi", 1, 2),
        ("collectives", "mpi", 2, 1),
        ("fsdp_units", "", 1, 2),  # FSDP2's cost per unit, laid out as the collectives
        ("fsdp_units", "", 2, 1),
        ("spatial_layers", "", 1, 2),  # spatial's cost per slab layer, laid out the same way
        ("spatial_layers", "", 2, 1),
        ("layer_timings", "", 1, 2),
        ("layer_timings", "", 1, 2),
        ("operators", "", 1, 2),
    ]
    assert [p.precisions for p in suite.points[-3:-1]] == [("fp32",), ("bf16",)]
    # operators: one launch in which each shape is timed by a rank alone and by two at once, every precision
    assert suite.points[-1].precisions == ("fp32", "bf16") and suite.points[-1].operator_at_once == (1, 2)
    point = suite.points[1]
    assert CalibrationPoint.from_dict(json.loads(point.to_json())) == point
    assert json.loads(point.to_json())["kind"] == "calibration"  # what the worker dispatches on


def test_bad_suite_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"collectives\[0\]: \"allreduce\" is not one of the accepted values"):
        load_suite(raw={"collectives": ["allreduce"]})
    with pytest.raises(ConfigError, match=r"message_bytes: .* has too few entries; give at least 3"):
        load_suite(raw={"message_bytes": [8, 16]})


def test_reference_machine_files_read():
    names = {read_machine(path)["name"] for path in REFERENCE_MACHINES.glob("*.yaml")}
    assert names == {"dgx_h100_4ndr", "abci_v100"}


def test_machine_file_figures_must_be_numbers(tmp_path):
    path = tmp_path / "m.yaml"
    machine = {key: {} for key in ("device", "compute", "links")} | {"collectives": []}
    machine |= {"machine_version": 1, "name": "x", "source": "datasheet"}
    path.write_text(
        yaml.safe_dump(machine).replace("compute: {}", "compute: {memory_bandwidth_bytes_per_s: {value: 3.35e12}}")
    )
    with pytest.raises(DdlbenchError, match=r"compute.memory_bandwidth_bytes_per_s.value is '3.35e12', not a number"):
        read_machine(path)


@pytest.mark.parametrize("path", [DEFAULT_SUITE, REPO / "benchmarks" / "analytic" / "calibration.yaml"])
def test_shipped_suites_time_collectives_at_a_buckets_size(path):
    # the analytic model prices a bucket by the collectives' α + β·S; β from sizes up to 4 MiB priced a
    # 25 MiB bucket 20-25 % high on this host (docs/analytic.md, "Collectives timed at a bucket's size")
    suite = load_suite(path)
    sizes = {size for point in suite.points if point.benchmark == "collectives" for size in point.message_bytes}
    assert sizes, f"{path} times no collectives"
    assert max(sizes) >= 2 * DEFAULT_BUCKET_CAP_MB * 2**20, f"{path} times collectives up to {max(sizes)} B only"


def test_machine_file_of_another_version_is_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"machine_version": 99, "name": "x"}))
    with pytest.raises(DdlbenchError, match="machine_version 99 unknown; this ddlbench reads 1"):
        read_machine(path)


def _reduce_scatter_beside_a_sleep(rank: int, folder: str) -> None:
    """One of two gloo ranks: a 4 MiB reduce-scatter started asynchronously and waited on by kernels._waited
    while the rank sleeps 1 s (no compute: its end is its own); writes the seconds from its start to the end
    _waited noted."""
    import time

    import torch
    import torch.distributed as dist

    from ddlbench.train.calibration.kernels import _waited

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    source, part = torch.ones(2**20), torch.empty(2**19)
    dist.reduce_scatter_tensor(part, source)  # gloo's buffers made
    dist.barrier()
    began = time.perf_counter()
    ended = _waited(dist.reduce_scatter_tensor(part, source, async_op=True))
    time.sleep(1.0)
    along = ended() - began
    assert torch.equal(part, torch.full((2**19,), 2.0))  # the sum of both ranks' ones, this rank's half
    Path(folder, f"{rank}.json").write_text(json.dumps(along))
    dist.destroy_process_group()
    leave_spawned_rank()


def test_a_collective_beside_compute_is_timed_to_its_own_end_though_its_work_reports_none(tmp_path):
    """gloo's reduce-scatter reports no end (is_completed() stays False) until its wait returns, though its data
    moved long before: polled between the chain's products, as the calibration did until 2026-12-07, it read as
    lasting the whole chain. _waited's thread notes its real end: within the 1 s the rank slept, by far."""
    import torch.multiprocessing as mp

    mp.spawn(_reduce_scatter_beside_a_sleep, args=(str(tmp_path),), nprocs=2)
    for rank in range(2):
        along = json.loads((tmp_path / f"{rank}.json").read_text())
        # 4 MiB over gloo on one host: milliseconds alone (tens on a loaded 2-core machine); polled, 1 s or more
        assert 0 < along < 0.8, along


def test_a_wait_that_fails_fails_in_the_callers_thread():
    from ddlbench.train.calibration.kernels import _waited

    class Broken:
        def wait(self) -> None:
            raise RuntimeError("gloo: connection closed by peer")

    with pytest.raises(RuntimeError, match="connection closed by peer"):
        _waited(Broken())()


@pytest.mark.slow
def test_calibrate_writes_a_machine_file_from_real_runs(tmp_path):
    backends = ["torch", "mpi"] if shutil.which("mpirun") else ["torch"]
    suite = {
        "name": "tiny",
        "results_dir": str(tmp_path / "results"),
        "nodes": [1],
        "ranks_per_node": 2,
        "precisions": ["fp32", "tf32"],
        "matmul_sizes": [64, 128],
        "conv_shapes": [[2, 8, 8, 3]],
        "memory_bytes": 1 << 20,
        "alone_collective_bytes": [64 << 20, 1 << 20],  # taken in order of size
        # gloo's small messages on 2 shared cores take 0.1-2 ms by the scheduler's whim: the largest size
        # (several ms) keeps the slope above that noise, and 8 iterations steady the medians
        "message_bytes": [1024, 65536, 16777216],
        "backends": backends,
        "warmup": 1,
        "iterations": 8,
        "oversubscribe": True,
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    # workflow/calibrate.smk: a job per point (run-point dispatches on the spec's kind), then the fit
    ran = run_snakemake("-s", "workflow/calibrate.smk", "--cores", "2", "--configfile", str(path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    folder = tmp_path / "results" / "tiny" / "calibration"
    machine = read_machine(folder / "machine.yaml")
    assert machine["source"] == "measured" and machine["device"]["kind"] == "cpu" and machine["failed_points"] == []
    compute = machine["compute"]
    assert compute["matmul_flop_per_s"]["fp32"]["value"] > 0 and compute["matmul_flop_per_s"]["fp32"]["n"] == 8
    assert compute["refused"][0]["precision"] == "tf32" and "CUDA" in compute["refused"][0]["why"]
    assert compute["memory_bandwidth_bytes_per_s"]["bytes_moved"] == 2 << 20
    # memory mapped and zeroed on first use costs more than filling it again: 64 MiB, above glibc's largest
    # mmap threshold, is mapped anew at every allocation (4 of the 8 iterations each way, twice)
    touch = compute["first_touch_s_per_byte"]
    assert touch["bytes_filled"] == 64 << 20 and touch["n"] == 8 and touch["value"] > 0
    # zero2's collectives on a group of one, per op at every size asked for, each a median of the 8 iterations;
    # the larger moves 64 times the smaller's bytes: it must take longer (a call not waited for would not)
    alone = compute["alone_collectives"]
    assert sorted(alone) == ["all_gather", "reduce_scatter"]
    for figures in alone.values():
        assert [f["bytes"] for f in figures] == [1 << 20, 64 << 20] and {f["n"] for f in figures} == {8}
        assert figures[-1]["value"] > 10 * figures[0]["value"] > 0
    # the optimizer's step per parameter element: each iteration's time ÷ the elements, median over iterations
    update = compute["update_s_per_param"]
    assert (update["elements"], update["tensors"], update["n"]) == ((1 << 20) // 4, UPDATE_TENSORS, 8)
    records = [read_calibration_record(path) for path in (folder / "points").glob("*/record.json")]
    (raw,) = [m for r in records for m in r.ranks[0].measurements if m.get("kind") == "update"]
    assert update["value"] == pytest.approx(statistics.median(t / raw["elements"] for t in raw["times_s"]), rel=1e-12)
    libraries = {entry["library"] for entry in machine["collectives"]}
    assert "gloo" in libraries and (len(backends) == 1 or any(lib.startswith("mpi (") for lib in libraries))
    link = machine["links"]["intra_node"]  # one host: the link within a node
    assert link["alpha_s"] >= 0 and link["bandwidth_bytes_per_s"] > 0

    # each curve's time is the median over iterations of the slowest rank's time, from the raw records
    for entry in machine["collectives"]:
        record = read_calibration_record(folder / "points" / entry["point_id"] / "record.json")
        assert record.status == "ok" and len(record.ranks) == 2
        for point in entry["curve"]:
            per_rank = [
                next(m["times_s"] for m in rank.measurements if m["op"] == entry["op"] and m["bytes"] == point["bytes"])
                for rank in record.ranks
            ]
            if entry["op"] == "send_recv":
                times = [t / 2 for t in per_rank[record.ranks[0].rank]]
            else:
                times = [max(column) for column in zip(*per_rank, strict=True)]
            assert point["time_s"]["value"] == pytest.approx(statistics.median(times), rel=1e-12)
        fit = fit_alpha_beta([p["bytes"] for p in entry["curve"]], [p["time_s"]["value"] for p in entry["curve"]])
        assert entry["alpha_s"] == pytest.approx(fit.alpha_s) and entry["rel_error_max"] == pytest.approx(
            fit.rel_error_max
        )

    # beside mode (gloo on CPUs): per size the share each rank's chain of products lost to the collective in
    # flight, (beside − alone) ÷ the collective alone, median over both ranks' 8 iterations, from the raw records;
    # the machine's share the median over the collectives, within [0, 1]
    besides = [e for e in machine["collectives"] if e["library"] == "gloo" and e["op"] in BESIDE_OPS]
    assert sorted(e["op"] for e in besides) == sorted(BESIDE_OPS)
    for entry in besides:
        record = read_calibration_record(folder / "points" / entry["point_id"] / "record.json")
        (point,) = entry["beside"]["curve"]
        assert point["bytes"] == 16777216  # the one size of BESIDE_MIN_BYTES or more
        rows = [
            next(m for m in rank.measurements if m["op"] == entry["op"] and m.get("mode") == "beside")
            for rank in record.ranks
        ]
        shares = [
            (beside - alone) / call
            for row in rows
            for alone, call, beside in zip(row["compute_s"], row["times_s"], row["beside_s"], strict=True)
        ]
        assert len(shares) == 16 and point["share"]["n"] == 16
        assert point["share"]["value"] == pytest.approx(statistics.median(shares), rel=1e-12)
        assert entry["beside"]["share"]["value"] == pytest.approx(statistics.median(shares), rel=1e-12)
        # the chain ran the same products on both ranks, about 3 collectives long
        assert rows[0]["products"] == rows[1]["products"] >= 1
        # the collective timed beside the chain too: from its start until a thread of the rank's wait on it
        # returned (kernels._waited), never a negative time
        for row in rows:
            assert len(row["call_beside_s"]) == 8
            assert all(along > 0 for along in row["call_beside_s"])
        # in_flight_share = the chain's loss ÷ the time the collective ran under it; stretch = the collective's
        # time beside the chain ÷ its time alone
        flights, stretches = [], []
        for row in rows:
            for chain, call, beside, along in zip(
                row["compute_s"], row["times_s"], row["beside_s"], row["call_beside_s"], strict=True
            ):
                flights.append((beside - chain) / min(along, beside))
                stretches.append(along / call)
        assert len(stretches) == 16 and point["stretch"]["n"] == 16
        assert point["in_flight_share"]["value"] == pytest.approx(statistics.median(flights), rel=1e-12)
        assert entry["beside"]["stretch"]["value"] == pytest.approx(statistics.median(stretches), rel=1e-12)
    model = MachineModel.from_dict(machine)
    expected = statistics.median(e["beside"]["in_flight_share"]["value"] for e in besides)
    assert model.comm_share == pytest.approx(min(1.0, max(0.0, expected)))
    stretch = statistics.median(e["beside"]["stretch"]["value"] for e in besides)
    assert model.comm_stretch == pytest.approx(max(1.0, stretch))

    report = (folder / "report.html").read_text()
    assert report.count("<svg") == len(backends)  # one figure of curves and fits per library and link
    assert "dgx_h100_4ndr" in report and "abci_v100" in report
    # the probe of zero2's calls in the report: a row per op and size, its milliseconds a MB from the median
    for op, figures in alone.items():
        for f in figures:
            row = f'<td class="text">{op}</td><td>{f["bytes"]}</td>'
            assert row in report and f"<td>{f['value'] * 1e3 / (f['bytes'] / 1e6):.3g}</td></tr>" in report
    # the beside shares in the report: a row per collective and size, the share as the machine file has it
    for entry in besides:
        (point,) = entry["beside"]["curve"]
        row = f'<td class="text">{entry["op"]}</td><td>{point["bytes"]}</td>'
        assert row in report and f"<td>{point['share']['value']:.2g} [" in report
    again = run_snakemake("-s", "workflow/calibrate.smk", "--cores", "2", "--configfile", str(path))
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_a_point_that_cannot_run_is_recorded_and_the_rest_measured(tmp_path):
    if not shutil.which("mpirun"):
        pytest.skip("needs mpirun, to be refused a second node it does not know")
    suite = {
        "name": "refused",
        "results_dir": str(tmp_path / "results"),
        "nodes": [2],
        "collectives": ["all_reduce"],
        "precisions": ["fp32"],
        "matmul_sizes": [32],
        "conv_shapes": [],
        "memory_bytes": 4096,
        "message_bytes": [64, 128, 256],
        "backends": ["mpi"],
        "warmup": 0,
        "iterations": 2,
        "oversubscribe": True,
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = tmp_path / "machine.yaml"
    ran = run_cli("calibrate", "--configfile", str(path), "--out", str(out), env={"DDLBENCH_HOSTFILE": ""})
    assert ran.returncode == 0, ran.stderr[-3000:]
    machine = read_machine(out)
    (failed,) = machine["failed_points"]
    assert failed["status"] == "failed" and "needs 2 nodes, but mpirun knows 1 host" in failed["reason"]
    assert machine["compute"]["matmul_flop_per_s"]["fp32"]["value"] > 0
    assert "not measured: collectives-mpi-n2x1" in ran.stdout
    assert Path(tmp_path / "results" / "refused" / "calibration" / "points").is_dir()


@pytest.mark.slow
def test_operators_are_timed_by_one_rank_and_by_two_in_turn_within_one_launch(tmp_path):
    """One operators point of two ranks times every shape alone (rank 1 idle at a barrier) and two at once, in
    turn: the machine file holds an entry for each count, over the same shapes, the one-rank entry from rank
    0's repetitions alone and the two-rank entry from both ranks'."""
    path = tiny_operator_suite(tmp_path, "turns")
    (point,) = [p for p in load_suite(path).points if p.benchmark == "operators"]
    assert point.ranks_per_node == 2 and point.operator_at_once == (1, 2)
    out = tmp_path / "machine.yaml"
    ran = run_cli("calibrate", "--configfile", str(path), "--out", str(out), env={"DDLBENCH_HOSTFILE": ""})
    assert ran.returncode == 0, ran.stderr[-3000:]
    entries = read_machine(out)["operator_timings"]
    assert [entry["ranks_per_node"] for entry in entries] == [1, 2]
    alone, both = ({tuple(sorted((k, v) for k, v in s.items() if not k.endswith("_s") and k != "n")): s for s in
                    entry["samples"]} for entry in entries)  # fmt: skip
    assert alone.keys() == both.keys() and len(alone) > 20
    # 2 iterations over 2 rounds: one repetition a round, from one rank alone or from both
    assert {s["n"] for s in alone.values()} == {2} and {s["n"] for s in both.values()} == {4}
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in (*alone.values(), *both.values()))
    assert entries[0]["autograd_call_s"] is not None and entries[1]["autograd_call_s"] is not None
    # the forwards were timed with their outputs kept, as a step keeps them, and the machine file says so
    assert all(entry["forward_outputs_held"] > 1 for entry in entries)
    record = read_calibration_record(
        tmp_path / "results" / "turns" / "calibration" / "points" / point.point_id / "record.json"
    )
    turns = [{e.get("at_once") for e in rank.measurements if e["kind"] == "operator"} for rank in record.ranks]
    assert turns == [{1, 2}, {2}]  # rank 1 timed nothing in the one-rank turns
    # the optimizer's step by the same turns: each entry's figure the median of its turn's repetitions a parameter
    # (one rank's alone, both ranks' at once), each set to the turn's host speed as the shapes' repetitions are
    updates = [[e for e in rank.measurements if e["kind"] == "update"] for rank in record.ranks]
    # before the shapes (the point's 2 iterations), then 2 steps at each probe among them, on the ranks of the turn
    before = {0: [1, 2], 1: [2]}  # rank 1 has no one-rank turn
    for mine, rank in zip(updates, record.ranks, strict=True):
        first = len(before[rank.rank])
        assert [e["at_once"] for e in mine[:first]] == before[rank.rank]
        during = [p for p in rank.host_probe if p["when"] == "during"]
        assert [e["at_once"] for e in mine[first:]] == [p["at_once"] for p in during] and during
    for entry in entries:
        count = entry["ranks_per_node"]
        raw = [t / e["elements"] for mine in updates for e in mine if e["at_once"] == count for t in e["times_s"]]
        figure = entry["update_s_per_param"]
        assert figure["n"] == len(raw) > 2 * count
        assert min(raw) / 2 < figure["value"] < 2 * max(raw)  # a host speed factor, not another quantity
    assert MachineModel.from_file(out).update_at_once.keys() == {1, 2}
    # each entry says when it was timed, and the ranks probed the host between shapes in each of their turns
    # (operator_kernel.PROBE_EVERY), at times among their entries': what operator_timings sets each entry against
    for rank in record.ranks:
        times = [e["time"] for e in rank.measurements]
        assert times == sorted(times)
        during = {p["at_once"]: [] for p in rank.host_probe if p["when"] == "during"}
        for p in rank.host_probe:
            if p["when"] == "during":
                during[p["at_once"]].append(p["time"])
        assert set(during) == {e["at_once"] for e in rank.measurements}
        assert all(times[0] < t < times[-1] for probed in during.values() for t in probed)
