"""A real 2-rank DDP run (local launcher, gloo) against a single process over the same global batch."""

from __future__ import annotations

import pytest
import torch

from ddlbench.launch.runner import run_point
from ddlbench.train.kernel import build_model
from tests.conftest import make_point
from tests.reference import train_reference

# float32 all-reduce sums gradients in another order than one big batch does; after a few SGD steps
# the parameters agree to ~1e-7 in practice. These bounds leave room for that and nothing more.
RTOL, ATOL = 1e-4, 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    ("norm", "shards"),
    [
        ("group", 1),  # GroupNorm: the split batch computes exactly what one full batch does
        ("batch", 2),  # BatchNorm: each rank normalises its own half, so the reference does too
    ],
)
def test_two_rank_ddp_matches_single_process(tmp_path, norm, shards):
    point = make_point(nodes=2, batch_size=8, warmup_steps=1, steps=3, model_options=(("norm", norm),))
    params_path = tmp_path / "params.pt"
    record = run_point(point, out=tmp_path / "record.json", launcher="local", dump_params=params_path)
    assert record.status == "ok", record.reason
    assert len(record.ranks) == 2 and record.metrics.global_batch_size == 16

    got = torch.load(params_path)
    want, want_losses = train_reference(point, shards=shards)
    initial = build_model(point).state_dict()
    names = [name for name, _ in build_model(point).named_parameters()]
    for name in names:
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")
    moved = max((got[name] - initial[name]).abs().max().item() for name in names)
    assert moved > 1e-3, "training did not move the parameters; the comparison would prove nothing"
    # the recorded loss is the mean over ranks, which is the global-batch loss
    assert record.metrics.loss_first == pytest.approx(want_losses[0], rel=1e-5)
    assert record.metrics.loss_last == pytest.approx(want_losses[-1], rel=1e-4)


@pytest.mark.slow
def test_reference_check_is_sensitive_to_the_data_split(tmp_path):
    """One rank with half the global batch must not pass for the two-rank run: the check can fail."""
    point = make_point(nodes=2, batch_size=8, model_options=(("norm", "group"),))
    half = make_point(nodes=1, batch_size=8, model_options=(("norm", "group"),))
    record = run_point(half, out=tmp_path / "record.json", launcher="local", dump_params=tmp_path / "p.pt")
    assert record.status == "ok"
    got = torch.load(tmp_path / "p.pt")
    want, _ = train_reference(point)
    assert any(
        not torch.allclose(got[n], want[n], rtol=RTOL, atol=ATOL) for n, _ in build_model(point).named_parameters()
    )
