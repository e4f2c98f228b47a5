"""The operator fits' local correction (ddlbench.analysis.analytic.operator_residuals): where the timings hold a
region the fit's law cannot follow, the correction learns it from the calibration's shapes near it and predicts
shapes of that region it never timed; elsewhere it leaves the fit as it was. And the calibration's full-resolution
draws of few channels, which give a model's full-resolution layers shapes near them."""

from __future__ import annotations

import math

import numpy as np

from ddlbench.analysis.analytic import operator_residuals
from ddlbench.analysis.analytic.operators import OpCall, call_of_sample, fit_kind
from ddlbench.train.calibration import operator_shapes
from ddlbench.train.calibration.operator_shapes import (
    BROAD_MAP_KINDS,
    FIRST_LAYER_CHANNELS,
    broad_map_count,
    largest_elements,
    sample_shapes,
)
from tests.test_analytic_operators import _conv_law, _timed

BOUNDS = {"max_flop": 1.5e9, "max_elements": 2**23}


def _in_region(call: OpCall) -> bool:
    """Few channels on large maps: what a CIFAR ResNet's first stage runs on a larger image."""
    return max(call.in_channels, call.out_channels) <= 32 and call.out_pixels >= 48 * 48


def _regional_law(call: OpCall, batch: int) -> tuple[float, float]:
    """_conv_law, with the region's shapes taking 0.55× as long: a kernel path no term of the fit's law tells."""
    forward, backward = _conv_law(call, batch)
    factor = 0.55 if _in_region(call) else 1.0
    return forward * factor, backward * factor


def _errors(fit, index: int, shapes) -> np.ndarray:
    out = []
    for shape in shapes:
        call = call_of_sample(shape.to_dict())
        truth = _regional_law(call, shape.batch)[index]
        out.append(abs(fit.seconds(call, shape.batch) - truth) / truth)
    return np.array(out)


def test_a_region_the_law_misses_is_learnt_from_the_shapes_near_it_and_predicted_where_never_timed():
    drawn = [s for s in sample_shapes(seed=0, per_kind=40, **BOUNDS) if s.kind == "conv2d"]
    unseen = [s for s in sample_shapes(seed=7, per_kind=40, **BOUNDS) if s.kind == "conv2d"]
    region = [s for s in unseen if _in_region(call_of_sample(s.to_dict()))]
    elsewhere = [s for s in unseen if not _in_region(call_of_sample(s.to_dict()))]
    assert len(region) >= 8 and sum(_in_region(call_of_sample(s.to_dict())) for s in drawn) >= 5
    samples = _timed(drawn, _regional_law, noise=0.05, seed=1)
    for direction, index in (("forward", 0), ("backward", 1)):
        plain = fit_kind("conv2d", direction, samples, local=False)
        local = fit_kind("conv2d", direction, samples)
        assert plain.correction is None and local.correction is not None, direction
        missed, corrected = np.median(_errors(plain, index, region)), np.median(_errors(local, index, region))
        # one law over every shape, weighted by time, puts the region's short shapes 1.7× too long; the shapes near
        # each unseen one take off a third of that (0.69 → 0.48 forward, 0.72 → 0.52 backward: the region's seven
        # drawn shapes are an e-fold or more from most unseen ones, and the kernel blends the region's edge)
        assert missed > 0.5 and corrected < 0.8 * missed, (direction, missed, corrected)
        # and the shapes elsewhere are predicted no worse than by the fit alone, but for the noise
        assert np.median(_errors(local, index, elsewhere)) < np.median(_errors(plain, index, elsewhere)) + 0.03
        # the correction's own leave-one-out error over the calibration's shapes says so too
        assert local.correction.loo_error_median < plain.loo_error_median


