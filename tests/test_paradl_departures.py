"""Where ddlbench's full model meets ParaDL's equations, and where it departs from them on purpose.

ParaDL (Kahira et al., HPDC'21) prices data parallelism as a ring all-reduce of the weights per iteration,
with no overlap: T = T_comp + 2(p−1)(α + 4Wβ/p) per iteration. ddlbench's collective costing is the
same ring when a machine gives only a link; it departs where the implementation does (DDP overlaps its
buckets with backward; the optimizer keeps state; DDP keeps a bucket copy of the gradients).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.paradl import BYTES_PER_ITEM, network_factor, paradl_predict
from ddlbench.analysis.analytic.paradl_inputs import read_net, read_platform
from ddlbench.analysis.analytic.predict import introspected_table, predict

DATA = Path(__file__).parent / "data" / "paradl"
NET = read_net(DATA / "RESNET50_ImageNet_profall.net_sc")
ABCI = read_platform(DATA / "ABCI.plat")
ABCI_V100 = Path(__file__).resolve().parents[1] / "workflow" / "machines" / "abci_v100.yaml"


def paradl_link_machine(p: int) -> MachineModel:
    """A machine whose only facts about communication are ParaDL's link at p GPUs."""
    bandwidth, latency = network_factor(p)
    link = {"alpha_s": latency, "beta_s_per_byte": 1 / bandwidth}
    return MachineModel.from_dict(
        {
            "name": f"paradl-link-{p}",
            "source": "datasheet",
            "device": {"kind": "cuda", "per_node": 4, "memory_bytes": 16e9},
            "compute": {"matmul_flop_per_s": {"fp32": {"value": ABCI.gpu_flops}}},
            "links": {"intra_node": link, "inter_node": link},
            "collectives": [],
        }
    )


@pytest.mark.parametrize("p", [4, 16, 64, 256, 1024])
def test_the_ring_all_reduce_is_paradls_data_parallel_communication(p):
    weights_bytes = sum(layer.weight_items for layer in NET.layers) * BYTES_PER_ITEM
    B = 64 * p
    theirs = paradl_predict(NET, ABCI, strategy="d", p=p, B=B)
    iterations = math.ceil(NET.samples / B)
    cost = paradl_link_machine(p).collective("all_reduce", ranks=p, nodes=max(1, p // 4))
    assert iterations * cost.time_s(weights_bytes) == pytest.approx(theirs.t_comm_s, rel=1e-12)


def test_the_full_model_hides_what_ddp_overlaps_and_counts_what_paradl_leaves_out():
    machine = MachineModel.from_file(ABCI_V100)
    setting = Setting(model="resnet50", dataset="imagenet", strategy="ddp", nodes=4, ranks_per_node=4, batch_size=64)
    full = predict(setting, machine, search_batch=False)
    # DDP's buckets all-reduce during backward: part of the communication is hidden (ParaDL: none is)
    assert full.comm_hidden_s > 0
    assert full.step_time_s < full.compute_s + full.comm_s
    # memory: ParaDL's 2·4·W covers weights and gradients; momentum SGD adds one state per weight and DDP
    # a bucket copy of every gradient: two more copies of the weights per GPU
    table = introspected_table("resnet50", "imagenet", (("norm", "batch"), ("stem", "auto")))
    assert full.optimizer_bytes == table.param_bytes and full.buffers_bytes == table.param_bytes
    assert full.resident_memory_bytes == 4 * table.param_bytes + table.buffer_bytes


def test_paradl_reads_our_net_files_and_counts_the_same_convolution_flops():
    """ParaDL's FLOP estimate of a convolution (2·C·F·K²·W·H from the .net shapes) is an independent count
    of what torch's FlopCounterMode gave the model table."""
    from ddlbench.analysis.analytic.layers import render_net
    from ddlbench.analysis.analytic.paradl_inputs import layer_flops, parse_net

    table = introspected_table("resnet50", "imagenet", (("norm", "batch"), ("stem", "auto")))
    net = parse_net(render_net(table, dataset_size=1281167))
    assert net.samples == 1281167 and all(layer.time_s is None for layer in net.layers)
    # layer_flops is ParaDL's forward ×2 (the input gradient) + |w| (the weight gradient): take its forward
    theirs = sum(
        (layer_flops(layer) - layer.weight_items) // 2 for layer in net.layers if layer.name.startswith("CONV")
    )
    ours = sum(layer.forward_flops for layer in table.layers if layer.type == "Conv2d")
    assert theirs == ours
    figures = paradl_predict(net, ABCI, strategy="d", p=4, B=256)
    assert figures.t_comp_s > 0 and figures.t_comm_s > 0
