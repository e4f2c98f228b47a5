"""The spread check (ddlbench.certify.spread): one figure across the GPUs of a node or the nodes of a
partition, (max − min) ÷ max against a limit, the slowest and fastest named when it fails."""

from __future__ import annotations

import pytest

from ddlbench.certify.certificate import build_certificate
from ddlbench.certify.spread import DEFAULT_LIMIT, spread_figures
from ddlbench.history.figures import Figure


def measured(name: str, value: float | None, node: str | None = None, kind: str = "machine") -> Figure:
    interval = {"ci_low": None, "ci_high": None}
    return Figure(name=name, unit="FLOP/s", kind=kind, value=value, n=9, basis="b", node=node, **interval)


def test_gpus_of_a_node_within_the_limit_pass_and_a_slow_one_fails_by_name():
    even = [measured(f"quick/matmul_flop_per_s/bf16/cuda:{i}", 700e12 * (1 - 0.01 * i)) for i in range(4)]
    (check,) = spread_figures(even)
    assert (check.name, check.n, check.check) == ("spread/quick/matmul_flop_per_s/bf16", 4, "pass")
    assert check.value == pytest.approx(0.03) and DEFAULT_LIMIT == 0.10
    uneven = [*even[:3], measured("quick/matmul_flop_per_s/bf16/cuda:3", 600e12)]
    (check,) = spread_figures(uneven)
    assert check.check == "failed" and check.value == pytest.approx(100 / 700)
    assert check.finding == "cuda:3 6e+14 vs cuda:0 7e+14 FLOP/s: 14.3 % apart, above the limit of 10 %"
    assert spread_figures(uneven, limit=0.15)[0].check == "pass"


def test_nodes_of_a_partition_are_compared_per_figure_and_checks_and_lone_figures_are_not():
    figures = [
        measured("train/x/samples_per_s", 400.0, node="n1", kind="throughput"),
        measured("train/x/samples_per_s", 300.0, node="n2", kind="throughput"),
        measured("train/x/samples_per_s", 390.0, kind="throughput"),  # the partition's: no member
        measured("train/y/samples_per_s", 100.0, node="n1", kind="throughput"),  # one node only
        measured("train/y/samples_per_s", None, node="n2", kind="throughput"),  # failed: no value
        measured("replay/x", 0, node="n1", kind="replay"),
        measured("replay/x", 1, node="n2", kind="replay"),
    ]
    (check,) = spread_figures(figures)
    assert check.name == "spread/train/x/samples_per_s" and check.finding.startswith("n2 300 vs n1 400")
    certificate = build_certificate([*figures, check], None, system="s", partition="p", suite="x", config_hash="h",
                                    references_path=None)  # fmt: skip
    entry = next(e for e in certificate["figures"] if e["name"] == check.name)
    assert entry["status"] == "failed" and entry["passed"] is False
