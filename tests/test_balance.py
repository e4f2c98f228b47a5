"""The balanced cut of a flat model into stages: the partition optimum and the per-block costs."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from ddlbench.train.models.cifar_resnet import build_resnet8
from ddlbench.train.strategies.balance import block_costs, partition, plan_stages, probe_blocks, release_blocks


def brute_force_bottleneck(costs: list[float], parts: int) -> float:
    """The smallest largest-stage sum over every way to place parts - 1 cuts."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(edges)))
    return best


@pytest.mark.parametrize(
    ("costs", "parts", "want"),
    [
        ([1, 1, 1, 1], 2, ((0, 2), (2, 4))),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, ((0, 5), (5, 7), (7, 9))),  # 15 | 13 | 17: the bottleneck 17 is forced
        ([10, 1, 1, 1, 1, 10], 3, ((0, 1), (1, 5), (5, 6))),  # the heavy ends each get a stage
        ([5, 1, 1, 1], 2, ((0, 1), (1, 4))),
        ([3, 3, 3], 3, ((0, 1), (1, 2), (2, 3))),  # k == number of blocks: one block each
        ([7, 2, 4], 1, ((0, 3),)),
        # ties: the bottleneck is 2 either way; earlier stages take as much as it allows
        ([1, 1, 1], 2, ((0, 2), (2, 3))),
    ],
)
def test_partition_known_optima(costs, parts, want):
    assert partition(costs, parts) == want


def test_partition_is_optimal_and_non_empty_on_random_costs():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 9, (1,), generator=generator))
        parts = int(torch.randint(1, n + 1, (1,), generator=generator))
        costs = torch.randint(0, 20, (n,), generator=generator).tolist()
        bounds = partition(costs, parts)
        assert len(bounds) == parts
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(lo < hi for lo, hi in bounds), "every stage holds at least one block"
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), "stages are contiguous"
        got = max(sum(costs[lo:hi]) for lo, hi in bounds)
        assert got == brute_force_bottleneck(costs, parts), (costs, parts, bounds)
        assert partition(costs, parts) == bounds, "the same costs give the same cut"


def test_partition_refuses_more_stages_than_blocks():
    with pytest.raises(ValueError, match="cannot cut 3 blocks into 4 stages: every stage needs at least one block"):
        partition([1, 2, 3], 4)
    with pytest.raises(ValueError, match="at least 1"):
        partition([1, 2, 3], 0)
    with pytest.raises(ValueError, match="negative"):
        partition([1, -2, 3], 2)


def test_probe_counts_flops_and_parameters_of_each_block():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    probes = probe_blocks(model, torch.zeros(1, 4))
    assert [p.flops for p in probes] == [2 * 4 * 8, 0, 2 * 8 * 2]  # 2×MACs of each matmul; ReLU uncounted
    assert [p.parameters for p in probes] == [4 * 8 + 8, 0, 8 * 2 + 2]
    assert [p.output_shape for p in probes] == [(1, 8), (1, 8), (1, 2)]
    # a parameter-free block still costs something: one FLOP per output element, one "parameter"
    assert block_costs(probes, "flops") == (64, 8, 32)
    assert block_costs(probes, "params") == (40, 1, 18)
    with pytest.raises(ValueError, match="unknown balance rule"):
        block_costs(probes, "latency")


def test_probe_leaves_batchnorm_statistics_and_training_mode_alone():
    model = build_resnet8(sample_shape=(3, 32, 32), num_outputs=10, norm="batch")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe_blocks(model, torch.randn(1, 3, 32, 32))
    assert all(module.training for module in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_resnet8_plans_follow_the_rule():
    model = build_resnet8(sample_shape=(3, 32, 32), num_outputs=10, norm="group")
    probes = probe_blocks(model, torch.randn(1, 3, 32, 32))
    by_flops = plan_stages(probes, 2, "flops")
    by_params = plan_stages(probes, 2, "params")
    # FLOPs: stem 0.9M, blocks 9.4M/7.3M/7.3M, head 1.3k: 10.3M | 14.7M beats 17.7M | 7.3M;
    # parameters grow with width (0.5k, 4.7k, 14.5k, 57.7k, 0.7k), so the widest block leads stage 1
    assert by_flops.bounds == ((0, 2), (2, 5))
    assert by_flops.stage_costs == (884736 + 9437184, 7340032 + 7340032 + 1280)
    assert by_params.bounds == ((0, 3), (3, 5))
    assert by_params.stage_costs == (464 + 4672 + 14528, 57728 + 650)
    assert sum(by_flops.stage_costs) == sum(by_flops.block_costs)
    with pytest.raises(ValueError, match="cannot cut 5 blocks into 6 stages"):
        plan_stages(probes, 6, "flops")


def test_release_blocks_frees_the_others():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    release_blocks(model, [(1, 2)])
    assert [model[i].weight.is_meta for i in range(3)] == [True, False, True]
