"""`ddlbench certify --level quick`: this node measured for real in seconds (a GEMM and a memory copy per
device), judged against the reference file's quick/ bands, one line and an exit status for a health checker."""

from __future__ import annotations

import json

import pytest
import yaml

from ddlbench.certify.quick import MIN_SAMPLES
from ddlbench.cli import main


def references(tmp_path, bands: dict[str, dict]) -> str:
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump({"systems": {"lab:cpu": bands}}))
    return str(path)


def quick(tmp_path, refs: str, *extra: str) -> int:
    args = ["-q", "certify", "--level", "quick", "--system", "lab", "--partition", "cpu", "--references", refs]
    return main([*args, "--json", str(tmp_path / "quick.json"), *extra])


LOW = {
    "quick/matmul_flop_per_s/fp32": {"min": 1e6, "unit": "FLOP/s"},
    "quick/memory_bandwidth_bytes_per_s": {"min": 1e6, "unit": "B/s"},
    # another level's figure: the quick check neither measures nor misses it
    "train/resnet8-cifar10-ddp-n1x1-b32-t1/samples_per_s": {"min": 1.0, "unit": "samples/s"},
}


def test_a_healthy_node_passes_with_one_line_and_status_0(tmp_path, capsys):
    assert quick(tmp_path, references(tmp_path, LOW)) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and line.startswith("ddlbench certify quick lab:cpu") and ": PASS (2 figures" in line
    assert "health: not measurable here: no NVML" in line  # no NVML on these CPU machines
    cert = json.loads((tmp_path / "quick.json").read_text())
    by_name = {entry["name"]: entry for entry in cert["figures"]}
    health = by_name.pop("health/gpus")  # listed, unjudged: no NVML here
    assert health["status"] == "no reference" and health["why_missing"].startswith("not measurable here: no NVML")
    assert set(by_name) == {"quick/matmul_flop_per_s/fp32", "quick/memory_bandwidth_bytes_per_s"}
    for entry in by_name.values():
        assert entry["status"] == "pass" and entry["n"] >= MIN_SAMPLES and entry["ci_low"] <= entry["value"]
    assert cert["counts"]["missing"] == 0  # train/… belongs to the standard level


def test_a_slow_node_fails_naming_the_figure_and_its_band(tmp_path, capsys):
    bands = LOW | {"quick/matmul_flop_per_s/fp32": {"min": 1e18, "unit": "FLOP/s"}}
    assert quick(tmp_path, references(tmp_path, bands)) == 1
    line = capsys.readouterr().out.strip()
    assert ": FAIL (slow: quick/matmul_flop_per_s/fp32 " in line and "outside [1e+18, ]" in line


def test_a_referenced_quick_figure_this_node_cannot_measure_is_missing(tmp_path, capsys):
    bands = LOW | {"quick/matmul_flop_per_s/bf16/cuda:0": {"min": 1e12, "unit": "FLOP/s"}}
    assert quick(tmp_path, references(tmp_path, bands)) == 1
    assert "missing: quick/matmul_flop_per_s/bf16/cuda:0" in capsys.readouterr().out


@pytest.mark.parametrize("option", [["--from-records", "x"], ["--profile", "slurm"]])
def test_quick_refuses_what_only_the_suite_does_in_one_line(tmp_path, capsys, option):
    assert quick(tmp_path, references(tmp_path, LOW), *option) == 2
    err = capsys.readouterr().err.strip()
    assert option[0] in err and "--level quick" in err and "\n" not in err


def test_quick_proposes_its_own_references(tmp_path, capsys):
    proposed = tmp_path / "proposed.yaml"
    assert quick(tmp_path, references(tmp_path, LOW), "--write-references", str(proposed)) == 0
    bands = yaml.safe_load(proposed.read_text())["systems"]["lab:cpu"]
    assert set(bands) == {"quick/matmul_flop_per_s/fp32", "quick/memory_bandwidth_bytes_per_s"}
    measured = {entry["name"]: entry["value"] for entry in json.loads((tmp_path / "quick.json").read_text())["figures"]}
    for name, band in bands.items():  # the run's medians, ±10 % at least
        assert (
            band["value"] == pytest.approx(measured[name], rel=1e-4) and band["lower"] <= -0.1 <= 0.1 <= band["upper"]
        )


def test_a_load_that_raises_is_a_failed_figure_with_its_cause_and_the_others_run(monkeypatch):
    from ddlbench.certify import quick as quick_module

    real = quick_module.node_loads

    def with_a_broken_load(device):
        def broken(budget_s):
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nmore")

        return [("matmul_flop_per_s/fp8", "FLOP/s", "a product", broken), *real(device)]

    monkeypatch.setattr(quick_module, "node_loads", with_a_broken_load)
    figures = {figure.name: figure for figure in quick_module.quick_figures(budget_s=0.05)[0]}
    broken = figures["quick/matmul_flop_per_s/fp8"]
    assert broken.value is None and not broken.never_ran
    assert broken.why_missing == "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"
    assert figures["quick/matmul_flop_per_s/fp32"].value > 0 and figures["quick/memory_bandwidth_bytes_per_s"].value > 0
