"""Model parallelism and the pipeline schedules, run on real ranks against one process.

Every strategy here computes the same per-sample arithmetic as the reference; what differs is how
float32 sums are grouped. Model parallelism runs the whole batch through the same kernels and matches
exactly (0.0). Pipelines add the gradients of micro-batches (each a mean over its slice, scaled by
1/micro_batches) instead of taking one batch mean, and dp × pp also averages over replicas in an
all-reduce: within the rounding bound of tests/equivalence.py (measured: at most 1/200 of it). Per-
micro-batch BatchNorm statistics against whole-batch ones already land far outside it (the
sensitivity check below), and a wrong micro-batch scale or a missing gradient would land further.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddlbench.train.kernel import build_model
from tests.equivalence import (
    assert_beyond_rounding,
    assert_within_rounding,
    check_against_reference,
    layout_point,
    parameter_names,
    rounding_bound,
)
from tests.reference import train_reference

GROUP = (("norm", "group"),)
SMALL = dict(batch_size=8, warmup_steps=1, steps=2)


def stage_facts(record) -> list[dict]:
    return [rank.facts for rank in sorted(record.ranks, key=lambda r: r.rank)]


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize("norm", ["group", "batch"])
def test_model_parallel_two_ranks_matches_single_process(tmp_path: Path, norm: str):
    # the whole batch goes through each stage at once, so even BatchNorm matches the unsharded reference
    record = check_against_reference(
        tmp_path, strategy="model_parallel", ranks_per_node=2, model_options=(("norm", norm),), **SMALL
    )
    facts = stage_facts(record)
    assert [f["stages"] for f in facts] == [[0], [1]]
    assert facts[0]["stage_blocks"] == [[0, 2], [2, 5]]  # resnet8 by FLOPs: stem + block 1 | the rest
    assert facts[0]["mesh"] == {"mp": 2} and [f["coords"]["mp"] for f in facts] == [0, 1]
    assert facts[0]["local_parameters"] + facts[1]["local_parameters"] == 78_042  # each rank holds its stage only
    assert [r.losses != () for r in sorted(record.ranks, key=lambda r: r.rank)] == [False, True]


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("strategy", "balance", "blocks", "threads"),
    [
        # stem + block 1 (10.3M FLOPs) | blocks 2, 3 + head (14.7M)
        pytest.param("gpipe", "flops", [[0, 2], [2, 5]], 1, marks=pytest.mark.equivalence_sse),
        ("1f1b", "params", [[0, 3], [3, 5]], 1),  # 19.7k parameters | the 64-wide block + head (58.4k)
        # two intra-op threads on each stage and in the reference: other groupings of every sum
        pytest.param("1f1b", "params", [[0, 3], [3, 5]], 2, id="1f1b-params-threads2"),
    ],
)
def test_two_stage_pipeline_matches_single_process(
    tmp_path: Path, strategy: str, balance: str, blocks: list, threads: int
):
    # the reference runs the same 4 micro-batches of 2 (their gradients averaged; with GroupNorm the same
    # step in exact arithmetic): each sample's forward is the same sums at the same batch size on both
    # sides, whatever a CPU's kernels do with the batch size (see test_dp_pp_four_ranks_matches_single_process)
    record = check_against_reference(
        tmp_path,
        shards=4,
        strategy=strategy,
        ranks_per_node=2,
        micro_batches=4,
        threads=threads,
        strategy_options=(("balance", balance),),
        model_options=GROUP,
        **SMALL,
    )
    facts = stage_facts(record)
    assert [f["stages"] for f in facts] == [[0], [1]]
    assert all(f["micro_batches"] == 4 and f["schedule"] == strategy and f["balance"] == balance for f in facts)
    assert facts[0]["stage_blocks"] == blocks
    assert [r.losses != () for r in sorted(record.ranks, key=lambda r: r.rank)] == [False, True]


@pytest.mark.slow
@pytest.mark.equivalence
def test_interleaved_1f1b_holds_two_looped_stages_per_rank(tmp_path: Path):
    record = check_against_reference(
        tmp_path, shards=4, strategy="interleaved_1f1b", ranks_per_node=2, micro_batches=4, model_options=GROUP, **SMALL
    )  # shards: the pipeline's micro-batches, as in test_two_stage_pipeline_matches_single_process
    facts = stage_facts(record)
    assert [f["stages"] for f in facts] == [[0, 2], [1, 3]]  # rank r holds stages r and r + 2
    assert facts[0]["num_stages"] == 4 and len(facts[0]["stage_blocks"]) == 4
    assert all(hi > lo for lo, hi in facts[0]["stage_blocks"])


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_dp_pp_four_ranks_matches_single_process(tmp_path: Path):
    # 2 replicas × 4 micro-batches of 2 samples: the reference runs the same 8 slices of 2 (their gradients
    # averaged; with GroupNorm the same step in exact arithmetic), so each sample's forward is the same
    # sums at the same batch size on both sides, whatever a CPU's kernels do with the batch size (oneDNN's
    # SSE4.1 convolutions on one host: 1.01 bounds away against one step over 16 samples)
    record = check_against_reference(
        tmp_path,
        shards=8,
        strategy="dp_pp",
        ranks_per_node=4,
        split=2,
        micro_batches=4,
        model_options=GROUP,
        **SMALL,
    )
    facts = stage_facts(record)
    assert [f["coords"] for f in facts] == [
        {"dp": 0, "pp": 0},
        {"dp": 0, "pp": 1},
        {"dp": 1, "pp": 0},
        {"dp": 1, "pp": 1},
    ]
    assert facts[0]["mesh"] == {"dp": 2, "pp": 2} and facts[0]["schedule"] == "1f1b"
    assert record.metrics.global_batch_size == 16


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_batchnorm_pipeline_matches_a_reference_sharded_into_micro_batches(tmp_path: Path):
    """BatchNorm normalises each micro-batch alone: the reference cut into as many shards agrees with
    the pipeline, parameters and running statistics alike (the stages are declared static, so no
    shape-inference forward pollutes the statistics); the full-batch reference does not."""
    fields = dict(strategy="1f1b", ranks_per_node=2, micro_batches=4, model_options=(("norm", "batch"),))
    check_against_reference(tmp_path, shards=4, **fields, **SMALL)
    point = layout_point(**fields, **SMALL)
    got = torch.load(tmp_path / "params.pt")
    model = build_model(point)
    initial, bound = model.state_dict(), rounding_bound(point, model)
    sharded, _ = train_reference(point, shards=4)
    # the running statistics too (num_batches_tracked: an integer count, which must agree exactly)
    assert_within_rounding(got, sharded, initial, bound, label="1f1b BatchNorm state")
    # sensitivity: statistics over the whole batch land far outside the bound
    whole, _ = train_reference(point, shards=1)
    assert_beyond_rounding(got, {n: whole[n] for n in parameter_names(model)}, initial, bound)


@pytest.mark.slow
@pytest.mark.equivalence
def test_gpt_tiny_pipeline_on_tokens_matches_single_process(tmp_path: Path):
    record = check_against_reference(
        tmp_path,
        shards=2,  # the pipeline's micro-batches, as in test_two_stage_pipeline_matches_single_process
        strategy="1f1b",
        model="gpt_tiny",
        dataset="tokens_small",
        ranks_per_node=2,
        micro_batches=2,
        model_options=(),
        **SMALL,
    )
    facts = stage_facts(record)
    # embedding (4k: no matmul, one per output element), blocks of 6.3M, head 4.2M FLOPs per sequence
    assert facts[0]["stage_blocks"] == [[0, 2], [2, 4]] and facts[0]["micro_batches"] == 2
