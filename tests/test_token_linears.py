"""The calibration's linear shapes over a transformer's tokens: drawn last, so every draw before them is what it
was; each is the call a transformer's Linear makes (rows = batch × tokens, the table's FLOPs); the kernel times it
on a (batch, tokens, features) input, as the model holds it; and a linear fit given them predicts token-row calls
it never timed, which a fit of the heads' rows (1-256) alone extrapolates to."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

from ddlbench.analysis.analytic.operators import call_of_sample, fit_kind, layer_call
from ddlbench.analysis.analytic.table_cache import find_table
from ddlbench.train.calibration import operator_shapes
from ddlbench.train.calibration.operator_shapes import (
    OperatorShape,
    broad_map_count,
    largest_elements,
    one_row_linear_count,
    sample_shapes,
    token_linear_count,
    wide_linear_count,
)
from tests.test_analytic_operators import _timed

BOUNDS = {"max_flop": 1.5e9, "max_elements": 2**23}
PER_KIND = 40


def _token_linears(seed: int) -> list[OperatorShape]:
    # drawn last but for the classifier Linears (tests/test_wide_linears.py)
    wide = wide_linear_count(PER_KIND)
    after = broad_map_count(PER_KIND) + one_row_linear_count(PER_KIND)  # drawn after them
    drawn = sample_shapes(seed=seed, per_kind=PER_KIND, **BOUNDS)[:-after]
    return drawn[-token_linear_count(PER_KIND) - wide : -wide]


def test_token_linears_are_drawn_last_within_bounds_and_leave_every_other_draw_as_it_was(monkeypatch):
    monkeypatch.setattr(operator_shapes, "broad_map_count", lambda per_kind: 0)  # drawn after them
    monkeypatch.setattr(operator_shapes, "one_row_linear_count", lambda per_kind: 0)
    every = sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    monkeypatch.setattr(operator_shapes, "wide_linear_count", lambda per_kind: 0)  # drawn after them
    drawn = operator_shapes.sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    assert drawn == every[: -wide_linear_count(PER_KIND)]
    with monkeypatch.context() as patch:
        patch.setattr(operator_shapes, "TOKEN_LINEAR_SHARE", 0.0)
        before = operator_shapes.sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    assert token_linear_count(PER_KIND) == PER_KIND
    assert drawn[: len(before)] == before and len(drawn) == len(before) + PER_KIND
    tail = drawn[len(before) :]
    assert all(s.kind == "linear" and s.height >= 64 and s.width == 1 for s in tail)
    assert all(s.forward_flop == 2 * s.in_channels * s.out_channels * s.batch * s.height for s in tail)
    assert all(s.forward_flop <= operator_shapes.WIDE_CONV_FLOP * BOUNDS["max_flop"] for s in tail)
    assert all(largest_elements(s) <= BOUNDS["max_elements"] for s in tail)
    # the rows a transformer calls (1,024 on the twenty-ninth and thirtieth sets), past the heads' 1-256
    rows = sorted(s.batch * s.height for s in tail)
    heads = [s.batch for s in before if s.kind == "linear"]
    assert max(heads) <= 256 and all(s.height == 1 for s in before if s.kind == "linear")
    assert rows[0] < 256 and sum(r >= 1024 for r in rows) >= PER_KIND // 4
    # features past 1,024 both ways (an MLP's widening and narrowing)
    assert any(s.in_channels > 1024 for s in tail) and any(s.out_channels > 1024 for s in tail)


def test_a_transformers_linear_is_the_call_the_calibration_times():
    """Every Linear of a GPT's table is a linear call over its tokens, the same call (and FLOPs) as a calibration
    shape of the same features and tokens."""
    table = find_table("gpt_tiny", "tokens_long")
    linears = [layer for layer in table.layers if layer.type == "Linear"]
    assert linears
    for layer in linears:
        call = layer_call(layer.type, layer.input_shape, layer.output_shape, layer.weight_shape)
        tokens = math.prod(layer.input_shape[:-1])
        assert (call.kind, call.rows) == ("linear", tokens) and tokens == 512
        shape = OperatorShape(
            kind="linear",
            batch=1,
            in_channels=layer.input_shape[-1],
            out_channels=layer.output_shape[-1],
            height=tokens,
            width=1,
        )
        assert call_of_sample(shape.to_dict()) == call
        assert shape.forward_flop == layer.forward_flops


def _tiled_law(call, batch: int) -> tuple[float, float]:
    """A GEMM whose rate rises as √rows up to a tile of 256 rows and is flat past it (a law none of the fit's
    regressors spans), FLOPs at 150 GFLOP/s forward and 140 backward at full tiles, plus traffic."""
    rows = batch * call.rows
    weights = call.in_channels * call.out_channels
    flop = 2.0 * weights * rows
    efficiency = min(1.0, math.sqrt(rows / 256))
    traffic = (call.in_channels + call.out_channels) * rows + weights
    forward = 20e-6 + flop / (150e9 * efficiency) + traffic * 1e-9
    backward = 40e-6 + 2 * flop / (140e9 * efficiency) + 2 * traffic * 1e-9
    return forward, backward


def test_a_linear_fit_given_token_rows_predicts_token_calls_it_never_timed():
    drawn = [s for s in sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS) if s.kind == "linear"]
    heads = [s for s in drawn if s.height == 1]
    unseen = [s for s in _token_linears(seed=7) if s.batch * s.height >= 512]
    assert len(unseen) >= 8
    calls = [(call_of_sample(s.to_dict()), s.batch) for s in unseen]
    for direction, index in (("forward", 0), ("backward", 1)):
        errors = {}
        for name, calibrated in (("heads", heads), ("all", drawn)):
            fit = fit_kind("linear", direction, _timed(calibrated, _tiled_law, noise=0.05, seed=1))
            errors[name] = [abs(fit.seconds(call, batch) / _tiled_law(call, batch)[index] - 1) for call, batch in calls]
        # given the token rows: the noise (± 5 %) in the median; the heads alone extrapolate past it
        assert float(np.median(errors["all"])) < 0.05 and max(errors["all"]) < 0.15, direction
        assert float(np.median(errors["heads"])) > 0.10, direction


@pytest.mark.slow
def test_the_calibration_times_a_linear_over_tokens_as_a_transformer_holds_it():
    from ddlbench.train.calibration.kernels import Timer
    from ddlbench.train.calibration.operator_kernel import _input, build_operator, time_operator

    cpu = torch.device("cpu")
    tokens = OperatorShape(kind="linear", batch=2, in_channels=48, out_channels=96, height=40, width=1)
    head = OperatorShape(kind="linear", batch=3, in_channels=48, out_channels=10, height=1, width=1)
    for shape in (tokens, head):
        op, params = build_operator(shape)
        x = _input(shape, torch.Generator().manual_seed(0), cpu)
        y = op(x, None)
        expected = (shape.batch, shape.out_channels) if shape.height == 1 else (2, 40, 96)  # (batch, tokens, out)
        assert tuple(y.shape) == expected and x.requires_grad
        assert sum(p.numel() for p in params) == shape.in_channels * shape.out_channels + shape.out_channels
        timed = time_operator(shape, cpu, Timer(cpu), warmup=1, iterations=2, autocast=contextlib.nullcontext)
        assert len(timed["forward_s"]) == 2 and min(timed["backward_s"]) > 0
