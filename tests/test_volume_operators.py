"""A 3-D model's layers (CosmoFlow's) in the analytical model: the calibration draws and times 3-D convolutions and
pools over volumes after every other kind, their fits recover a known cost law and predict volumes they never
timed, a model table's volume layers become those calls, and spatial parallelism's model splits a volume's depth
as the strategy's ranks do."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from torch import nn

from ddlbench.analysis.analytic import operators
from ddlbench.analysis.analytic.layer_splits import _slab_rows
from ddlbench.analysis.analytic.operators import call_of_sample, fit_kind, layer_call
from ddlbench.analysis.analytic.table_cache import find_table
from ddlbench.catalog.layer_table import predict_split_share
from ddlbench.train.calibration import operator_shapes
from ddlbench.train.calibration.operator_shapes import (
    FIRST_LAYER_CHANNELS,
    OPERATOR_KINDS,
    VOLUME_KINDS,
    broad_map_count,
    large_count,
    largest_elements,
    one_row_linear_count,
    sample_shapes,
    token_linear_count,
    wide_linear_count,
)
from tests.test_analytic_operators import _assert_fit_recovers, _conv_law, _paged_law, _timed

BOUNDS = {"max_flop": 1.5e9, "max_elements": 2**23}


def test_volumes_are_drawn_last_within_bounds_and_leave_every_other_draw_as_it_was(monkeypatch):
    drawn = sample_shapes(seed=0, per_kind=40, **BOUNDS)[
        : -token_linear_count(40) - wide_linear_count(40) - broad_map_count(40) - one_row_linear_count(40)
    ]  # less the token rows' linears, the classifier Linears, the full-resolution maps and the one-row Linears, last
    volumes = [s for s in drawn if s.kind in VOLUME_KINDS]
    large = large_count(40)
    assert len(volumes) == 2 * 40 + 40 + 2 * large
    assert all(s.kind in VOLUME_KINDS for s in drawn[-len(volumes) :])  # the tail of the draws before those
    # without the volume kinds the generator draws exactly what comes before them
    with monkeypatch.context() as patch:
        patch.setattr(operator_shapes, "OPERATOR_KINDS", tuple(k for k in OPERATOR_KINDS if k not in VOLUME_KINDS))
        patch.setattr(operator_shapes, "VOLUME_KINDS", ())
        before = operator_shapes.sample_shapes(seed=0, per_kind=40, **BOUNDS)[
            : -token_linear_count(40) - wide_linear_count(40) - broad_map_count(40) - one_row_linear_count(40)
        ]
    assert drawn[: len(before)] == before and len(drawn) == len(before) + len(volumes)
    conv3d = [s for s in volumes if s.kind == "conv3d"]
    within, past = conv3d[: 2 * 40], conv3d[2 * 40 :]
    assert all(s.forward_flop <= BOUNDS["max_flop"] and largest_elements(s) <= 2**23 for s in within)
    assert all(2**23 < largest_elements(s) <= 4 * 2**23 for s in past) and len(past) == large
    # a slab of the depth, a first layer and a strided one are among them, as a model's volume layers are
    assert any(s.depth < s.height for s in within)
    assert any(s.in_channels == FIRST_LAYER_CHANNELS["conv3d"] for s in conv3d)
    assert any(s.stride == 2 for s in within)
    for s in conv3d:
        outs = [(n + 2 * (s.kernel // 2) - s.kernel) // s.stride + 1 for n in (s.depth, s.height, s.width)]
        assert s.out_pixels == math.prod(outs)
        assert s.forward_flop == 2 * s.in_channels * s.out_channels * s.kernel**3 * s.out_pixels * s.batch
    for s in (s for s in volumes if s.kind == "max_pool3d"):
        assert s.out_pixels == (s.depth // 2) * (s.height // 2) * (s.width // 2) and s.forward_flop == 0


def test_a_conv3d_fit_recovers_a_cost_law_and_predicts_volumes_it_never_timed():
    """On conv2d's regressors with P = D·H·W and k³ kernel elements: a law in FLOPs, channels and traffic is
    recovered, and volumes of another draw are predicted from it."""
    calibrated = [s for s in sample_shapes(seed=0, per_kind=40, **BOUNDS) if s.kind == "conv3d"]
    unseen = [s for s in sample_shapes(seed=7, per_kind=40, **BOUNDS) if s.kind == "conv3d"]
    _assert_fit_recovers("conv3d", calibrated, unseen, _conv_law, worst=0.25)


def test_a_volume_pool_finds_its_page_knot_and_predicts_large_volumes_it_never_timed():
    drawn = [s for s in sample_shapes(seed=0, per_kind=40, **BOUNDS) if s.kind == "max_pool3d"]
    unseen = [s for s in sample_shapes(seed=7, per_kind=40, **BOUNDS) if s.kind == "max_pool3d"]
    large = [s for s in unseen if largest_elements(s) > 2**23]
    assert len(large) == large_count(40)
    samples = _timed(drawn, _paged_law, noise=0.05, seed=1)
    for direction, index in (("forward", 0), ("backward", 1)):
        fit = fit_kind("max_pool3d", direction, samples)
        assert fit.page_knot > 0, direction
        errors = [
            abs(fit.seconds(call, s.batch) - _paged_law(call, s.batch)[index]) / _paged_law(call, s.batch)[index]
            for s in large
            for call in [call_of_sample(s.to_dict())]
        ]
        assert np.median(errors) < 0.1, direction


def test_cosmoflows_layers_are_volume_calls_with_the_tables_flops():
    """Each Conv3d of the table is a conv3d call whose FLOPs are the table's; its first takes no input gradient;
    each MaxPool3d a max_pool3d, each LeakyReLU a relu over its D·H·W pixels; the head's Linears stay linear."""
    table = find_table("cosmoflow", "cosmoflow32", (("norm", "none"),))
    kinds = []
    for index, layer in enumerate(table.layers):
        first = index == 0
        call = layer_call(layer.type, layer.input_shape, layer.output_shape, layer.weight_shape, input_grad=not first)
        if layer.type in operators.FREE_TYPES:
            continue
        assert call is not None, layer.name
        kinds.append(call.kind)
        if layer.type == "Conv3d":
            assert call.kernel_elements == 27 and call.input_grad == (not first)
            assert call.in_pixels == math.prod(layer.input_shape[1:])
            weights = call.in_channels * call.out_channels * call.kernel_elements
            assert 2 * weights * call.out_pixels == layer.forward_flops
        elif layer.type == "MaxPool3d":
            assert (call.kind, call.out_pixels * 8) == ("max_pool3d", call.in_pixels)
        elif layer.type == "LeakyReLU" and len(layer.input_shape) == 4:
            assert (call.kind, call.in_pixels) == ("relu", math.prod(layer.input_shape[1:]))
    assert kinds.count("conv3d") == 5 and kinds.count("max_pool3d") == 5 and kinds.count("linear") == 3


