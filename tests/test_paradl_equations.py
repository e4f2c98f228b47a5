"""ParaDL's oracle reproduced: every row its own code printed for ResNet-50 on ABCI, and how its equations behave."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest

from ddlbench.analysis.analytic.paradl import max_micro_batch, network_factor, paradl_predict
from ddlbench.analysis.analytic.paradl_inputs import (
    ParadlError,
    layer_flops,
    parse_net,
    read_mask,
    read_net,
    read_platform,
)
from ddlbench.errors import DdlbenchError

DATA = Path(__file__).parent / "data" / "paradl"
NET = read_net(DATA / "RESNET50_ImageNet_profall.net_sc")
ABCI = read_platform(DATA / "ABCI.plat")
MASK = read_mask(DATA / "spatial_resnet.lc")  # every convolution split; filter_resnet.lc is the same
with (DATA / "reference.csv").open() as _file:
    REFERENCE = list(csv.DictReader(_file))


def _mask(name: str):
    return read_mask(DATA / name) if name else None


@pytest.mark.parametrize(
    "row", REFERENCE, ids=[f"{r['strategy']}-B{r['B']}-p{r['p']}-{r['mask'] or 'nomask'}" for r in REFERENCE]
)
def test_matches_the_figures_paradls_own_code_printed(row):
    got = paradl_predict(NET, ABCI, strategy=row["strategy"], p=int(row["p"]), B=int(row["B"]), mask=_mask(row["mask"]))
    for field in ("mem_bytes", "t_comp_s", "t_comm_s", "t_total_s"):
        assert getattr(got, field) == pytest.approx(float(row[field]), rel=1e-9, abs=0), field
    assert got.cost == int(row["cost"])


def test_the_reference_covers_every_strategy_and_both_micro_batch_cases():
    strategies = {row["strategy"] for row in REFERENCE}
    assert strategies == {"o", "d", "f", "c", "s", "ds", "df"}
    filter_batches = {(int(row["B"]), int(row["p"])) for row in REFERENCE if row["strategy"] == "f"}
    assert (32, 2) in filter_batches and (16, 64) in filter_batches  # B = b·p (their case 1) and B = b (case 3)


def test_the_net_reads_as_paradl_reads_it():
    assert (NET.samples, NET.model, len(NET.layers), len(MASK)) == (1280000, "ResNet50", 166, 166)
    conv1 = NET.layers[0]
    assert (conv1.kind, conv1.x, conv1.w, conv1.y, conv1.time_s) == (
        "CONV",
        (3, 226, 226),
        (3, 64, 7, 7),
        (64, 113, 113),
        0.003119502,
    )
    # forward 2·C·F·K²·W·H, doubled for the backward, plus |w| for the weight gradient
    assert layer_flops(conv1) == 2 * (2 * 3 * 64 * 49 * 113 * 113) + 3 * 64 * 49


def test_a_layer_without_a_profiled_time_is_priced_at_the_gpus_speed():
    lines = ["Dataset|Toy", "Input|1000x3x8x8", "Model|Toy", "# a comment|0", "CONV_1|3x8x8|3x4x3x3|4x8x8"]
    net = parse_net("\n".join([*lines, "FC|256x1x1|256x10x1x1|10x1x1", ""]))
    assert [layer.time_s for layer in net.layers] == [None, None]
    seq = paradl_predict(net, ABCI, strategy="o", p=1, B=8)
    flops = sum(layer_flops(layer) for layer in net.layers)
    assert seq.t_comp_s == pytest.approx(1000 * flops / ABCI.gpu_flops, rel=1e-12)


def test_data_parallel_comm_grows_like_a_ring_all_reduce_of_the_weights():
    # Within one leaf switch (8..64 GPUs) α and β are fixed; per iteration the ring moves 2(p−1)/p·4W bytes.
    weight_bytes = 4 * sum(layer.weight_items for layer in NET.layers)
    bandwidth, alpha = network_factor(64)
    assert network_factor(8) == (bandwidth, alpha)
    for p in (8, 16, 32, 64):
        got = paradl_predict(NET, ABCI, strategy="d", p=p, B=64 * p)
        iterations = math.ceil(NET.samples / (64 * p))
        ring = 2 * (p - 1) / p * weight_bytes / bandwidth + 2 * (p - 1) * alpha
        assert got.t_comm_s / iterations == pytest.approx(ring, rel=1e-12)
    # the bandwidth term approaches 2·4W/β from below as p grows
    per_iteration = [
        paradl_predict(NET, ABCI, strategy="d", p=p, B=64 * p).t_comm_s / math.ceil(NET.samples / (64 * p))
        - 2 * (p - 1) * alpha
        for p in (8, 16, 32, 64)
    ]
    assert per_iteration == sorted(per_iteration)
    assert per_iteration[-1] < 2 * weight_bytes / bandwidth


def test_data_parallel_compute_halves_with_each_doubling_of_p():
    times = [paradl_predict(NET, ABCI, strategy="d", p=p, B=64 * p).t_comp_s for p in (2, 4, 8)]
    assert times[0] == pytest.approx(2 * times[1]) and times[1] == pytest.approx(2 * times[2])


@pytest.mark.parametrize("strategy,p", [("d", 1), ("o", 1), ("s", 2), ("s", 4), ("df", 4)])
def test_b_max_is_the_largest_power_of_two_whose_memory_fits(strategy, p):
    b = max_micro_batch(NET, ABCI, strategy=strategy, p=p, mask=MASK)
    assert b >= 1 and b & (b - 1) == 0

    def fits(micro: int) -> bool:
        # ParaDL's rule: activations of the micro-batch beside the weights in half the GPU
        groups = p // ABCI.gpus_per_node if strategy == "df" else p if strategy == "d" else 1
        return paradl_predict(NET, ABCI, strategy=strategy, p=p, B=micro * groups, mask=MASK).fits_memory

    assert fits(b) and not fits(2 * b)


def test_b_max_is_zero_when_not_one_sample_fits():
    small = dataclasses.replace(ABCI, mem_per_gpu_bytes=1e8)
    assert max_micro_batch(NET, small, strategy="d") == 0


def test_filter_and_channel_split_at_most_as_many_ways_as_the_fewest_filters():
    paradl_predict(NET, ABCI, strategy="f", p=64, B=64, mask=MASK)
    with pytest.raises(ParadlError, match="at most 64"):
        paradl_predict(NET, ABCI, strategy="f", p=128, B=64, mask=MASK)
    with pytest.raises(ParadlError, match="at most 4"):  # the smallest split activation is 7 wide
        paradl_predict(NET, ABCI, strategy="s", p=8, B=64, mask=MASK)


@pytest.mark.parametrize("p", [3, 6, 12, 0, -4, 2.0])
def test_a_p_that_is_not_a_power_of_two_is_refused_naming_what_is_accepted(p):
    with pytest.raises(ParadlError, match=rf"p={p!r}.*power of two \(1, 2, 4, 8") as caught:
        paradl_predict(NET, ABCI, strategy="d", p=p, B=64)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, DdlbenchError)


def test_a_hybrid_needs_whole_nodes_and_a_batch_the_groups_share():
    with pytest.raises(ParadlError, match="multiple of GPU_PER_NODE=4"):
        paradl_predict(NET, ABCI, strategy="df", p=2, B=64, mask=MASK)
    with pytest.raises(ParadlError, match=r"B=100.*multiple of 8"):
        paradl_predict(NET, ABCI, strategy="d", p=8, B=100)


def test_a_bad_strategy_name_lists_the_accepted_ones():
    with pytest.raises(ParadlError, match=r"'pipeline'.*o \(sequential.*d \(data parallel\).*ds .*df "):
        paradl_predict(NET, ABCI, strategy="pipeline", p=4, B=64)


def test_a_mask_of_the_wrong_length_is_refused():
    with pytest.raises(ParadlError, match=r"3 entries.*166 layers"):
        paradl_predict(NET, ABCI, strategy="f", p=4, B=64, mask=(True, False, True))
