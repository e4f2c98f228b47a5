"""The calibration report's figures of collectives beside compute and of the update's turns: each size's and
collective's in-flight share and stretch as the machine file holds them, what the analytic model takes from them
(per collective, the median over its layouts), and each turn's update against the one-rank turn."""

from __future__ import annotations

import re

from ddlbench.calibrate.report import render_calibration


def figure(value: float) -> dict:
    return {"value": value, "ci_low": value * 0.9, "ci_high": value * 1.1, "n": 20}


def collective(op: str, layout: str, *, share: float, in_flight: float | None, stretch: float | None) -> dict:
    """One collective's entry as ddlbench.analysis.machine.machine_file writes it, beside figures with or
    without the collective timed beside the chain (a file from before 2026-12-07 has only `share`)."""
    timed = in_flight is not None
    point = {"bytes": 2**24, "share": figure(share), "call_s": 0.02, "compute_s": 0.06, "beside_s": 0.07}
    if timed:
        point |= {"in_flight_share": figure(in_flight), "stretch": figure(stretch), "call_beside_s": 0.02 * stretch}
    overall = {"share": figure(share)}
    if timed:
        overall |= {"in_flight_share": figure(in_flight), "stretch": figure(stretch)}
    curve = [{"bytes": 2**24, "time_s": figure(0.02), "busbw_bytes_per_s": 1e9}]
    return {
        "library": "gloo", "link": "intra_node", "layout": layout, "op": op, "ranks": 2, "nodes": 1,
        "alpha_s": 1e-5, "beta_s_per_byte": 1e-9, "bandwidth_bytes_per_s": 1e9, "rel_error_median": 0.01,
        "rel_error_max": 0.02, "curve": curve, "beside": overall | {"curve": [point]},
    }  # fmt: skip


def machine(collectives: list[dict], operator_timings: list[dict] | None = None) -> dict:
    return {
        "machine_version": 1, "name": "host", "source": "measured", "measured_at": "now", "ddlbench_version": "0",
        "git_commit": None, "suite": "s", "hosts": ["h"], "cpu_model": "c", "torch_version": "2.13",
        "device": {"kind": "cpu", "name": "cpu", "per_node": 2, "threads_per_rank": 1},
        "compute": {"update_s_per_param": figure(6e-10) | {"elements": 2**24, "tensors": 16}},
        "links": {}, "collectives": collectives, "operator_timings": operator_timings or [], "failed_points": [],
    }  # fmt: skip


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_model_takes_each_collectives_median_over_its_layouts():
    html = text(
        render_calibration(
            machine(
                [
                    collective("reduce_scatter", "1x2", share=0.6, in_flight=0.1, stretch=3.0),
                    collective("reduce_scatter", "2x1", share=0.5, in_flight=0.3, stretch=5.0),
                    collective("all_reduce", "1x2", share=0.7, in_flight=0.35, stretch=2.0),
                ]
            )
        )
    )
    # each size's figures: the collective beside the chain (0.02 s × stretch) and its in-flight share and stretch
    sizes_figures = "0.6 [0.54, 0.66] n=20 0.1 [0.09, 0.11] n=20 3 [2.7, 3.3] n=20"
    assert f"1x2 reduce_scatter 16777216 20 60 60 70 {sizes_figures}" in html
    assert "2x1 reduce_scatter 16777216 20 100 60 70" in html
    # the model's pair per collective: the medians over its two layouts, and all_reduce's own
    assert "reduce_scatter 0.200 4.000" in html
    assert "all_reduce 0.350 2.000" in html


def test_a_file_without_the_collective_timed_beside_the_chain_shows_the_share_the_model_falls_back_to():
    html = text(render_calibration(machine([collective("all_reduce", "1x2", share=1.4, in_flight=None, stretch=None)])))
    assert "1x2 all_reduce 16777216 20 — 60 70 1.4 [1.3, 1.5] n=20 — —" in html
    assert "all_reduce 1.000 —" in html  # the share kept within [0, 1]; no stretch: its alone price


def test_each_update_turn_is_set_against_the_one_rank_turn_of_its_threads():
    turns = [
        {"precision": "fp32", "threads": 1, "ranks_per_node": 2, "update_s_per_param": figure(8e-10)},
        {"precision": "fp32", "threads": 1, "ranks_per_node": 1, "update_s_per_param": figure(6.4e-10)},
        {"precision": "fp32", "threads": 2, "ranks_per_node": 2, "update_s_per_param": figure(5e-10)},
    ]
    html = text(render_calibration(machine([], turns)))
    assert "per parameter element: 0.6 [0.54, 0.66] n=20 ns" in html
    assert "1 1 0.64 [0.576, 0.704] n=20 1.000 1 2 0.8 [0.72, 0.88] n=20 1.250 2 2 0.5 [0.45, 0.55] n=20 —" in html
