"""FSDP2's own cost per unit: the calibration's toy (sharded against unsharded), its fit, and what the fsdp
model does with it. The prediction against a measured fsdp step is tests/test_analytic_measured.py's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ddlbench.analysis.analytic.layout import Setting, block_params, block_tensors
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import introspected_table, predict
from ddlbench.analysis.machine.fsdp_units import fit_nonnegative, fsdp_unit_figures
from ddlbench.analysis.machine.machine_file import read_machine
from ddlbench.calibrate.suite import load_suite
from ddlbench.errors import ConfigError
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import CalibrationRankResult, CalibrationRecord
from tests.conftest import cpu_machine_data as _cpu
from tests.conftest import run_cli

ONLY_FSDP = {"collectives": [], "matmul_sizes": [], "conv_shapes": [], "memory_bytes": 0, "fsdp_units": True}


def test_fsdp_units_expand_like_the_collectives_and_only_when_asked():
    suite = load_suite(raw=ONLY_FSDP | {"nodes": [1, 2], "ranks_per_node": 2})
    assert [(p.benchmark, p.nodes, p.ranks_per_node) for p in suite.points] == [
        ("fsdp_units", 1, 2),
        ("fsdp_units", 2, 1),
    ]
    assert suite.points[0].point_id.startswith("fsdp_units-n1x2-t1-")
    assert CalibrationPoint.from_dict(json.loads(suite.points[0].to_json())) == suite.points[0]
    # off unless asked: a suite that never said so gets no such point
    plain = load_suite(raw={"collectives": [], "nodes": [1, 2]})
    assert "fsdp_units" not in {p.benchmark for p in plain.points}
    with pytest.raises(ConfigError, match="fsdp_units"):
        load_suite(raw=ONLY_FSDP | {"fsdp_units": "yes"})


def test_the_fit_recovers_its_terms_and_keeps_every_one_nonnegative():
    rows = [(1.0, 2.0, 1e3), (1.0, 8.0, 4e3), (1.0, 2.0, 1e6), (1.0, 8.0, 1e6)]
    truth = (1.5e-3, 4e-5, 2e-9)
    targets = [sum(c * x for c, x in zip(truth, row, strict=True)) for row in rows]
    coefficients, worst = fit_nonnegative(rows, targets)
    assert coefficients == pytest.approx(truth, rel=1e-9) and worst == pytest.approx(0, abs=1e-9)
    # more tensors cost less here: unconstrained least squares would say so with a negative term; the fit
    # sets that term to 0 and explains the rest by the others
    falling = [1e-3 - 1e-5 * row[1] + 1e-9 * row[2] for row in rows]
    coefficients, worst = fit_nonnegative(rows, falling)
    assert coefficients[1] == 0 and min(coefficients) >= 0
    assert worst is not None and worst > 0


def _toy_rank(rank: int, *, per_unit: float, per_byte: float, update_per_tensor: float) -> CalibrationRankResult:
    """A rank whose sharded toy takes `per_unit + per_byte·bytes` more a unit in forward (twice that in
    backward) than the unsharded one, and whose update pays `update_per_tensor` a tensor beyond half the
    unsharded update (2 ranks)."""
    measurements = []
    for layers, width in ((1, 16), (4, 16), (1, 512), (4, 256)):
        unit_bytes, tensors = layers * (width * width + width) * 4, 2 * layers
        extra = per_unit + per_byte * unit_bytes
        plain = {"forward_s": [0.001, 0.002, 0.003], "backward_s": [0.002] * 3, "update_s": [0.004] * 3}
        fsdp = {
            "forward_s": [t + 8 * extra + rank * 1e-9 for t in plain["forward_s"]],
            "backward_s": [t + 8 * 2 * extra for t in plain["backward_s"]],
            "update_s": [0.004 / 2 + 8 * tensors * update_per_tensor] * 3,
        }
        measurements.append(
            {"kind": "fsdp_units", "units": 8, "layers_per_unit": layers, "width": width, "tensors_per_unit": tensors,
             "unit_bytes": unit_bytes, "mesh_ranks": 2, "plain": plain, "fsdp": fsdp}
        )  # fmt: skip
        # the same toy sharded over each rank alone: half the excess a unit, the whole update on the rank
        alone = {"forward_s": [t + 4 * extra for t in plain["forward_s"]], "backward_s": plain["backward_s"],
                 "update_s": [0.004 + 8 * tensors * update_per_tensor] * 3}  # fmt: skip
        measurements.append(measurements[-1] | {"mesh_ranks": 1, "fsdp": alone})
    return CalibrationRankResult(
        rank=rank, hostname="h", device="cpu", device_name="", backend="gloo", library="gloo", torch_version="2.13",
        threads=1, cpus=(rank,), measurements=tuple(measurements),
    )  # fmt: skip


def test_figures_take_the_sharded_toys_excess_per_unit_and_fit_it():
    point = load_suite(raw=ONLY_FSDP | {"nodes": [1], "ranks_per_node": 2}).points[0]
    ranks = tuple(_toy_rank(r, per_unit=1.2e-3, per_byte=5e-10, update_per_tensor=3e-5) for r in (0, 1))
    record = CalibrationRecord(
        point_id=point.point_id, point=point, status="ok", reason=None, launcher="local", start_time="", end_time="",
        ranks=ranks,
    )  # fmt: skip
    entry, alone = fsdp_unit_figures(record)
    assert (entry["ranks"], entry["nodes"], entry["layout"]) == (2, 1, "1x2")
    assert (alone["ranks"], alone["nodes"], alone["layout"]) == (1, 1, "1x2")  # one rank's mesh, two ran at once
    assert alone["forward"]["per_unit_s"] == pytest.approx(0.6e-3, rel=1e-4)
    assert alone["backward"]["per_unit_s"] == pytest.approx(0, abs=1e-12)
    assert alone["update"]["per_tensor_s"] == pytest.approx(3e-5, rel=1e-9)
    assert len(entry["variants"]) == 4 and entry["variants"][0]["fsdp_forward_s"]["n"] == 6  # 2 ranks × 3 steps
    assert entry["forward"]["per_unit_s"] == pytest.approx(1.2e-3, rel=1e-4)
    assert entry["forward"]["per_byte_s"] == pytest.approx(5e-10, rel=1e-4)
    assert entry["forward"]["per_tensor_s"] == pytest.approx(0, abs=1e-9)
    assert entry["backward"]["per_unit_s"] == pytest.approx(2.4e-3, rel=1e-4)
    assert entry["update"]["per_tensor_s"] == pytest.approx(3e-5, rel=1e-9)
    # the machine model reads it back
    machine = MachineModel.from_dict(_cpu(fsdp_units=[alone, entry]))
    costs = machine.fsdp_units_for(ranks=2, nodes=1)
    assert costs.forward_s(4, 1e6) == pytest.approx(1.2e-3 + 5e-10 * 1e6, rel=1e-4)
    assert machine.fsdp_units_for(ranks=4, nodes=1) is costs  # the nearest sharded one, never the one-rank's
    assert machine.fsdp_units_for(ranks=1, nodes=1).ranks == 1
    assert MachineModel.from_dict(_cpu(fsdp_units=[entry])).fsdp_units_for(ranks=1, nodes=1) is None


UNIT = {"per_unit_s": 2e-3, "per_tensor_s": 1e-5, "per_byte_s": 1e-9}


def test_the_fsdp_model_adds_the_calibrated_cost_of_each_unit_beyond_its_collectives():
    """Two ranks on two cores (no core left to communicate): every part runs one after another, so the step
    grows by exactly what the calibration adds beyond the collectives' fits at the same group."""
    entry = {"ranks": 2, "nodes": 1, "forward": UNIT, "backward": {k: 2 * v for k, v in UNIT.items()},
             "update": {"per_tensor_s": 3e-5}, "point_id": "fsdp_units-n1x2"}  # fmt: skip
    without = MachineModel.from_dict(_cpu())
    with_units = MachineModel.from_dict(_cpu(fsdp_units=[entry]))
    point = Setting(model="resnet20", dataset="cifar10", strategy="fsdp", nodes=1, ranks_per_node=2, batch_size=32)
    base = predict(point, without, search_batch=False)
    calibrated = predict(point, with_units, search_batch=False)
    assert any("not calibrated" in note for note in base.notes)
    assert any("fsdp_units-n1x2" in note for note in calibrated.notes)

    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    params, tensors = block_params(table), block_tensors(table)
    assert sum(tensors) == sum(1 for p in table_parameters(table))

    def collective(op: str, nbytes: float) -> float:
        return without.collective(op, ranks=2, nodes=1).time_s(nbytes)

    added = 0.0
    last = len(params) - 1
    for i, count in enumerate(params):
        if count:
            nbytes = 4 * count
            added += UNIT["per_unit_s"] + UNIT["per_tensor_s"] * tensors[i] + UNIT["per_byte_s"] * nbytes
            added -= collective("all_gather", nbytes)
            added += 2 * (UNIT["per_unit_s"] + UNIT["per_tensor_s"] * tensors[i] + UNIT["per_byte_s"] * nbytes)
            added -= collective("reduce_scatter", nbytes) + (collective("all_gather", nbytes) if i < last else 0)
    added += 3e-5 * sum(tensors)
    assert added > 0.1 * base.step_time_s  # large enough to see
    assert calibrated.step_time_s - base.step_time_s == pytest.approx(added, rel=1e-6)
    # four ranks: the toy's two-rank costs are the nearest; the model still prices four ranks' collectives
    four = predict(replace(point, ranks_per_node=4), with_units, search_batch=False)
    assert four.step_time_s > 0 and any("p=2" in note for note in four.notes)


