"""Predictions used before running (ddlbench.analysis.analytic.foresight, ddlbench.preflight.foresee_misfits): a
point predicted not to fit in what its host gives each rank, or not to finish within its timeout, is flagged
with its figures before anything runs; with `predicted_misfits: skip` it is left unrun, with a record saying so,
and Snakemake runs the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_snakemake

from ddlbench.analysis.analytic.foresight import NOT_RUN, foresee
from ddlbench.config import sweep_config_from_mapping
from ddlbench.errors import ConfigError
from ddlbench.launch.cores import LOCK_DIR_VAR
from ddlbench.preflight import foresee_misfits, prepare_workflow
from ddlbench.provenance import host_memory_bytes
from ddlbench.records import read_record, record_path
from tests.conftest import make_point

ABCI = "workflow/machines/abci_v100.yaml"


@pytest.fixture
def cpu_machine(tmp_path):
    """A CPU machine file: ABCI's rates on a 4 GB host (the memory is what the test is about)."""
    data = yaml.safe_load(Path(ABCI).read_text())
    data["device"] |= {"kind": "cpu", "memory_bytes": 4_000_000_000}
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_ranks_that_share_a_host_share_its_memory(cpu_machine):
    points = [make_point(batch_size=batch, ranks_per_node=2) for batch in (8, 4096)]
    misfits, source = foresee(points, cpu_machine)
    assert source == f"predicted on {cpu_machine}"
    (misfit,) = misfits
    assert (misfit.point_id, misfit.kind, misfit.status) == (points[1].point_id, "memory", "oom")
    assert "a rank, above the 2.0 GB a rank has (host 4.0 GB ÷ 2 rank(s))" in misfit.text
    assert foresee(points, cpu_machine, ranks_per_host=lambda point: 1)[0] == []  # alone on the host it fits


def test_a_point_predicted_to_run_past_its_timeout_is_flagged_with_its_time():
    slow = make_point(steps=200_000, timeout_s=30.0)
    (misfit,) = foresee([slow, make_point()], ABCI)[0]
    assert misfit.kind == "time" and misfit.status == "timeout" and misfit.point_id == slow.point_id
    assert misfit.text.startswith("predicted ") and "above its timeout_s 30" in misfit.text
    assert foresee([slow], None) == ([], "no machine file: nothing predicted before running")


def test_skip_needs_a_machine_file_known_before_planning():
    raw = {"name": "x", "models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1]}
    with pytest.raises(ConfigError, match="predicted_misfits"):
        sweep_config_from_mapping(raw | {"predicted_misfits": "skip", "calibrate": "workflow/calibration/default.yaml"})


@pytest.mark.slow
def test_skip_leaves_the_misfit_unrun_with_a_record_and_snakemake_runs_the_rest(tmp_path, cpu_machine):
    raw = {
        "name": "foresee", "results_dir": str(tmp_path / "results"), "machine": str(cpu_machine),
        "predicted_misfits": "skip", "models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"],
        "nodes": [1], "ranks_per_node": [2], "batch_size": [8, 4096], "warmup_steps": 1, "steps": 2,
        "oversubscribe": True,
    }  # fmt: skip
    said: list[str] = []
    prepared = prepare_workflow("sweep", raw, site_file=None, cores=2, dry_run=True)  # a dry run writes nothing
    config = prepared.plan.config
    big = next(point for point in prepared.points if point.batch_size == 4096)
    assert not record_path(config.sweep_dir, big.point_id).exists()
    # locally the 2 ranks share this host: 4096 does not fit in 2 GB a rank
    (misfit,) = foresee_misfits(prepared.plan, on_slurm=False, say=said.append)
    assert misfit.point_id == big.point_id and "left unrun" in said[0] and big.point_id in said[1]
    record = read_record(record_path(config.sweep_dir, big.point_id))
    assert record.status == "oom" and record.reason.startswith(f"{NOT_RUN}not to fit: predicted peak")
    assert record.metrics is None and record.provenance.launcher == "none"
    # Snakemake runs the point that fits and leaves the one with its record alone
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(raw))
    done = run_snakemake("--cores", "2", "--configfile", str(sweep))
    assert done.returncode == 0, done.stderr[-3000:]
    small = next(point for point in prepared.points if point.batch_size == 8)
    assert read_record(record_path(config.sweep_dir, small.point_id)).status == "ok"
    assert read_record(record_path(config.sweep_dir, big.point_id)).reason == record.reason  # kept as it was


