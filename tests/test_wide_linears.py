"""A classifier's Linears past the caches: the calibration draws them last (every draw before them stays as it
was), times them with the caches emptied before each call (as a step reads such weights from memory), and a
linear fit given them predicts classifier Linears it never timed, which a fit of the cached weights alone misses."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from ddlbench.analysis.analytic.operators import KNOT_SAMPLES, call_of_sample, fit_kind
from ddlbench.train.calibration import operator_kernel, operator_shapes
from ddlbench.train.calibration.kernels import Timer
from ddlbench.train.calibration.operator_shapes import (
    LARGE_ELEMENTS,
    ONE_ROW_WEIGHTS,
    WIDE_LINEAR_LEAST_WEIGHTS,
    OperatorShape,
    largest_elements,
    one_row_linear_count,
    sample_shapes,
    wide_linear_count,
)
from tests.test_analytic_operators import _timed

BOUNDS = {"max_flop": 1.5e9, "max_elements": 2**23}
PER_KIND = 40


def test_classifier_linears_are_drawn_last_past_the_caches_and_leave_every_other_draw_as_it_was(monkeypatch):
    monkeypatch.setattr(operator_shapes, "broad_map_count", lambda per_kind: 0)  # drawn after them
    monkeypatch.setattr(operator_shapes, "one_row_linear_count", lambda per_kind: 0)
    drawn = sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    with monkeypatch.context() as patch:
        patch.setattr(operator_shapes, "wide_linear_count", lambda per_kind: 0)
        before = operator_shapes.sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    count = wide_linear_count(PER_KIND)
    assert count >= 16 and drawn[: len(before)] == before and len(drawn) == len(before) + count
    tail = drawn[len(before) :]
    assert all(s.kind == "linear" and s.height == 1 and s.width == 1 for s in tail)  # a head's rows: the batch
    assert all(WIDE_LINEAR_LEAST_WEIGHTS <= s.linear_weights <= LARGE_ELEMENTS * BOUNDS["max_elements"] for s in tail)
    assert all(s.forward_flop <= operator_shapes.WIDE_CONV_FLOP * BOUNDS["max_flop"] for s in tail)
    assert all(largest_elements(s) <= BOUNDS["max_elements"] for s in tail)
    # few rows and many, so the fit sees the weights' traffic and the products past them both
    assert min(s.batch for s in tail) <= 2 and max(s.batch for s in tail) >= 16
    # the other linear draws reach these weights on a classifier's rows too seldom for a knot past them
    others = [s for s in before if s.height == 1 and s.linear_weights >= WIDE_LINEAR_LEAST_WEIGHTS]
    assert len(others) < KNOT_SAMPLES <= count
    # a quick calibration's few shapes draw none
    assert wide_linear_count(8) == 0


def test_one_row_linears_are_drawn_last_past_vggs_classifier_and_leave_every_other_draw_as_it_was(monkeypatch):
    """A pipeline's micro-batch of one sample runs its Linears on one row (operators.single_row): the calibration
    draws them after everything else, half a classifier's wide Linear and half a narrow head, on past vgg's
    103 M weights for the widest."""
    drawn = sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    with monkeypatch.context() as patch:
        patch.setattr(operator_shapes, "one_row_linear_count", lambda per_kind: 0)
        before = operator_shapes.sample_shapes(seed=0, per_kind=PER_KIND, **BOUNDS)
    count = one_row_linear_count(PER_KIND)
    assert count == wide_linear_count(PER_KIND) and drawn[: len(before)] == before
    tail = drawn[len(before) :]
    assert len(tail) == count and all(s.kind == "linear" and s.batch * s.height * s.width == 1 for s in tail)
    assert all(s.linear_weights <= ONE_ROW_WEIGHTS * BOUNDS["max_elements"] for s in tail)
    wide = tail[::2]
    assert all(1024 <= s.in_channels <= 25088 and 1000 <= s.out_channels <= 4096 for s in wide)
    assert all(s.out_channels <= 1000 for s in tail[1::2])
    # the wide ones past the caches, the narrow ones within them: the weights' traffic and the call both
    assert sum(s.linear_weights >= WIDE_LINEAR_LEAST_WEIGHTS for s in wide) >= len(wide) // 2
    assert sum(s.linear_weights < 2**20 for s in tail[1::2]) >= len(wide) // 2
    assert one_row_linear_count(8) == 0


def test_the_kernel_empties_the_caches_before_each_call_of_a_cold_linear_only(monkeypatch):
    evictions = []
    monkeypatch.setattr(operator_kernel, "evict_caches", lambda device: evictions.append(device.type))
    timer = Timer(torch.device("cpu"))

    def timed(shape: OperatorShape) -> dict:
        return operator_kernel.time_operator(
            shape, torch.device("cpu"), timer, warmup=1, iterations=2, autocast=contextlib.nullcontext
        )

    side = math.isqrt(WIDE_LINEAR_LEAST_WEIGHTS)
    cold = OperatorShape(kind="linear", batch=2, in_channels=side, out_channels=side, height=1, width=1)
    entry = timed(cold)
    # forward and backward: one eviction before each of the warm-up and timed calls
    assert len(entry["forward_s"]) == len(entry["backward_s"]) == 2 and evictions == ["cpu"] * 6
    evictions.clear()
    warm = OperatorShape(kind="linear", batch=2, in_channels=side, out_channels=side // 2, height=1, width=1)
    timed(warm)
    assert evictions == []


def test_evicting_writes_a_buffer_past_the_last_level_cache():
    operator_kernel.evict_caches(torch.device("cpu"))
    (buffer,) = operator_kernel._evict
    assert buffer.numel() * buffer.element_size() == operator_kernel.EVICT_BYTES >= 300 * 2**20
    buffer.fill_(1.0)
    operator_kernel.evict_caches(torch.device("cpu"))
    assert operator_kernel._evict == [buffer]  # kept, not allocated anew (its first touch would be timed too)
    assert float(buffer.abs().max()) == 0.0  # and written again, every element


def _cold_law(call, batch: int) -> tuple[float, float]:
    """A Linear whose rate rises as √rows up to 256 rows, with its traffic; a weight past 2^22 elements (16 MiB,
    out of the cache) costs 1 ns more forward (read from memory) and 2.5 backward (read, and its gradient
    written)."""
    rows = batch * call.rows
    weights = call.in_channels * call.out_channels
    flop = 2.0 * weights * rows
    efficiency = min(1.0, math.sqrt(rows / 256))
    traffic = (call.in_channels + call.out_channels) * rows + weights
    forward = 20e-6 + flop / (150e9 * efficiency) + traffic * 1e-9
    backward = 40e-6 + 2 * flop / (140e9 * efficiency) + 2 * traffic * 1e-9
    if weights >= WIDE_LINEAR_LEAST_WEIGHTS:
        forward += weights * 1e-9
        backward += weights * 2.5e-9
    return forward, backward


def test_a_linear_fit_given_classifier_linears_predicts_ones_it_never_timed():
    def linears(seed: int) -> list[OperatorShape]:
        return [s for s in sample_shapes(seed=seed, per_kind=PER_KIND, **BOUNDS) if s.kind == "linear"]

    # the classifier draws, before the one-row Linears drawn last (their fit's terms are their own: single_row)
    wide, one_row = wide_linear_count(PER_KIND), one_row_linear_count(PER_KIND)
    drawn, unseen = linears(0), linears(7)[-wide - one_row : -one_row]
    # alexnet's and vgg's classifier weights at a classifier's batches, beside another draw's
    unseen += [
        OperatorShape(kind="linear", batch=b, in_channels=i, out_channels=4096, height=1, width=1)
        for i in (4096, 9216)
        for b in (4, 8, 24)
    ]

    def errors(samples) -> list[np.ndarray]:
        out = []
        for direction, index in (("forward", 0), ("backward", 1)):
            fit = fit_kind("linear", direction, samples)
            predicted = [fit.seconds(call_of_sample(s.to_dict()), s.batch) for s in unseen]
            truth = [_cold_law(call_of_sample(s.to_dict()), s.batch)[index] for s in unseen]
            out.append(np.abs(np.array(predicted) / np.array(truth) - 1))
        return out

    for error in errors(_timed(drawn, _cold_law, noise=0.05, seed=1)):
        assert np.median(error) < 0.04 and np.max(error) < 0.1  # within the timings' ± 5 %, nearly
    # without the classifier draws the fit has a few large weights at a classifier's rows and the token rows' to
    # go on: it misses these by twice as much or more (7.6 % in the median, 17 % at worst: alexnet's and vgg's
    # 0.85 at 24 rows)
    without = drawn[: -wide - one_row]  # nor the one-row ones after them
    for error in errors(_timed(without, _cold_law, noise=0.05, seed=1)):
        assert np.median(error) > 0.05 and np.max(error) > 0.15
