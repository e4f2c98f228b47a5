"""`ddlbench certify` for real: the suite runs through Snakemake (calibration microbenchmarks, per-device
throughput on every node of the local 'partition', data-parallel scaling to its size), and the
certificate judges what it measured. The SLURM side, a degraded node found by per-node certification, is
in test_slurm_cluster.py."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run_cli

from ddlbench.history.db import list_runs

pytestmark = pytest.mark.slow

CALIBRATION = {
    "name": "tiny_machine", "nodes": [1], "ranks_per_node": 2, "threads": 1, "precisions": ["fp32"],
    "matmul_sizes": [128], "conv_shapes": [[8, 16, 16, 3]], "memory_bytes": 8388608,
    "collectives": ["all_reduce", "broadcast"], "message_bytes": [4096, 65536, 4194304], "backends": ["torch"],
    "warmup": 1, "iterations": 6, "layer_timings": [],
}  # fmt: skip


def suite(tmp_path, results: str = "results") -> str:
    (tmp_path / "calibration.yaml").write_text(yaml.safe_dump(CALIBRATION))
    raw = {
        "name": "tiny", "results_dir": str(tmp_path / results), "calibrate": str(tmp_path / "calibration.yaml"),
        "models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 4, "partition"],
        "each_node": "all", "batch_size": [16], "warmup_steps": 2, "steps": 8, "timeout_s": 120, "replay_steps": 2,
    }  # fmt: skip
    (tmp_path / f"suite-{results}.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / f"suite-{results}.yaml")


def test_a_bad_calibration_in_the_suite_is_refused_before_anything_runs(tmp_path):
    path = suite(tmp_path)
    (tmp_path / "calibration.yaml").write_text(yaml.safe_dump(CALIBRATION | {"message_bytes": [4096]}))
    refused = run_cli("certify", "--system", "here", "--partition", "local", "--suite", path, "--write-references", "x")
    assert refused.returncode == 2 and "calibrate" in refused.stderr and "message_bytes" in refused.stderr
    assert not (tmp_path / "results").exists()


def test_certify_runs_the_suite_and_judges_its_figures(tmp_path):
    proposed, certificate = tmp_path / "proposed.yaml", tmp_path / "certificate.json"
    common = ["certify", "--system", "here", "--partition", "local"]
    history = tmp_path / "results" / "history.sqlite"
    first = run_cli(
        *common,
        "--suite",
        suite(tmp_path),
        "--write-references",
        str(proposed),
        "--json",
        str(certificate),
        env={"DDLBENCH_HISTORY": str(history)},
    )
    assert first.returncode == 1, first.stderr[-3000:]  # nothing referenced: no pass
    folder = tmp_path / "results" / "tiny_here_local"
    figures = {(f["name"], f["node"]): f for f in json.loads(certificate.read_text())["figures"]}
    names = {name for name, _ in figures}
    # the three parts: microbenchmarks, per-device throughput (per node), scaling to the partition's 2 nodes
    assert {"machine/matmul_flop_per_s/fp32", "machine/all_reduce/gloo/1x2/busbw_bytes_per_s"} <= names
    one, two = (
        "train/resnet8-cifar10-ddp-n1x1-b16-t1/samples_per_s",
        "train/resnet8-cifar10-ddp-n2x1-b16-t1/samples_per_s",
    )
    assert {one, two, "scaling/resnet8-cifar10-ddp-n2x1-b16-t1/efficiency"} <= names
    assert not any("n4x1" in name for name in names)  # 4 nodes: above the partition's size, dropped
    node = next(node for name, node in figures if name == one and node)
    assert figures[(one, node)]["value"] == figures[(one, None)]["value"]  # one node: its figure is the partition's
    # the replay check judges itself: the three ranks' replays (one of n1x1, two of n2x1) agree bit for bit
    replays = [f for f in figures.values() if f["kind"] == "replay"]
    assert [(f["name"], f["status"], f["value"]) for f in replays] == [
        ("replay/resnet8-cifar10-b16-fp32-rp2-t1", "pass", 0)
    ] and replays[0]["basis"].startswith("3 replays"), replays
    assert all(f["status"] == "no reference" and f["passed"] is None for f in figures.values() if f["kind"] != "replay")
    # every rank read its GPU's health around its point, or said why not: here, no NVML
    assert figures[("health/gpus", None)]["why_missing"].startswith("not measurable here: no NVML")
    records = {path.parent.name for path in (folder / "points").glob("*/record.json")}
    assert len(records) == 2 and any("-on_" in point_id for point_id in records)

    # the references proposed from the run certify it; one made 3× faster than measured fails, by name
    passed = run_cli(*common, "--references", str(proposed), "--from-records", str(folder), "--db", str(history))
    assert passed.returncode == 0 and "PASSED" in passed.stdout, passed.stdout + passed.stderr[-2000:]
    refs = yaml.safe_load(proposed.read_text())
    refs["systems"]["here:local"][two]["value"] *= 3
    (tmp_path / "harder.yaml").write_text(yaml.safe_dump(refs))
    failed = run_cli(
        *common, "--references", str(tmp_path / "harder.yaml"), "--from-records", str(folder), "--db", str(history)
    )
    assert failed.returncode == 1 and f"slow: {two}" in failed.stdout, failed.stdout
    # the suite's report shows the machine's health from its latest certificate
    assert "Machine certificate FAILED for here local" in (folder / "report.md").read_text()
    assert "Machine certificate FAILED" in (folder / "report.html").read_text()
    # history: the suite's sweep (stored by its aggregate step) and the three certificates
    runs = list_runs(db=history)
    assert [run.kind for run in runs] == ["sweep", "certificate", "certificate", "certificate"]
    assert [run.passed for run in runs[1:]] == [False, True, False]
    assert (folder / "report.html").exists() and (folder / "certificate.html").exists()

    # the suite run again with faults, against the same references: a straggler's one-node figures are slow,
    # the two-node point that raised is failed with its cause, the efficiency built on it failed too
    faulty = run_cli(
        *common,
        "--suite",
        suite(tmp_path, results="faulty"),
        "--references",
        str(proposed),
        "--json",
        str(certificate),
        env={"DDLBENCH_HISTORY": str(history), "DDLBENCH_INJECT_FAULT": "slow:0.3@n1x1,raise@n2x1"},
    )
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr[-2000:]
    verdicts = {(f["name"], f["node"]): f for f in json.loads(certificate.read_text())["figures"]}
    assert verdicts[(one, None)]["status"] == "slow" and verdicts[(one, None)]["deviation"] < -0.2
    assert verdicts[(two, None)]["status"] == "failed" and "failed" in verdicts[(two, None)]["why_missing"]
    assert f"slow: {one}" in faulty.stdout and f"failed: {two}" in faulty.stdout
