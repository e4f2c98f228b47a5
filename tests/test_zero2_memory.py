"""zero2's peak memory on gloo, predicted against a measurement: every gradient bucket is held to the end
of backward (its buffer, the reduce-scatter's output and the rank's shard), so the peak is the
parameters, the momentum shard and those buckets once the activations are gone, P·(2 + 3/p) for a model
whose parameters outweigh its activations (alexnet on CIFAR-10: 144 MB of parameters, 5 MB of
activations at batch 2). The old model (one bucket in flight) predicted 59 % of the measured peak at one
rank and 71 % at two. Peak tensor memory on a CPU is counted exactly (allocator events); the slack is
what the model leaves out (the loss, the logits, small temporaries: under 1 %) and the buckets a busy
host finishes early."""

from __future__ import annotations

import pytest

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.predict import predict
from ddlbench.launch.runner import run_point
from tests.conftest import make_point
from tests.test_analytic_model import cpu_machine


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_zero2_peak_on_gloo_is_every_bucket_held_to_the_end_of_backward(tmp_path, ranks):
    point = make_point(model="alexnet", strategy="zero2", ranks_per_node=ranks, batch_size=2, warmup_steps=2, steps=1)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    measured = record.metrics.tensor_peak_bytes
    setting = Setting(model="alexnet", dataset="cifar10", strategy="zero2", nodes=1, ranks_per_node=ranks, batch_size=2)
    predicted = predict(setting, cpu_machine(), search_batch=False)
    # The trainer drops a bucket's buffer once gloo reports its reduce-scatter complete (at the next bucket's
    # launch), so how many are still held when backward ends depends on timing: alone, all of them,
    # P·(2 + 3/p) (measured within 1 % of the model); under the full suite on 2 cores, 3.43 P of 3.5 P at two
    # ranks. The model counts every bucket held: an upper bound (less the loss and logits, under 1 %) that
    # stays within 5 %, where the old one-bucket model was 29–41 % short.
    assert predicted.peak_memory_bytes >= measured * 0.99
    assert predicted.peak_memory_bytes == pytest.approx(measured, rel=0.05)
