"""Spatial parallelism's own cost per slab layer: the calibration's toy (on slabs against alone on one slab),
its fit, and what the spatial model does with it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import cpu_machine_data as _cpu
from conftest import leave_spawned_rank

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import predict
from ddlbench.analysis.machine.spatial_layers import spatial_layer_figures
from ddlbench.calibrate.suite import load_suite
from ddlbench.errors import ConfigError
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import CalibrationRankResult, CalibrationRecord

ONLY_SPATIAL = {"collectives": [], "matmul_sizes": [], "conv_shapes": [], "memory_bytes": 0, "spatial_layers": True}


def test_spatial_layers_expand_like_the_collectives_and_only_when_asked():
    suite = load_suite(raw=ONLY_SPATIAL | {"nodes": [1, 2], "ranks_per_node": 2})
    assert [(p.benchmark, p.nodes, p.ranks_per_node) for p in suite.points] == [
        ("spatial_layers", 1, 2),
        ("spatial_layers", 2, 1),
    ]
    assert CalibrationPoint.from_dict(json.loads(suite.points[0].to_json())) == suite.points[0]
    assert "spatial_layers" not in {p.benchmark for p in load_suite(raw={"collectives": [], "nodes": [1]}).points}
    with pytest.raises(ConfigError, match="spatial_layers"):
        load_suite(raw=ONLY_SPATIAL | {"spatial_layers": "yes"})


VARIANTS = ((16, 16), (64, 16), (16, 64), (8, 512))


def _rank(rank: int, *, per_layer: float, per_byte: float) -> CalibrationRankResult:
    """A rank whose toy on slabs takes `per_layer + per_byte·slab bytes` more a unit forward (three times that
    backward) than alone on its slab."""
    measurements = []
    for channels, side in VARIANTS:
        slab_bytes = 2 * channels * (side // 2) * side * 4
        extra = per_layer + per_byte * slab_bytes
        alone = {"forward_s": [0.001, 0.002, 0.003], "backward_s": [0.002] * 3}
        slabs = {
            "forward_s": [t + 8 * extra + rank * 1e-9 for t in alone["forward_s"]],
            "backward_s": [t + 8 * 3 * extra for t in alone["backward_s"]],
        }
        measurements.append(
            {"kind": "spatial_layers", "units": 8, "channels": channels, "side": side, "batch": 2, "parts": 2,
             "slab_bytes": slab_bytes, "halo_bytes": 2 * channels * side * 4, "alone": alone, "slabs": slabs}
        )  # fmt: skip
    return CalibrationRankResult(
        rank=rank, hostname="h", device="cpu", device_name="", backend="gloo", library="gloo", torch_version="2.13",
        threads=1, cpus=(rank,), measurements=tuple(measurements),
    )  # fmt: skip


def test_figures_take_the_toys_excess_per_layer_and_fit_it():
    point = load_suite(raw=ONLY_SPATIAL | {"nodes": [1], "ranks_per_node": 2}).points[0]
    ranks = tuple(_rank(r, per_layer=2.5e-3, per_byte=4e-10) for r in (0, 1))
    record = CalibrationRecord(
        point_id=point.point_id, point=point, status="ok", reason=None, launcher="local", start_time="", end_time="",
        ranks=ranks,
    )  # fmt: skip
    entry = spatial_layer_figures(record)
    assert (entry["ranks"], entry["nodes"], entry["layout"]) == (2, 1, "1x2")
    assert len(entry["variants"]) == 4 and entry["variants"][0]["slabs_forward_s"]["n"] == 6  # 2 ranks × 3 steps
    assert entry["forward"]["per_layer_s"] == pytest.approx(2.5e-3, rel=1e-4)
    assert entry["forward"]["per_byte_s"] == pytest.approx(4e-10, rel=1e-4)
    assert entry["backward"]["per_layer_s"] == pytest.approx(7.5e-3, rel=1e-4)
    assert entry["backward"]["per_byte_s"] == pytest.approx(1.2e-9, rel=1e-4)
    machine = MachineModel.from_dict(_cpu(spatial_layers=[entry]))
    costs = machine.spatial_layers_for(ranks=2, nodes=1)
    assert costs.forward_s(1e6) == pytest.approx(2.5e-3 + 4e-10 * 1e6, rel=1e-4)
    assert machine.spatial_layers_for(ranks=4, nodes=1) is costs  # the nearest
    assert MachineModel.from_dict(_cpu()).spatial_layers_for(ranks=2, nodes=1) is None
    # the calibration's report shows the variants' excess per layer and the fit
    from ddlbench.calibrate.report import render_calibration

    provenance = {"measured_at": "t", "suite": "s", "hosts": ["h"], "cpu_model": "c", "torch_version": "2.13",
                  "ddlbench_version": "0", "git_commit": "0", "failed_points": []}  # fmt: skip
    provenance |= {"compute": {}, "links": {}}  # no rates or links to tabulate
    machine = _cpu(spatial_layers=[entry]) | provenance
    html = render_calibration(machine | {"device": machine["device"] | {"name": "cpu"}})
    assert "Spatial parallelism: what a slab layer adds" in html
    assert "2.5 ms + 0.4 ms/MB · bytes" in html and "7.5 ms + 1.2 ms/MB · bytes" in html


def _halo_conv_inputs(batch: int) -> list[tuple[int, ...]]:
    """The input shape of every 3×3 convolution of resnet20 on CIFAR-10 followed by a batch norm, read off the
    model itself (hooks on a real forward), in the order they run."""
    from ddlbench.catalog import DATASETS, MODELS, resolve_builder

    spec, dataset = MODELS.get("resnet20"), DATASETS.get("cifar10")
    model = resolve_builder(spec.builder)(
        sample_shape=dataset.sample_shape, num_outputs=dataset.num_outputs, norm="batch", **dict(spec.shape)
    )
    modules = list(model.named_modules())
    paired = {
        name
        for (name, module), (_, after) in itertools.pairwise(modules)
        if isinstance(module, torch.nn.Conv2d)
        and module.kernel_size == (3, 3)
        and isinstance(after, torch.nn.BatchNorm2d)
    }
    shapes: list[tuple[int, ...]] = []
    for name, module in modules:
        if name in paired:
            module.register_forward_hook(lambda _m, args, _out: shapes.append(tuple(args[0].shape)))
    with torch.no_grad():
        model(torch.zeros(batch, *dataset.sample_shape))
    return shapes


def test_the_spatial_model_adds_the_calibrated_cost_of_each_halo_layer():
    """Two ranks on two cores run one blocking sequence: each 3×3 convolution with its batch norm adds exactly the
    calibrated per-layer cost forward and backward, at its own slab's bytes; the model's own costs of those layers'
    halos, copies and norm collectives are replaced, not added to."""
    point = Setting(
        model="resnet20", dataset="cifar10", strategy="spatial", nodes=1, ranks_per_node=2, batch_size=8, split=2
    )

    def step(forward: tuple[float, float], backward: tuple[float, float]) -> float:
        entry = {
            "ranks": 2,
            "nodes": 1,
            "point_id": "spatial_layers-n1x2",
            "forward": {"per_layer_s": forward[0], "per_byte_s": forward[1]},
            "backward": {"per_layer_s": backward[0], "per_byte_s": backward[1]},
        }
        result = predict(point, MachineModel.from_dict(_cpu(spatial_layers=[entry])), search_batch=False)
        assert any("spatial_layers-n1x2" in note for note in result.notes)
        return result.step_time_s

    shapes = _halo_conv_inputs(8)
    assert len(shapes) == 19  # the stem and both convolutions of each of 9 blocks
    slab_bytes = [c * (h // 2) * w * n * 4 for n, c, h, w in shapes]
    zero = step((0.0, 0.0), (0.0, 0.0))
    assert step((1e-3, 0.0), (2e-3, 0.0)) - zero == pytest.approx(19 * 3e-3, rel=1e-6)
    assert step((0.0, 1e-9), (0.0, 0.0)) - zero == pytest.approx(1e-9 * sum(slab_bytes), rel=1e-6)
    # without the entry the halos, copies and norm collectives are costed one by one: more than the zero entry
    plain = predict(point, MachineModel.from_dict(_cpu()), search_batch=False)
    assert plain.step_time_s > zero
    assert not any("spatial's halo layers" in note for note in plain.notes)


def _toy_ranks(rank: int, world: int, store: str, out: str) -> None:
    from ddlbench.train.calibration import spatial_layer_kernel as kernel

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        # the toy on slabs computes what the toy computes on the whole batch (its norms' statistics shared)
        side, channels = 16, 8
        whole = torch.randn(2, channels, side, side, generator=torch.Generator().manual_seed(1))
        rows = side // world
        reference = kernel.toy(channels, torch.device("cpu"))(whole)
        slab_out = kernel.on_slabs(kernel.toy(channels, torch.device("cpu")), side)(
            whole.narrow(2, rank * rows, rows).contiguous()
        )
        gathered = [torch.empty_like(slab_out) for _ in range(world)]
        dist.all_gather(gathered, slab_out.detach())
        error = (torch.cat(gathered, dim=2) - reference.detach()).abs().max().item()
        kernel.VARIANTS, kernel.MIN_STEPS = ((8, 16), (4, 32)), 3
        point = CalibrationPoint(suite="t", benchmark="spatial_layers", backend="", nodes=1, ranks_per_node=world,
                                 threads=1, warmup=1, iterations=3, timeout_s=60, precisions=("fp32",))  # fmt: skip
        entries = kernel.run_spatial_layers(point, torch.device("cpu"))
        Path(out, f"{rank}.json").write_text(json.dumps({"error": error, "entries": entries}))
    finally:
        dist.destroy_process_group()
    leave_spawned_rank()


def test_the_toy_on_slabs_matches_the_whole_and_costs_more_than_alone(tmp_path):
    mp.spawn(_toy_ranks, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        # float32 through 8 units of a 3×3 convolution and a norm: slab and whole sum in different orders
        assert result["error"] < 1e-4, result["error"]
        assert [(e["channels"], e["side"]) for e in result["entries"]] == [(8, 16), (4, 32)]
        for entry in result["entries"]:
            assert entry["slab_bytes"] == 2 * entry["channels"] * (entry["side"] // 2) * entry["side"] * 4
            assert len(entry["slabs"]["forward_s"]) == len(entry["alone"]["backward_s"]) == 3
            # two blocking calls a unit forward (the halo, the norm's statistics), none alone
            assert min(entry["slabs"]["forward_s"]) > min(entry["alone"]["forward_s"])
