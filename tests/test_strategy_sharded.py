"""FSDP2 (ZeRO-3) and the hand-written ZeRO-2 on real ranks (local launcher, gloo) against one process
training on the same global batches, plus the shard sizes each reports."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddlbench.catalog import DATASETS
from ddlbench.launch.runner import run_point
from ddlbench.train.kernel import MOMENTUM, build_model, step_batches
from ddlbench.train.losses import loss_for
from ddlbench.train.models.cifar_resnet import build_resnet8
from ddlbench.train.strategies.sharded import plan_buckets
from tests.equivalence import assert_beyond_rounding, check_against_reference, layout_point, rounding_bound
from tests.reference import train_reference

# Both strategies average gradients with a reduce-scatter that sums the ranks' float32 parts in another
# order than one full-batch backward does; the parameters must end within the rounding bound of
# tests/equivalence.py, whose sums grow with the global batch (measured: at most 1/300 of it, on 2 and 4
# ranks, 1 and 2 threads). A rank's slice left out of the average lands hundreds of bounds away
# (test_four_rank_bound_catches_a_missing_slice).
RESNET8_PARAMETERS = 78_042  # the model's own count, so the facts are checked against an independent figure


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("strategy", "norm", "shards", "threads"),
    [
        # The reference trains on each rank's half apart, their gradients averaged (shards=2): each sample's
        # forward is the same sums at the same batch size on both sides, whatever a CPU's kernels do with
        # the batch size (tests/test_ddp.py). GroupNorm: the same step as the whole batch in exact arithmetic
        ("fsdp", "group", 2, 1),
        ("fsdp", "batch", 2, 1),  # BatchNorm: each rank normalises its own half, so the reference does too
        ("zero2", "group", 2, 1),
        pytest.param("zero2", "batch", 2, 1, marks=pytest.mark.equivalence_sse),
        # two intra-op threads on each rank and in the reference: other groupings of every sum
        pytest.param("zero2", "group", 2, 2, id="zero2-group-2-threads2"),
    ],
)
def test_two_ranks_match_single_process(tmp_path, strategy, norm, shards, threads):
    record = check_against_reference(
        tmp_path,
        strategy=strategy,
        model="resnet8",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=2,
        batch_size=8,
        model_options=(("norm", norm),),
        shards=shards,
        threads=threads,
    )
    facts = [rank.facts for rank in record.ranks]
    assert [f["coords"]["dp"] for f in facts] == [0, 1] and all(f["mesh"] == {"dp": 2} for f in facts)
    assert all(f["total_parameters"] == RESNET8_PARAMETERS for f in facts)
    if strategy == "fsdp":
        # every resnet8 parameter has an even first dimension, so dim-0 sharding splits it exactly in two
        assert [f["local_parameters"] for f in facts] == [RESNET8_PARAMETERS // 2] * 2
        assert all(f["optimizer_state_elements"] == RESNET8_PARAMETERS // 2 for f in facts)
        assert all(f["units"] == 6 and f["reshard_after_forward"] for f in facts)  # 5 blocks + the root
    else:
        # the full model stays on every rank; gradient and momentum are each rank's half
        assert all(f["local_parameters"] == RESNET8_PARAMETERS for f in facts)
        assert all(f["optimizer_state_elements"] == f["shard_elements"] for f in facts)
        assert all(f["shard_elements"] * 2 == RESNET8_PARAMETERS + f["padding_elements"] for f in facts)
        assert all(f["padding_elements"] < 2 * f["buckets"] for f in facts)


@pytest.mark.slow
@pytest.mark.equivalence
def test_zero2_in_small_buckets_on_four_ranks(tmp_path):
    """Four ranks and ~7 buckets: padding per bucket, buckets launched as backward reaches them, and
    each rank's shard made of a slice of every bucket must still compute the reference's update."""
    record = check_against_reference(
        tmp_path,
        strategy="zero2",
        model="resnet8",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=4,
        batch_size=8,  # per rank: a global batch of 32
        model_options=(("norm", "group"),),
        strategy_options=(("bucket_cap_mb", "0.05"),),  # 13,107 fp32 elements
    )
    facts = [rank.facts for rank in record.ranks]
    assert all(f["buckets"] >= 6 for f in facts)
    for f in facts:
        assert f["optimizer_state_elements"] == f["shard_elements"]
        assert f["shard_elements"] * 4 == RESNET8_PARAMETERS + f["padding_elements"]
        assert f["padding_elements"] < 4 * f["buckets"]


@pytest.mark.slow
@pytest.mark.equivalence
def test_fsdp_on_four_ranks(tmp_path):
    """Uneven dim-0 shards (the 10-row head on 4 ranks: 3, 3, 3, 1 rows) still add up to the model."""
    record = check_against_reference(
        tmp_path,
        strategy="fsdp",
        model="resnet8",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=4,
        batch_size=8,
        model_options=(("norm", "group"),),
    )
    local = [rank.facts["local_parameters"] for rank in record.ranks]
    assert sum(local) == RESNET8_PARAMETERS
    # dim-0 chunks of small tensors are uneven; within 1% of an even split
    assert all(abs(n - RESNET8_PARAMETERS / 4) < 0.01 * RESNET8_PARAMETERS for n in local)


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_fsdp_on_gpt_tiny(tmp_path):
    """A transformer: embeddings, attention and MLP blocks as FSDP units, a token-level loss."""
    record = check_against_reference(
        tmp_path,
        strategy="fsdp",
        model="gpt_tiny",
        dataset="tokens_small",
        nodes=1,
        ranks_per_node=2,
        batch_size=4,
        model_options=(),
    )
    facts = [rank.facts for rank in record.ranks]
    assert sum(f["local_parameters"] for f in facts) == facts[0]["total_parameters"]


@pytest.mark.slow
def test_fsdp_runs_under_the_tensor_memory_probe(tmp_path):
    # two warm-up steps: the kernel probes the last one, never the only one
    point = layout_point(strategy="fsdp", nodes=1, ranks_per_node=2, warmup_steps=2, model_options=(("norm", "group"),))
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    assert all(rank.tensor_peak_bytes for rank in record.ranks)


def test_buckets_follow_backward_order_and_pad_to_the_ranks():
    model = build_resnet8(sample_shape=(3, 32, 32), num_outputs=10, norm="group")
    params = list(model.parameters())
    buckets = plan_buckets(params, cap_elements=5_000, world=3)
    flat = [p for b in buckets for p in b.params]
    assert flat == params[::-1]  # the head's gradients, which backward produces first, open bucket 0
    assert all(b.padded % 3 == 0 and 0 <= b.padded - b.elements < 3 for b in buckets)
    assert all(b.elements <= 5_000 or len(b.params) == 1 for b in buckets)  # only a lone big tensor exceeds it
    assert [b.start for b in buckets] == [sum(c.padded for c in buckets[:i]) for i in range(len(buckets))]
    # the shard ranges of the ranks tile each bucket exactly
    for b in buckets:
        ranges = [b.shard_range(r, 3) for r in range(3)]
        assert ranges[0][0] == b.start and ranges[-1][1] == b.start + b.padded
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(2))


def test_flat_momentum_sgd_equals_per_parameter_sgd():
    """The identity ZeRO-2 leans on: momentum SGD over one flat tensor is per-parameter SGD, elementwise."""
    torch.manual_seed(0)
    shapes = [(4, 3), (5,), (2, 2, 2)]
    separate = [nn.Parameter(torch.randn(s)) for s in shapes]
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in separate]))
    opt_separate = torch.optim.SGD(separate, lr=0.05, momentum=0.9)
    opt_flat = torch.optim.SGD([flat], lr=0.05, momentum=0.9)
    for _ in range(4):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(separate, grads, strict=True):
            p.grad = g
        flat.grad = torch.cat([g.reshape(-1) for g in grads])
        opt_separate.step()
        opt_flat.step()
    torch.testing.assert_close(flat.detach(), torch.cat([p.detach().reshape(-1) for p in separate]), rtol=0, atol=0)


@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_four_rank_bound_catches_a_missing_slice():
    """The rounding bound of a 4-rank point fails a run whose average lost one rank's slice of the batch."""
    point = layout_point(strategy="zero2", nodes=1, ranks_per_node=4, model_options=(("norm", "group"),), steps=4)
    full, _ = train_reference(point, shards=4)
    batches = step_batches(point, 0, point.global_batch_size, torch.device("cpu"))
    model = build_model(point)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    loss_fn = loss_for(DATASETS.get(point.dataset).task)
    optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=MOMENTUM)
    for step in range(point.warmup_steps + point.steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        for x, y in list(zip(inputs.chunk(4), targets.chunk(4), strict=True))[:3]:  # rank 3's slice is lost
            (loss_fn(model(x), y) / 3).backward()
        optimizer.step()
    wrong = {name: value.detach() for name, value in model.named_parameters()}
    assert_beyond_rounding(wrong, {n: full[n] for n in wrong}, initial, rounding_bound(point, build_model(point)))
