"""A real 2-rank DDP run (local launcher, gloo) against a single process over the same global batch."""

from __future__ import annotations

import pytest
import torch

from ddlbench.launch.runner import run_point
from ddlbench.train.kernel import build_model
from tests.conftest import make_point
from tests.equivalence import assert_beyond_rounding, check_against_reference, parameter_names, rounding_bound
from tests.reference import train_reference


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("norm", "shards", "threads"),
    [
        # The reference runs each rank's half apart and averages their gradients (shards=2), so each sample's
        # forward is the same sums at the same batch size on both sides, whatever a CPU's kernels do with
        # the batch size (oneDNN's SSE4.1 convolutions on one host round a sample otherwise in a batch of 4
        # than in one of 8). GroupNorm: the same step as one full batch in exact arithmetic.
        ("group", 2, 1),
        # BatchNorm: each rank normalises its own half, so the reference does too
        pytest.param("batch", 2, 1, marks=pytest.mark.equivalence_sse),
        # two intra-op threads on each rank and in the reference: other groupings of every sum
        pytest.param("group", 2, 2, id="group-2-threads2"),
    ],
)
def test_two_rank_ddp_matches_single_process(tmp_path, norm, shards, threads):
    # the all-reduce sums the ranks' gradients in another order than one big batch does: within the
    # rounding bound of tests/equivalence.py, and the recorded loss (the mean over ranks) is the
    # global batch's
    record = check_against_reference(
        tmp_path,
        nodes=2,
        batch_size=8,
        warmup_steps=1,
        steps=3,
        threads=threads,
        model_options=(("norm", norm),),
        shards=shards,
    )
    assert len(record.ranks) == 2 and record.metrics.global_batch_size == 16


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_reference_check_is_sensitive_to_the_data_split(tmp_path):
    """One rank with half the global batch must not pass for the two-rank run: the check can fail."""
    point = make_point(nodes=2, batch_size=8, model_options=(("norm", "group"),))
    half = make_point(nodes=1, batch_size=8, model_options=(("norm", "group"),))
    record = run_point(half, out=tmp_path / "record.json", launcher="local", dump_params=tmp_path / "p.pt")
    assert record.status == "ok"
    got = torch.load(tmp_path / "p.pt")
    want, _ = train_reference(point)
    model = build_model(point)
    names = parameter_names(model)
    assert_beyond_rounding(got, {n: want[n] for n in names}, model.state_dict(), rounding_bound(point, model))
