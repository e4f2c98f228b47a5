"""Every workflow checks before it runs. The Snakefile, workflow/adaptive.smk and workflow/calibrate.smk
share one preamble (workflow/rules/preamble.smk, which calls ddlbench.preflight) and refuse the
same things with the same line: a point needing more cores than `--cores` gives, and, with a site file
on the login node, a point the cluster would reject. The cluster is a fake `scontrol` on PATH, at the
subprocess boundary: partition `cpu` of 4 nodes with 2 CPUs each."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from ddlbench.errors import DdlbenchError
from ddlbench.launch.slurm import query_cluster
from ddlbench.preflight import prepare_workflow
from tests.conftest import BIN, run_snakemake

PARTITIONS = "PartitionName=cpu Default=YES MaxTime=02:00:00 Nodes=n[1-4] State=UP TotalCPUs=8 TotalNodes=4"
NODES = "\n".join(f"NodeName=n{i} CPUTot=2 RealMemory=8000 State=IDLE Partitions=cpu" for i in range(1, 5))
CONFIG = "AccountingStorageEnforce = none\nDefMemPerCPU = 1000"
CORES_REFUSAL = (
    r"ddlbench: invalid (?:sweep config|calibration suite): point (?P<point>\S+) (?:\(and \d+ more points\) )?"
    r"(?P<rest>needs 2 ranks × 1 threads = 2 cores, but --cores is 1; .*)"
)
CLUSTER_REFUSAL = (
    r"ddlbench: invalid (?:sweep config|calibration suite): point (?P<point>\S+): "
    r"(?P<rest>needs 8 nodes, but partition 'cpu' has 4.*)"
)


@pytest.fixture
def fake_cluster(tmp_path):
    """A directory holding a fake `scontrol`, and a site file naming its partition."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    answers = {"partition": PARTITIONS, "node": NODES, "config": CONFIG}
    cases = "\n".join(f"  {what}) cat <<'EOF'\n{text}\nEOF\n  ;;" for what, text in answers.items())
    script.write_text(f'#!/bin/sh\ncase "$2" in\n{cases}\n  *) exit 1 ;;\nesac\n')
    script.chmod(0o755)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"partition": "cpu", "mem_per_rank_mb": 500}))
    query_cluster.cache_clear()
    yield bin_dir, site
    query_cluster.cache_clear()


def sweep(tmp_path, **overrides) -> dict:
    """Two 1-rank points and one of 2 ranks (1 thread each)."""
    return {
        "name": "checked",
        "results_dir": str(tmp_path / "results"),
        "models": ["resnet8"],
        "datasets": ["cifar10"],
        "strategies": ["ddp"],
        "nodes": [1, 2],
        "batch_size": [8],
        "steps": 2,
        "warmup_steps": 1,
    } | overrides


def suite(tmp_path, **overrides) -> dict:
    """A compute point on one rank, and an all-reduce on 2 ranks of one node and on 1 rank of each of 2."""
    return {
        "name": "checked",
        "results_dir": str(tmp_path / "results"),
        "nodes": [1, 2],
        "ranks_per_node": 2,
        "precisions": ["fp32"],
        "matmul_sizes": [64],
        "conv_shapes": [],
        "memory_bytes": 0,
        "collectives": ["all_reduce"],
        "message_bytes": [1024, 8192, 65536],
        "backends": ["torch"],
    } | overrides


# the workflow file, its kind, and a config of that kind
WORKFLOWS = [("Snakefile", "sweep", sweep), ("workflow/adaptive.smk", "adaptive", sweep)]
WORKFLOWS += [("workflow/calibrate.smk", "calibration", suite)]


@pytest.mark.parametrize(("snakefile", "kind", "config"), WORKFLOWS, ids=[kind for _, kind, _ in WORKFLOWS])
def test_each_kind_refuses_more_ranks_than_cores_unless_oversubscribing(tmp_path, snakefile, kind, config):
    with pytest.raises(DdlbenchError, match="needs 2 ranks × 1 threads = 2 cores, but --cores is 1"):
        prepare_workflow(kind, config(tmp_path), site_file=None, cores=1)
    allowed = prepare_workflow(kind, config(tmp_path, oversubscribe=True), site_file=None, cores=1)
    assert max(point.world_size for point in allowed.points) == 2 and allowed.resources == {}
    linted = prepare_workflow(kind, config(tmp_path), site_file=None, cores=1, linting=True)  # --lint runs nothing
    assert max(point.world_size for point in linted.points) == 2