def table_parameters(table):
    """The model's parameter tensors, counted from the model itself (the table counts them from its layers)."""
    import torch

    from ddlbench.catalog import DATASETS, MODELS, resolve_builder

    model_spec, dataset = MODELS.get(table.model), DATASETS.get(table.dataset)
    with torch.device("meta"):
        model = resolve_builder(model_spec.builder)(
            sample_shape=dataset.sample_shape, num_outputs=dataset.num_outputs, **dict(table.options),
            **dict(model_spec.shape),
        )  # fmt: skip
    return list(model.parameters())


@pytest.mark.slow
def test_calibrate_times_fsdp2_on_real_ranks(tmp_path):
    suite = ONLY_FSDP | {
        "name": "fsdp",
        "results_dir": str(tmp_path / "results"),
        "nodes": [1],
        "ranks_per_node": 2,
        "collectives": ["all_gather", "reduce_scatter"],
        "message_bytes": [4096, 65536, 1048576],
        "warmup": 2,
        "iterations": 3,
        "oversubscribe": True,
    }
    out = tmp_path / "machine.yaml"
    ran = run_cli("calibrate", "--config-json", json.dumps(suite), "--out", str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    machine = read_machine(out)
    entry, alone = machine["fsdp_units"]
    assert (entry["ranks"], entry["nodes"]) == (2, 1) and len(entry["variants"]) == 4
    assert (alone["ranks"], alone["nodes"]) == (1, 1) and len(alone["variants"]) == 4
    for variant in entry["variants"]:
        assert variant["fsdp_forward_s"]["n"] == 2 * 20  # both ranks, at least MIN_STEPS steps each
        # sharding adds all-gathers (and in backward reduce-scatters) to the same arithmetic: never cheaper
        assert variant["forward_extra_per_unit_s"] > 0 and variant["backward_extra_per_unit_s"] > 0
    assert entry["forward"]["per_unit_s"] + entry["forward"]["per_byte_s"] * 1e6 > 0
    # a peer to wait for costs more than the hooks alone: two ranks' units against one rank's, per unit
    two = sum(v["forward_extra_per_unit_s"] + v["backward_extra_per_unit_s"] for v in entry["variants"])
    one = sum(v["forward_extra_per_unit_s"] + v["backward_extra_per_unit_s"] for v in alone["variants"])
    assert two > one, (two, one)
    report = (tmp_path / "results" / "fsdp" / "calibration" / "report.html").read_text()
    assert "FSDP2: what sharding adds per unit" in report


def test_fsdp_on_one_rank_pays_its_hooks_and_copies_but_no_collective():
    """One rank: no peer, so nothing is taken off; the step grows by the one-rank toy's cost of every unit."""
    alone = {"ranks": 1, "nodes": 1, "forward": UNIT, "backward": UNIT, "update": {"per_tensor_s": 2e-5}}
    sharded = {"ranks": 2, "nodes": 1, "forward": {"per_unit_s": 1.0}, "backward": {}, "update": {}}
    point = Setting(model="resnet20", dataset="cifar10", strategy="fsdp", nodes=1, ranks_per_node=1, batch_size=32)
    base = predict(point, MachineModel.from_dict(_cpu(fsdp_units=[sharded])), search_batch=False)
    assert any("not calibrated" in note for note in base.notes)  # a two-rank toy holds collectives: not used
    calibrated = predict(point, MachineModel.from_dict(_cpu(fsdp_units=[sharded, alone])), search_batch=False)
    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    params, tensors = block_params(table), block_tensors(table)
    unit = [
        UNIT["per_unit_s"] + UNIT["per_tensor_s"] * t + UNIT["per_byte_s"] * 4 * c
        for c, t in zip(params, tensors, strict=True)
    ]
    added = 2 * sum(u for u, c in zip(unit, params, strict=True) if c) + 2e-5 * sum(tensors)
    assert calibrated.comm_s == 0 == base.comm_s
    assert calibrated.step_time_s - base.step_time_s == pytest.approx(added, rel=1e-6)