def test_local_points_ask_for_their_predicted_memory_on_this_host(cpu_machine):
    """Locally, every point asks Snakemake for its predicted memory on this host (mem_mb: the busiest rank's
    predicted peak × its ranks), bounded by this host's memory; on SLURM its allocation decides instead."""
    raw = {
        "name": "memory", "machine": str(cpu_machine), "models": ["resnet8"], "datasets": ["cifar10"],
        "strategies": ["ddp"], "nodes": [1], "ranks_per_node": [1, 2], "batch_size": [8, 512],
    }  # fmt: skip
    prepared = prepare_workflow("sweep", raw, site_file=None, cores=2, dry_run=True)
    asked = {point.point_id: prepared.resources[point.point_id]["mem_mb"] for point in prepared.points}
    by = {(point.world_size, point.batch_size): asked[point.point_id] for point in prepared.points}
    assert by[(1, 512)] > by[(1, 8)] > 0  # a larger batch holds more activations
    assert by[(2, 8)] >= 2 * by[(1, 8)] - 1  # two ranks on this host: twice one (each ceiled to a MB)
    assert prepared.host_memory_mb == host_memory_bytes() // 2**20 > 0
    assert all(mb <= prepared.host_memory_mb for mb in asked.values())
    unpredicted = {key: value for key, value in raw.items() if key != "machine"}
    without = prepare_workflow("sweep", unpredicted, site_file=None, cores=2, dry_run=True)
    assert without.resources == {} and without.host_memory_mb is None  # nothing predicted, nothing asked


@pytest.mark.slow
def test_points_whose_memory_together_exceeds_the_bound_or_that_run_alone_run_one_after_the_other(
    tmp_path, cpu_machine
):
    """Two single-rank points on 2 cores run side by side, unless their predicted memory together exceeds
    the bound (here --resources mem_mb, in place of the host's: what two single-rank gpt_large points,
    11 and 14 GB predicted, needed on a 23 GB host), or the sweep says `alone` (each point with the host to
    itself, its memory still asked for)."""
    raw = {
        "name": "side", "results_dir": str(tmp_path / "results"), "machine": str(cpu_machine), "models": ["resnet8"],
        "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1], "ranks_per_node": [1], "batch_size": [8, 16],
        "warmup_steps": 1, "steps": 30,
    }  # fmt: skip
    prepared = prepare_workflow("sweep", raw, site_file=None, cores=2, dry_run=True)
    largest = max(resources["mem_mb"] for resources in prepared.resources.values())
    alone = prepare_workflow("sweep", raw | {"alone": True}, site_file=None, cores=2, dry_run=True)
    assert all(alone.resources[p] == prepared.resources[p] | {"host": 1} for p in prepared.resources)
    assert alone.calibration_resources == {"host": 1} and prepared.calibration_resources == {}
    spans, shared = {}, {}
    for label, bound in (("room for both", 4 * largest), ("room for one", largest + largest // 2), ("alone", 0)):
        sweep = tmp_path / f"{label}.yaml"
        sweep.write_text(yaml.safe_dump(raw | {"name": label.replace(" ", "_"), "alone": label == "alone"}))
        bound = bound or 4 * largest
        # a ledger of this test's own (the CPU locks' folder): points other tests run meanwhile are not beside these
        locks = {LOCK_DIR_VAR: str(tmp_path / f"locks-{label.replace(' ', '_')}")}
        done = run_snakemake("--cores", "2", "--resources", f"mem_mb={bound}", "--configfile", str(sweep), env=locks)
        assert done.returncode == 0, done.stderr[-3000:]
        folder = tmp_path / "results" / label.replace(" ", "_")
        records = [read_record(record_path(folder, point.point_id)) for point in prepared.points]
        spans[label] = sorted((r.provenance.start_time, r.provenance.end_time) for r in records)
        shared[label] = [r.metrics.shared_host_s for r in records]
        if label == "room for both":  # each record names the other, beside it on the host
            for record, other in zip(records, records[::-1], strict=True):
                assert record.metrics.shared_host_s > 0 and other.point_id in record.metrics.cores_note
    (_, first_end), (second_start, _) = spans["room for both"]
    assert second_start < first_end, spans  # side by side: the test can tell
    for label in ("room for one", "alone"):
        (_, first_end), (second_start, _) = spans[label]
        assert second_start >= first_end, (label, spans)  # one after the other
        assert shared[label] == [0.0, 0.0], (label, shared)  # and their records say so