@pytest.mark.parametrize(("snakefile", "kind", "config"), WORKFLOWS, ids=[kind for _, kind, _ in WORKFLOWS])
def test_each_kind_checks_the_cluster_on_the_login_node_only(
    tmp_path, fake_cluster, monkeypatch, snakefile, kind, config
):
    bin_dir, site = fake_cluster
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fits = prepare_workflow(kind, config(tmp_path), site_file=str(site), cores=1, environ={})
    assert {resources["nodes"] for resources in fits.resources.values()} == {1, 2}  # cores: SLURM's concern
    too_big = config(tmp_path, nodes=[1, 8])
    with pytest.raises(DdlbenchError, match=r"point \S+: needs 8 nodes, but partition 'cpu' has 4"):
        prepare_workflow(kind, too_big, site_file=str(site), cores=1, environ={})
    inside = prepare_workflow(kind, too_big, site_file=str(site), cores=1, environ={"SLURM_JOB_ID": "7"})
    assert {resources["nodes"] for resources in inside.resources.values()} == {1, 8}  # a job does not re-check


def test_inside_an_allocation_ddlbench_pack_packs_a_sweep_whose_points_fit_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$2" = hostnames ] && echo "$3" | tr , "\\n"\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    inside = {"DDLBENCH_PACK": "1", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1,n2"}
    # its points go to the dispatcher as job steps: no resources, and --cores is not theirs to fit
    packed = prepare_workflow("sweep", sweep(tmp_path), site_file=None, cores=1, environ=inside)
    assert packed.packed and packed.resources == {}
    with pytest.raises(DdlbenchError, match=r"needs 4 nodes; this allocation has 2"):
        prepare_workflow("sweep", sweep(tmp_path, nodes=[1, 4]), site_file=None, cores=1, environ=inside)
    with pytest.raises(DdlbenchError, match=r"is pinned to n3, not in this allocation"):
        prepare_workflow("sweep", sweep(tmp_path, nodes=[1], each_node=["n3"]), site_file=None, cores=1, environ=inside)
    for kind, config in (("adaptive", sweep), ("calibration", suite)):  # their launches are not the dispatcher's
        with pytest.raises(DdlbenchError, match=rf"DDLBENCH_PACK=1 packs a sweep's points .*; the {kind} workflow's"):
            prepare_workflow(kind, config(tmp_path), site_file=None, cores=2, environ=inside)
    outside = prepare_workflow("sweep", sweep(tmp_path), site_file=None, cores=2, environ={"DDLBENCH_PACK": "1"})
    assert not outside.packed  # no allocation, nothing to pack into


def test_an_unknown_workflow_kind_is_refused_naming_the_kinds(tmp_path):
    with pytest.raises(DdlbenchError, match="'sweeep' is not a workflow; accepted: sweep, adaptive, calibration"):
        prepare_workflow("sweeep", sweep(tmp_path), site_file=None, cores=2)


def test_the_preamble_does_not_import_torch():
    code = "import sys, ddlbench.preflight; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def refusals(results: dict[str, subprocess.CompletedProcess], pattern: str) -> dict[str, str]:
    """Each workflow's refusal, its point id left out; asserts each exited 2 with that one line."""
    found = {}
    for snakefile, result in results.items():
        assert result.returncode == 2, f"{snakefile}: {result.returncode}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr, result.stderr
        match = re.search(pattern, result.stderr)
        assert match, f"{snakefile}: {result.stderr[-2000:]}"
        found[snakefile] = match["rest"]
    return found


@pytest.mark.slow
def test_every_workflow_refuses_what_the_main_one_refuses(tmp_path, fake_cluster):
    """Dry runs (-n) of the three workflows: the local core check, then the cluster check under a site
    file, each refused with the same line (the point's id aside: a suite's points are not a sweep's)."""
    bin_dir, site = fake_cluster
    files = {}
    for _, kind, config in WORKFLOWS:
        for case, overrides in (("cores", {}), ("cluster", {"nodes": [1, 8]})):
            files[kind, case] = tmp_path / f"{kind}-{case}.yaml"
            files[kind, case].write_text(yaml.safe_dump(config(tmp_path, **overrides)))
    local = {
        snakefile: run_snakemake("-s", snakefile, "-n", "--cores", "1", "--configfile", str(files[kind, "cores"]))
        for snakefile, kind, _ in WORKFLOWS
    }
    assert len(set(refusals(local, CORES_REFUSAL).values())) == 1
    env = {"PATH": os.pathsep.join([str(bin_dir), str(BIN), os.environ["PATH"]]), "SLURM_JOB_ID": ""}
    cluster = ("--config", f"slurm_site={site}")
    slurm = {
        snakefile: run_snakemake("-s", snakefile, "-n", "--configfile", str(files[kind, "cluster"]), *cluster, env=env)
        for snakefile, kind, _ in WORKFLOWS
    }
    assert len(set(refusals(slurm, CLUSTER_REFUSAL).values())) == 1
