"""tests/chaos.py, the probe that decides which equivalence fixtures are compared in float64: it must find
a fixture that is chaotic in float32 and pass the same fixture in float64, or its verdicts mean nothing."""

from __future__ import annotations

import pytest
import torch

from tests.chaos import FIT_SHARE, perturbed_ratios
from tests.equivalence import layout_point

# spatial resnet8 with BatchNorm over 8 samples: its real float32 run ended 0.65 bounds away on AVX2
# kernels and 1/500 on scalar ones (test_strategy_spatial.py)
CHAOTIC = dict(strategy="spatial", nodes=1, ranks_per_node=2, batch_size=8, model_options=(("norm", "batch"),))


@pytest.mark.slow
def test_the_probe_finds_a_chaotic_float32_fixture_and_passes_it_in_float64():
    point = layout_point(**CHAOTIC)
    float32 = perturbed_ratios(point, forward=True, seeds=2)
    # a ReLU gate flips under one rounding of noise: the run lands bounds away, far beyond what rounding does
    assert min(float32) > 1, float32
    float64 = perturbed_ratios(point, dtype=torch.float64, forward=True, seeds=2)
    assert max(float64) < FIT_SHARE, float64
