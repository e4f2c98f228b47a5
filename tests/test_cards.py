"""The shipped table of GPU cards (ddlbench/certify/cards.yaml): every entry sourced and consistent, names
matched as torch and NVML print them, and a certificate's GEMM and bandwidth figures set against the card."""

from __future__ import annotations

import pytest
import yaml

from ddlbench.certify.cards import CARDS_FILE, FIGURES, card_shares, find_card, parse_cards, shipped_cards
from ddlbench.certify.certificate import build_certificate
from ddlbench.errors import ConfigError
from ddlbench.history.figures import Figure


def test_every_card_has_its_sources_and_its_achievable_below_its_peak():
    cards = shipped_cards()
    assert {card.key for card in cards} >= {"h100-sxm", "h100-pcie", "h200", "gh200", "a100-sxm", "b200", "l40s"}
    for card in cards:
        assert "http" in card.peak_source, card.key  # a datasheet to check it against
        assert card.achievable_source and (not card.achievable or "http" in card.achievable_source), card.key
        assert set(card.peak) <= set(FIGURES) and {"fp32", "bf16", "memory_bandwidth"} <= set(card.peak)
        for name, value in card.achievable.items():
            assert 0.5 * card.peak[name] < value <= card.peak[name], (card.key, name)
        # dense tensor figures: bf16 twice tf32 on every card here, fp8 twice bf16 where it exists (within the
        # datasheets' own rounding: the L40S's TF32 183 and BF16 362.05 TFLOPS are 1.1 % apart)
        assert card.peak["bf16"] == pytest.approx(2 * card.peak["tf32"], rel=0.02)
        if "fp8" in card.peak:
            assert card.peak["fp8"] == pytest.approx(2 * card.peak["bf16"], rel=0.02)


@pytest.mark.parametrize(
    ("device", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),  # holds "H200": found before it
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-32GB", None),
        ("", None),
    ],
)
def test_a_device_name_finds_its_card(device, key):
    card = find_card(device)
    assert (card.key if card else None) == key


def test_shares_of_peak_and_achievable_on_an_h100():
    card = find_card("NVIDIA H100 80GB HBM3")
    shares = card_shares("machine/matmul_flop_per_s/bf16", 700e12, card)
    assert shares["share_of_peak"] == pytest.approx(700 / 989.4)
    assert shares["share_of_achievable"] == pytest.approx(700 / 792)
    assert "stas00" in shares["achievable_source"] and "nvidia.com" in shares["peak_source"]
    bandwidth = card_shares("machine/memory_bandwidth_bytes_per_s", 3.0e12, card)
    assert bandwidth["share_of_peak"] == pytest.approx(3.0 / 3.35) and bandwidth["share_of_achievable"] is None
    assert card_shares("machine/matmul_flop_per_s/fp64", 1e12, card) is None  # not in the table
    assert card_shares("train/x/samples_per_s", 100.0, card) is None
    assert card_shares("machine/matmul_flop_per_s/bf16", None, card) is None


def test_the_node_levels_per_gpu_figures_and_the_host_link_are_set_against_the_card():
    card = find_card("NVIDIA H200")
    names = ("quick/matmul_flop_per_s/bf16/cuda:3", "burn-in/matmul_flop_per_s/bf16", "machine/matmul_flop_per_s/bf16")
    for name in names:
        assert card_shares(name, 700e12, card)["share_of_peak"] == pytest.approx(700 / 989.4), name
    host = card_shares("quick/host_to_device_bytes_per_s/cuda:0", 50e9, card)
    assert host["share_of_peak"] == pytest.approx(50 / 64) and "PCIe Gen5: 128GB/s" in host["peak_source"]
    assert card_shares("burn-in/device_to_host_bytes_per_s/cuda:1", 50e9, card)["peak"] == 64e9
    assert card_shares("machine/host_to_device_bytes_per_s", 50e9, card) is None  # not a figure of the suite
    assert card_shares("quick/matmul_flop_per_s/bf16/cpu", 1e12, card) is None
    gh200 = find_card("NVIDIA GH200 480GB")
    c2c = card_shares("quick/device_to_host_bytes_per_s/cuda:0", 300e9, gh200)
    assert c2c["share_of_peak"] == pytest.approx(300 / 450)


def test_a_certificate_sets_a_gpus_figures_against_its_card_and_a_cpus_against_none():
    figures = [
        Figure(name="machine/matmul_flop_per_s/bf16", unit="FLOP/s", kind="machine", value=7.5e14, ci_low=None,
               ci_high=None, n=10, basis="b"),
        Figure(name="machine/memory_bandwidth_bytes_per_s", unit="B/s", kind="machine", value=4.3e12, ci_low=None,
               ci_high=None, n=10, basis="b"),
    ]  # fmt: skip
    common = {"system": "s", "partition": "p", "suite": "x", "config_hash": "0" * 16, "references_path": None}
    gpu = build_certificate(figures, None, device_name="NVIDIA H200", **common)
    assert gpu["card"] == "NVIDIA H200 141GB" and gpu["device"] == "NVIDIA H200"
    by_name = {entry["name"]: entry for entry in gpu["figures"]}
    assert by_name["machine/matmul_flop_per_s/bf16"]["card"]["share_of_peak"] == pytest.approx(750 / 989.4)
    assert by_name["machine/memory_bandwidth_bytes_per_s"]["card"]["share_of_peak"] == pytest.approx(4.3 / 4.8)
    cpu = build_certificate(figures, None, device_name="Intel(R) Xeon(R) Processor", **common)
    assert cpu["card"] is None and all(entry["card"] is None for entry in cpu["figures"])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda e: e.pop("peak_source"), "peak_source"),
        (lambda e: e["peak"].update({"fp64": 1e12}), "unknown figure"),
        (lambda e: e["achievable"].update({"bf16": 2e15}), "above the peak"),
        (lambda e: e["peak"].update({"fp32": -1}), "must be positive"),
    ],
)
def test_a_malformed_card_entry_is_refused_with_its_key(change, needle):
    data = yaml.safe_load(CARDS_FILE.read_text())
    change(data["cards"]["h100-sxm"])
    with pytest.raises(ConfigError, match=needle):
        parse_cards(data, source="cards.yaml")


def test_a_collectives_nccl_bus_bandwidth_within_a_node_is_set_against_nvlink():
    card = find_card("NVIDIA H100 80GB HBM3")
    within = card_shares("machine/all_reduce/nccl/1x8/busbw_bytes_per_s", 333e9, card)
    assert within["peak"] == 450e9 and within["share_of_achievable"] == pytest.approx(333 / 370)
    assert "nccl-tests/issues/212" in within["achievable_source"]
    assert card_shares("machine/all_reduce/nccl/2x1/busbw_bytes_per_s", 40e9, card) is None  # across nodes: the NIC
    assert card_shares("machine/all_reduce/gloo/1x2/busbw_bytes_per_s", 1e9, card) is None  # not NCCL
    assert card_shares("machine/all_gather/nccl/1x4/busbw_bytes_per_s", 1e9, find_card("NVIDIA L40S")) is None
