"""Tensor parallelism (tensor) and its data-parallel hybrid (dp_tp): real gloo runs of gpt_tiny against
one process training on the same global batches."""

from __future__ import annotations

import pytest
import torch

from ddlbench.catalog import MODELS
from ddlbench.train.kernel import MOMENTUM, build_model, step_batches
from ddlbench.train.losses import language_loss
from ddlbench.train.strategies.tensor import COLWISE, ROWWISE
from tests.equivalence import (
    assert_beyond_rounding,
    check_against_reference,
    layout_point,
    parameter_names,
    rounding_bound,
)

# Tensor parallelism splits each sharded Linear's dot products into per-rank partial sums that an
# all-reduce adds (and FSDP averages gradients with a reduce-scatter), so float32 rounds in another
# order than the single process: within the rounding bound of tests/equivalence.py (measured after 4
# SGD steps on gpt_tiny and tokens_small: 1/350 of it, tensor on 2 ranks and dp_tp on 2×2). A missing
# reduction across replicas lands far outside it (the sensitivity check at the end).
# Two warm-up steps: the kernel runs the last under the CPU tensor-memory probe (never the only one),
# which must see through the DTensors and AsyncCollectiveTensors a tensor-parallel step creates (each
# rank's record has a peak).
GPT_TINY = dict(model="gpt_tiny", dataset="tokens_small", model_options=(), warmup_steps=2, steps=3)


def sharded_elements(model: torch.nn.Module) -> int:
    """Parameters the plan splits over tp: column-wise weights and biases, row-wise weights (their biases
    are replicated, added once after the all-reduce)."""
    total = 0
    for block in model[1:-1]:
        total += sum(p.numel() for name in COLWISE for p in block.get_submodule(name).parameters())
        total += sum(block.get_submodule(name).weight.numel() for name in ROWWISE)
    return total


def tp_local_parameters(model: torch.nn.Module, tp: int) -> int:
    total = sum(p.numel() for p in model.parameters())
    return total - sharded_elements(model) + sharded_elements(model) // tp


@pytest.mark.slow
@pytest.mark.equivalence
# 2: other groupings of every sum, on the ranks and in the reference
@pytest.mark.parametrize("threads", [pytest.param(1, marks=pytest.mark.equivalence_sse), 2])
def test_tensor_on_two_ranks_matches_single_process(tmp_path, threads):
    record = check_against_reference(
        tmp_path, strategy="tensor", nodes=1, ranks_per_node=2, batch_size=8, threads=threads, **GPT_TINY
    )
    heads = MODELS.get("gpt_tiny").shape["heads"]
    model = build_model(record.point)
    assert record.metrics.global_batch_size == 8  # every tp rank is fed the whole batch
    for rank, result in enumerate(record.ranks):
        facts = result.facts
        assert facts["mesh"] == {"tp": 2} and facts["coords"] == {"tp": rank}
        assert facts["heads"] == heads and facts["local_heads"] == heads // 2
        assert facts["local_parameters"] == tp_local_parameters(model, 2) < facts["total_parameters"]
        assert facts["total_parameters"] == sum(p.numel() for p in model.parameters())
        assert result.tensor_peak_bytes and result.tensor_peak_bytes > 4 * facts["local_parameters"]
    # both ranks compute the whole batch's loss, so they report the same numbers
    assert record.ranks[0].losses == pytest.approx(record.ranks[1].losses, rel=1e-6)


def train_on_rows(point, start: int, stop: int) -> dict[str, torch.Tensor]:
    """The reference trained on only rows [start, stop) of every global batch (one replica without dp)."""
    torch.set_num_threads(1)
    model = build_model(point)
    optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=MOMENTUM)
    batches = step_batches(point, 0, point.global_batch_size, torch.device("cpu"))
    for step in range(point.warmup_steps + point.steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        language_loss(model(inputs[start:stop]), targets[start:stop]).backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_dp_tp_on_two_by_two_ranks_matches_single_process(tmp_path):
    fields = dict(strategy="dp_tp", nodes=1, ranks_per_node=4, split=2, batch_size=4, **GPT_TINY)
    record = check_against_reference(tmp_path, **fields)
    point = layout_point(**fields)
    model = build_model(point)
    heads = MODELS.get("gpt_tiny").shape["heads"]
    assert record.metrics.global_batch_size == 8  # two replicas of 4 samples each
    coords = set()
    for rank, result in enumerate(record.ranks):
        facts = result.facts
        assert facts["mesh"] == {"dp": 2, "tp": 2}
        # consecutive ranks form a tp group (build_mesh), so a replica stays inside a node
        assert facts["coords"] == {"dp": rank // 2, "tp": rank % 2}
        coords.add((facts["coords"]["dp"], facts["coords"]["tp"]))
        assert facts["local_heads"] == heads // 2 and facts["fsdp_over_dp"]
        # FSDP halves each tp shard again over dp (every dim 0 of gpt_tiny is even: no padding)
        assert facts["local_parameters"] == tp_local_parameters(model, 2) // 2
        assert result.tensor_peak_bytes and result.tensor_peak_bytes > 4 * facts["local_parameters"]
    assert len(coords) == 4
    # tp peers compute the same replica loss; the two replicas see different halves of the batch
    losses = [result.losses for result in record.ranks]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[2] == pytest.approx(losses[3], rel=1e-6)
    assert losses[0][0] != pytest.approx(losses[2][0], rel=1e-4)

    # sensitivity: a run that skipped the averaging across replicas would have trained replica 0 on
    # its half alone; the comparison above must tell that apart from the real run
    got = torch.load(tmp_path / "params.pt")
    half = train_on_rows(point, 0, point.global_batch_size // 2)
    names = parameter_names(model)
    assert_beyond_rounding(got, {n: half[n] for n in names}, model.state_dict(), rounding_bound(point, model))