def test_a_call_far_from_every_timed_shape_keeps_the_fits_time():
    drawn = [s for s in sample_shapes(seed=0, per_kind=40, **BOUNDS) if s.kind == "conv2d"]
    samples = _timed(drawn, _regional_law, noise=0.05, seed=1)
    local = fit_kind("conv2d", "forward", samples)
    plain = fit_kind("conv2d", "forward", samples, local=False)
    far = OpCall(kind="conv2d", in_channels=16, out_channels=16, in_pixels=2**24, out_pixels=2**24, kernel_elements=9)
    assert math.isclose(local.seconds(far, 4096), plain.seconds(far, 4096), rel_tol=1e-3)
    # and one amid the region is moved towards the region's 0.55 (an in-region call at a drawn shape's neighbour)
    pixels = 96 * 96
    near = OpCall(
        kind="conv2d", in_channels=16, out_channels=16, in_pixels=pixels, out_pixels=pixels, kernel_elements=9
    )
    assert local.seconds(near, 2) < 0.9 * plain.seconds(near, 2)


def test_no_correction_is_kept_where_the_timings_hold_only_the_laws_noise():
    """Timings that follow the fit's own law, ± 5 %: the neighbours' residuals are noise, and a correction
    chosen by leave-one-out moves a call's time by a few per cent at most (the mean of a few neighbours' noise),
    by under 2 % in the median."""
    drawn = [s for s in sample_shapes(seed=0, per_kind=40, **BOUNDS) if s.kind == "conv2d"]
    samples = _timed(drawn, _conv_law, noise=0.05, seed=1)
    for direction in ("forward", "backward"):
        fit = fit_kind("conv2d", direction, samples)
        if fit.correction is None:
            continue
        factors = [fit.correction.factor(call_of_sample(s.to_dict()), s.batch) for s in drawn]
        moved = [abs(math.log(f)) for f in factors]
        assert float(np.median(moved)) < 0.02 and max(moved) < 0.1, direction


def test_the_correction_picks_its_bandwidth_by_leave_one_out_and_declines_when_nothing_helps():
    rng = np.random.default_rng(0)
    features = rng.uniform(0, 5, size=(60, 6))
    smooth = 0.4 * np.sin(features[:, 0])  # a residual smooth in the shape
    chosen = operator_residuals.fit_correction(features, smooth, smooth)
    assert chosen is not None and (chosen.h, chosen.prior) in operator_residuals.CANDIDATES
    assert chosen.loo_error_mean < float(np.mean(np.abs(np.expm1(smooth))))
    noise = rng.normal(0, 0.1, size=60)  # residuals no neighbour tells anything of
    declined = operator_residuals.fit_correction(features, noise, noise)
    assert declined is None or declined.prior >= 1.0


def test_full_resolution_draws_come_last_within_bounds_and_leave_every_other_draw_as_it_was(monkeypatch):
    monkeypatch.setattr(operator_shapes, "one_row_linear_count", lambda per_kind: 0)  # drawn after them
    every = sample_shapes(seed=0, per_kind=40, **BOUNDS)
    broad = every[-broad_map_count(40) :]
    with monkeypatch.context() as patch:
        patch.setattr(operator_shapes, "broad_map_count", lambda per_kind: 0)
        before = operator_shapes.sample_shapes(seed=0, per_kind=40, **BOUNDS)
    assert every[: len(before)] == before and len(every) == len(before) + broad_map_count(40)
    assert broad_map_count(40) == len(BROAD_MAP_KINDS) * operator_shapes.large_count(40) and broad_map_count(8) == 0
    assert sorted({s.kind for s in broad}) == sorted(BROAD_MAP_KINDS)
    assert all(s.forward_flop <= BOUNDS["max_flop"] and largest_elements(s) <= BOUNDS["max_elements"] for s in broad)
    assert all(56 <= s.width <= 224 and s.height <= s.width for s in broad)
    assert all(s.in_channels <= 64 and s.out_channels <= 128 for s in broad)
    # past every within-bounds draw's 64 a side, below every large map's elements: what neither holds
    assert sum(s.width > 64 for s in broad) >= len(broad) // 2
    conv = [s for s in broad if s.kind == "conv2d"]
    assert any(s.stride == 2 for s in conv) or any(s.in_channels == FIRST_LAYER_CHANNELS["conv2d"] for s in conv)
