"""A 3-D model's peak memory on a CPU, predicted against a measurement. cosmoflow's blocks are a convolution, a
LeakyReLU and a 2×2×2 max pool: the gradient of the pool's input, and the LeakyReLU's input gradient computed from
it, are each 8 times the block's output gradient, and both are alive while the LeakyReLU's backward runs. The walk
counted a block's input and output gradients only, and cosmoflow's peak came out 0.84 of the measured on 4×32³ at
batch 12 (docs/analytic.md); a block's flowing gradient is now its widest layer's input and output where they exceed
the block's. Peak tensor memory on a CPU is counted exactly (allocator events)."""

from __future__ import annotations

import pytest

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.predict import predict
from ddlbench.launch.runner import run_point
from tests.conftest import make_point
from tests.test_analytic_model import cpu_machine


@pytest.mark.slow
def test_a_volume_models_peak_holds_its_widest_layers_gradients(tmp_path):
    fields = dict(model="cosmoflow", dataset="cosmoflow32", strategy="ddp", nodes=1, ranks_per_node=1, batch_size=8)
    options = (("norm", "none"),)
    point = make_point(**fields, model_options=options, warmup_steps=2, steps=1)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    measured = record.metrics.tensor_peak_bytes
    predicted = predict(Setting(**fields, model_options=options), cpu_machine(), search_batch=False)
    # the first block's two full-size gradients (32 × 32³ × 8 samples × 4 B = 33.6 MB each) against a peak of about
    # 235 MB: without them the prediction was 186 MB (0.79)
    assert predicted.peak_memory_bytes == pytest.approx(measured, rel=0.08)