def test_a_volume_of_a_kind_with_no_fit_is_left_to_the_roofline():
    grouped = layer_call("Conv3d", (8, 4, 4, 4), (8, 4, 4, 4), (8, 4, 3, 3, 3))  # groups of 2 channels
    assert grouped is None
    assert layer_call("AvgPool3d", (8, 4, 4, 4), (8, 2, 2, 2), ()) is None


def test_spatial_slabs_of_a_volume_are_the_strategys_own():
    """The model's rows for rank 0 of two split a volume's depth (dim 2, as halo.py does): each windowed layer of
    the region on the window the strategy's own arithmetic gives it (halo.geometry of the real module, on the
    depth its input has in a real forward: halo.halo_windows, halo.rank_plan), the halo it receives exchanged,
    every other layer on half the depth."""
    from ddlbench.catalog import DATASETS, MODELS, resolve_builder
    from ddlbench.train.strategies import halo

    table = find_table("cosmoflow", "cosmoflow32", (("norm", "none"),))
    region = predict_split_share("cosmoflow", "cosmoflow32", (("norm", "none"),), "spatial", 2).split
    rows, windows = _slab_rows(list(table.layers), region, 2)
    spec, dataset = MODELS.get("cosmoflow"), DATASETS.get("cosmoflow32")
    model = resolve_builder(spec.builder)(
        sample_shape=dataset.sample_shape, num_outputs=dataset.num_outputs, norm="none", **dict(spec.shape)
    )
    inputs: dict[str, tuple[int, ...]] = {}
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, nn.Conv3d | nn.MaxPool3d | nn.LeakyReLU):
            module.register_forward_hook(lambda _m, args, _out, name=name: inputs.update({name: args[0].shape}))
    with torch.no_grad():
        model(torch.zeros(1, *dataset.sample_shape))
    by_name = {row.name: row for row in rows}
    checked = 0
    for layer in table.layers:
        module, row = modules[layer.name], by_name[layer.name]
        if layer.block >= region:
            assert row == layer, layer.name  # past the region: the whole layer
            continue
        if layer.name not in inputs:
            continue
        depth = inputs[layer.name][2]
        if isinstance(module, nn.Conv3d | nn.MaxPool3d):
            geo = halo.geometry(module)
            plan = halo.halo_windows(depth, 2, kernel=geo.kernel[0], stride=geo.stride[0], padding=geo.padding[0])
            window = plan[0].stop - plan[0].start
            assert row.input_shape == (layer.input_shape[0], window, *layer.input_shape[2:]), layer.name
            received = halo.rank_plan(plan, 0, depth).halo_rows
            assert (windows[layer.name][1] if layer.name in windows else 0) == received, layer.name
            checked += 1
        else:
            assert row.input_shape == (layer.input_shape[0], depth // 2, *layer.input_shape[2:]), layer.name
    assert region >= 4 and checked >= 8 and sum(1 for window in windows.values() if window[1]) >= 4


@pytest.mark.slow
def test_the_calibration_times_volume_operators_as_a_model_holds_them():
    """The kernel builds each volume kind and times it forward and backward; a first layer's input takes no
    gradient; the output is the shape the drawn shape says."""
    from ddlbench.train.calibration.kernels import Timer
    from ddlbench.train.calibration.operator_kernel import _input, build_operator, time_operator

    conv = operator_shapes.OperatorShape(
        kind="conv3d", batch=2, in_channels=8, out_channels=16, depth=6, height=8, width=8, kernel=3, stride=2
    )
    pool = operator_shapes.OperatorShape(kind="max_pool3d", batch=2, in_channels=8, depth=6, height=8, width=8)
    first = operator_shapes.OperatorShape(
        kind="conv3d", batch=1, in_channels=4, out_channels=8, depth=4, height=4, width=4, kernel=3
    )
    cpu = torch.device("cpu")
    for shape in (conv, pool, first):
        op, _ = build_operator(shape)
        x = _input(shape, torch.Generator().manual_seed(0), cpu)
        y = op(x, None)
        channels = shape.out_channels or shape.in_channels
        assert tuple(y.shape) == (shape.batch, channels, shape.out_depth, shape.out_height, shape.out_width)
        assert x.requires_grad == (shape is not first)
        timed = time_operator(shape, cpu, Timer(cpu), warmup=1, iterations=2, autocast=contextlib.nullcontext)
        assert len(timed["forward_s"]) == 2 and min(timed["backward_s"]) > 0
