"""ddlbench against a real SLURM controller: `snakemake --profile slurm`, `ddlbench submit` (submitit),
failures, reruns, status and the checks made before submission.

Needs the one-host cluster of tests/cluster/slurm.sh (`make slurm-up`). Without it these tests skip,
unless DDLBENCH_REQUIRE_SLURM=1 (CI sets it), when they fail instead.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import time

import pytest
import yaml
from conftest import BIN, REPO, job_counts, run_cli, run_snakemake
from slurm_support import (
    login_without_torch,
    one_row_per_point,
    profile_env,
    records_of,
    sbatch_wait,
    sweep,
    wait_until,
)

from ddlbench.launch.resources import Site
from ddlbench.records import read_record

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory) -> dict[str, str]:
    """Environment for commands that submit: a profile `slurm` in a private XDG_CONFIG_HOME, as
    `ddlbench profile slurm --partition cpu` writes it (memory from the partition, whole nodes)."""
    return profile_env(tmp_path_factory, Site(partition="cpu", time_margin_s=60))


def slurm_dir():
    """The test cluster's state folder (tests/cluster/slurm.sh's DIR)."""
    from pathlib import Path

    return Path(os.environ.get("DDLBENCH_SLURM_DIR", "/var/tmp/ddlbench-slurm"))


# (strategy, ranks per node, extra point fields): data parallel, a pipeline across the two nodes,
# and a 2-D hybrid whose filter-parallel groups sit inside a node and whose replicas span the nodes
SRUN_CASES = [
    ("ddp", 1, {}),
    ("1f1b", 1, {"micro_batches": 2, "model_options": (("norm", "group"),)}),
    ("dp_filter", 2, {"split": 2, "model_options": (("norm", "group"),)}),
]


def test_calibrate_submits_its_points_as_slurm_jobs(slurm_env, tmp_path):
    """`ddlbench calibrate --submit`: every point a submitit job whose ranks are an srun step in its own
    allocation; the 2-node point spans both nodes; the machine file names the link by the host the ranks
    really ran on (this cluster's nodes share one host, so: within a node)."""
    import socket

    import yaml

    from ddlbench.analysis.machine.machine_file import read_machine
    from ddlbench.train.calibration.records import read_calibration_record

    suite = {
        "name": "slurmcal", "results_dir": str(tmp_path / "results"), "nodes": [1, 2], "ranks_per_node": 2,
        "precisions": ["fp32"], "matmul_sizes": [64], "conv_shapes": [[2, 8, 8, 3]], "memory_bytes": 1 << 20,
        "message_bytes": [1024, 16384, 262144], "backends": ["torch"], "warmup": 1, "iterations": 4,
        "oversubscribe": True,
    }  # fmt: skip
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    out = tmp_path / "machine.yaml"
    ran = run_cli(
        "calibrate", "--submit", "--configfile", str(tmp_path / "suite.yaml"), "--out", str(out), env=slurm_env
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    machine = read_machine(out)
    assert machine["failed_points"] == [] and machine["hosts"] == [socket.gethostname()]
    assert set(machine["links"]) == {"intra_node"}
    assert {entry["layout"] for entry in machine["collectives"]} == {"1x2", "2x1"}
    folder = tmp_path / "results" / "slurmcal" / "calibration"
    assert (folder / "submitit").is_dir()  # submitit's job folders, beside the records
    records = [read_calibration_record(path) for path in (folder / "points").glob("*/record.json")]
    assert len(records) == 3 and {record.launcher for record in records} == {"srun"}
    across = next(record for record in records if record.point.nodes == 2)
    assert len({rank.slurm_node for rank in across.ranks}) == 2  # one rank on each node


@pytest.mark.parametrize(("strategy", "per_node", "extra"), SRUN_CASES, ids=[c[0] for c in SRUN_CASES])
def test_srun_ranks_on_two_nodes_match_the_local_run(slurm_env, tmp_path, strategy, per_node, extra):
    """The same point through srun over two (virtual) nodes and as local processes: same weights."""
    from tests.equivalence import layout_point

    point = layout_point(strategy=strategy, nodes=2, ranks_per_node=per_node, steps=3, **extra)
    local = tmp_path / "local.pt"
    result = run_cli(
        "run-point", "--spec", point.to_json(), "--out", str(tmp_path / "local.json"), "--launcher", "local",
        "--dump-params", str(local), env=slurm_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert read_record(tmp_path / "local.json").status == "ok", read_record(tmp_path / "local.json").reason
    command = shlex.join(
        [str(BIN / "ddlbench"), "run-point", "--spec", point.to_json(), "--out", str(tmp_path / "srun.json"),
         "--dump-params", str(tmp_path / "srun.pt")]
    )  # fmt: skip
    batch = sbatch_wait(
        ["--nodes=2", f"--ntasks-per-node={per_node}", f"--mem={1000 + 1000 * per_node}M",
         "--time=5", f"--output={tmp_path / 'job.out'}", "--wrap", command],
        env={**os.environ, **slurm_env},
    )  # fmt: skip
    assert batch.returncode == 0, batch.stderr + (tmp_path / "job.out").read_text()
    record = read_record(tmp_path / "srun.json")
    assert record.status == "ok", record.reason
    assert record.provenance.launcher == "srun"
    assert record.provenance.slurm.num_nodes == 2
    assert record.provenance.slurm.partition == "cpu"
    assert len(record.ranks) == point.world_size
    # each rank says which CPUs it could use and who decided; the virtual nodes of this cluster share
    # one host's cores, which the record must admit rather than hide
    assert all(rank.cpus and rank.cpu_binding for rank in record.ranks)
    hosts = {rank.hostname for rank in record.ranks}
    shared = len(hosts) == 1 and sum(r.threads for r in record.ranks) > len({c for r in record.ranks for c in r.cpus})
    assert record.metrics.oversubscribed == shared
    import torch

    ours, theirs = torch.load(tmp_path / "srun.pt"), torch.load(local)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)


def test_profile_sweep_records_failures_and_rerun_fixes_exactly_those(slurm_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "faults", nodes=[1, 2], ranks_per_node=[1, 2], timeout_s=60)
    faults = {"DDLBENCH_INJECT_FAULT": "raise@-n1x2-,hang@-n2x1-"}
    result = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=slurm_env | faults)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir = tmp_path / "results" / "faults"
    records = records_of(sweep_dir)
    by_shape = {point_id.split("-")[3]: record for point_id, record in records.items()}
    assert {shape: r.status for shape, r in by_shape.items()} == {
        "n1x1": "ok", "n1x2": "failed", "n2x1": "timeout", "n2x2": "ok",
    }  # fmt: skip
    assert "InjectedFault" in by_shape["n1x2"].reason
    assert "ran past its limit of 60 s" in by_shape["n2x1"].reason
    spread = by_shape["n2x2"].provenance.slurm
    assert (spread.num_nodes, spread.num_cpus, spread.partition) == (2, 4, "cpu")
    assert by_shape["n2x2"].provenance.slurm_job_id == spread.job_id
    # the default profile: whole nodes, and memory from the partition (DefMemPerCPU) that fits 2 ranks a node
    assert spread.exclusive is True
    assert (sweep_dir / "report.html").exists()

    status = run_cli("status", "--configfile", str(sweep_file), env=slurm_env)
    assert status.returncode == 0, status.stderr
    assert "4 points: 2 ok, 1 failed, 1 timeout" in status.stdout
    assert f"jobs {by_shape['n1x2'].provenance.slurm_job_id}" in status.stdout

    untouched = {
        shape: (sweep_dir / "points" / r.point_id / "record.json").read_text() for shape, r in by_shape.items()
    }
    rerun = run_cli(
        "rerun", "--configfile", str(sweep_file), "--status", "failed,timeout", "--time-factor", "2", env=slurm_env
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "2 point(s)" in rerun.stdout
    after = records_of(sweep_dir)
    assert {r.point_id: r.status for r in after.values()} == {r.point_id: "ok" for r in by_shape.values()}
    for shape in ("n1x1", "n2x2"):  # not rerun
        assert (sweep_dir / "points" / by_shape[shape].point_id / "record.json").read_text() == untouched[shape]
    for shape in ("n1x2", "n2x1"):  # rerun, the earlier record kept
        kept = sweep_dir / "points" / by_shape[shape].point_id / "previous" / "record-1.json"
        assert kept.read_text() == untouched[shape]
        assert after[by_shape[shape].point_id].provenance.slurm_job_id != by_shape[shape].provenance.slurm_job_id
    table = one_row_per_point(sweep_file, slurm_env, 4)
    assert set(table["status"]) == {"ok"}


def test_point_over_its_memory_limit_is_oom_and_reruns_with_more_memory(slurm_env, write_sweep, tmp_path):
    # resnet8 at batch 1024 holds about 1.5 GB per rank for seconds: over 100 MB + the launcher's share
    # (SLURM polls memory every second), well under 30 × 100 MB + that share
    sweep_file = sweep(write_sweep, "memory", nodes=[2], batch_size=[1024], steps=1, slurm={"mem_per_rank_mb": 100})
    result = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=slurm_env)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = records_of(tmp_path / "results" / "memory").values()
    assert record.status == "oom"
    assert "exceeded memory limit" in record.reason.lower()
    # alone the point runs 15 s of its 30 s limit (two steps of 2.7 s backward); beside another xdist worker's
    # test it ran past 30 s twice in CI, so the rerun is also given 4× the time: this test is about memory
    rerun = run_cli(
        "rerun",
        "--configfile",
        str(sweep_file),
        "--status",
        "oom",
        "--mem-factor",
        "30",
        "--time-factor",
        "4",
        env=slurm_env,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (again,) = records_of(tmp_path / "results" / "memory").values()
    assert again.status == "ok", again.reason
    table = one_row_per_point(sweep_file, slurm_env, 1)
    assert table["slurm_node_list"].iloc[0] is not None


def test_scancelled_point_has_no_record_and_the_next_run_reruns_only_it(slurm_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "cancel", timeout_s=240)
    sweep_dir = tmp_path / "results" / "cancel"
    env = {**os.environ, **slurm_env, "DDLBENCH_INJECT_FAULT": "hang@-n2x1-"}
    snakemake = subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "slurm", "--configfile", str(sweep_file)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:

        def hanging_job() -> str | None:
            if not list(sweep_dir.glob("points/*n1x1*/record.json")):
                return None  # the other point has finished: the hanging one is surely in training
            status = run_cli("status", "--configfile", str(sweep_file), env=slurm_env).stdout
            for line in status.splitlines():
                if line.startswith("running") and "-n2x1-" in line:
                    return line.split("jobs ")[1].split()[0]
            return None

        job_id = wait_until(hanging_job, timeout_s=180, what="the hanging point to run", poll_s=2)
        subprocess.run(["scancel", job_id], check=True, env=env)
        output, _ = snakemake.communicate(timeout=180)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
    assert snakemake.returncode != 0
    assert "Error in rule run_point" in output and f"SLURM-job '{job_id}' failed" in output
    assert [path.parent.name for path in sweep_dir.glob("points/*/record.json")] == [
        path.parent.name for path in sweep_dir.glob("points/*n1x1*/record.json")
    ]
    again = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=slurm_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert job_counts(again) == {"all": 1, "report": 1, "run_point": 1, "total": 3}
    table = one_row_per_point(sweep_file, slurm_env, 2)
    assert set(table["status"]) == {"ok"}


def test_submit_runs_an_array_and_requeues_a_preempted_point(slurm_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "requeue", nodes=[1], repetitions=2, timeout_s=240)
    sweep_dir = tmp_path / "results" / "requeue"
    env = slurm_env | {"DDLBENCH_INJECT_FAULT": "hang~first@-r1-"}
    submitted = run_cli("submit", "--configfile", str(sweep_file), "--no-wait", env=env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    jobs = dict(line.split("\tjob ") for line in submitted.stdout.splitlines() if "\tjob " in line)
    assert len(jobs) == 2
    assert len({job_id.split("_")[0] for job_id in jobs.values()}) == 1, "two points of one shape: one array"
    index = json.loads((sweep_dir / "slurm-jobs.json").read_text())
    assert {point: ids[-1] for point, ids in index.items()} == jobs
    hanging = next(job_id for point_id, job_id in jobs.items() if "-r1-" in point_id)
    wait_until(lambda: list(sweep_dir.glob("points/*-r0-*/record.json")), timeout_s=180, what="the first repetition")
    time.sleep(5)  # the second repetition is past its warm-up and hangs
    subprocess.run(["scancel", "--signal=USR2", hanging], check=True, env={**os.environ, **env})  # as preemption
    # SLURM holds a requeued job for 120 s (its BeginTime, in squeue); an admin may let it go at once,
    # and so does the test: the requeue is SLURM's and submitit's either way
    wait_until(lambda: _pending_for_begin_time(hanging), timeout_s=60, what="the point to be requeued")
    subprocess.run(["scontrol", "update", f"JobId={hanging}", "StartTime=now"], check=True, env={**os.environ, **env})
    wait_until(lambda: list(sweep_dir.glob("points/*-r1-*/record.json")), timeout_s=240, what="the requeued point")
    records = records_of(sweep_dir)
    requeued = next(record for point_id, record in records.items() if "-r1-" in point_id)
    assert requeued.status == "ok", requeued.reason
    assert requeued.provenance.slurm.restarts == 1
    assert requeued.provenance.slurm.array_task_id is not None
    table = one_row_per_point(sweep_file, slurm_env, 2)
    assert set(table["status"]) == {"ok"}


def test_submit_resubmits_once_a_point_whose_job_was_lost_before_it_ran(slurm_env, write_sweep, tmp_path):
    # the job of repetition 1 exits at once, before its point runs, the first time (DDLBENCH_INJECT_FAULT=lost):
    # SLURM says FAILED and there is no record; submit submits that point once more, and only that one
    # and submit, its wait and its finish run as on a login node without torch (the jobs have it)
    sweep_file = sweep(write_sweep, "lost", nodes=[1], repetitions=2, timeout_s=120)
    sweep_dir = tmp_path / "results" / "lost"
    env = slurm_env | {"DDLBENCH_INJECT_FAULT": "lost@-r1-"} | login_without_torch(tmp_path / "no-torch")
    done = run_cli("submit", "--configfile", str(sweep_file), env=env)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert (sweep_dir / "report.html").exists()  # finished on the login node too
    lost = next(point for point in json.loads((sweep_dir / "slurm-jobs.json").read_text()) if "-r1-" in point)
    assert f"1 point(s) whose job failed before the point ran, submitted once more: {lost} (FAILED)" in done.stdout
    index = json.loads((sweep_dir / "slurm-jobs.json").read_text())
    assert {point: len(ids) for point, ids in index.items()} == {point: 1 + (point == lost) for point in index}
    states = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(index[lost]), "--format=JobID,State"],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout  # fmt: skip
    by_job = dict(line.split("|")[:2] for line in states.splitlines())
    assert [by_job[job].split()[0] for job in index[lost]] == ["FAILED", "COMPLETED"], by_job
    records = records_of(sweep_dir)
    assert {record.status for record in records.values()} == {"ok"} and len(records) == 2
    assert records[lost].provenance.slurm_job_id.split("_")[0] == index[lost][1].split("_")[0]


def _pending_for_begin_time(job_id: str) -> bool:
    queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True)
    return queued.stdout.split() == ["PENDING", "BeginTime"]


@pytest.mark.parametrize(
    ("overrides", "cli", "fragment"),
    [
        ({"nodes": [8]}, [], "needs 8 nodes, but partition 'cpu' has 4"),
        ({"slurm": {"partition": "gpux"}}, [], "partition 'gpux' does not exist; partitions of this cluster: cpu, gpu"),
        ({"timeout_s": 3 * 3600}, [], "is over the 120 min that partition 'cpu' allows"),
        ({}, ["--require-account"], "requires an account and none is set"),
    ],
)
def test_bad_submissions_are_refused_before_anything_is_queued(
    slurm_env, write_sweep, tmp_path, overrides, cli, fragment
):
    sweep_file = sweep(write_sweep, "refused", **overrides)
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    submitted = run_cli("submit", "--configfile", str(sweep_file), "--no-wait", *cli, env=slurm_env)
    assert submitted.returncode == 2
    assert fragment in submitted.stderr and "point resnet8-cifar10-ddp-" in submitted.stderr
    if not cli:
        snakemake = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=slurm_env)
        assert snakemake.returncode == 2
        assert fragment in snakemake.stderr and "Traceback" not in snakemake.stderr
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
    assert not (tmp_path / "results" / "refused" / "points").exists()


def test_the_adaptive_sweep_submits_its_short_runs_as_slurm_jobs(slurm_env, write_sweep, tmp_path):
    """workflow/adaptive.smk under `--profile slurm`: a launch of sampled points is a SLURM job with its
    points' configuration's allocation (2 nodes for 2-node points), whose ranks srun starts once for
    all its points, and the loop still stops and summarises. One configuration (over batch size, at 2
    nodes) keeps it to one job."""
    adaptive = {"over": "batch_size", "figure": "samples_per_s", "initial": 2, "max_rounds": 1, "steps": 2}
    sweep_file = sweep(write_sweep, "adaptive", nodes=[2], steps=20, repetitions=3, adaptive=adaptive)
    result = run_snakemake(
        "-s", "workflow/adaptive.smk", "--profile", "slurm", "--configfile", str(sweep_file), env=slurm_env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "results" / "adaptive" / "adaptive"
    (record,) = records_of(folder).values()
    assert record.status == "ok" and (record.point.nodes, record.point.steps) == (2, 2)
    assert record.provenance.launcher == "srun" and record.provenance.slurm.num_nodes == 2
    (launch,) = [json.loads(p.read_text()) for p in (folder / "launches").glob("*.json")]
    assert launch["launcher"] == "srun" and launch["nodes"] == 2 and launch["node_s"] > 0
    assert [span["point_id"] for span in launch["points"]] == [record.point_id]
    summary = json.loads((folder / "sampling.json").read_text())
    assert summary["measured_points"] == 1 and summary["rounds"][-1]["stop"]
    assert summary["measured_node_s"] == pytest.approx(launch["node_s"])
    assert summary["rounds"][-1]["why"] == "every candidate measured"


BUSY = 5  # busy processes beside each task on the degraded node


def test_per_node_certification_finds_the_degraded_node(slurm_env, tmp_path):
    """`ddlbench certify --profile slurm`: the single-node point runs once on each node, pinned there
    (--nodelist), one at a time (the virtual nodes share this host's cores); node n3 really is degraded:
    the test cluster's task prolog starts BUSY (5) busy processes beside every task there
    (tests/cluster/slurm.sh), which makes it about 11× slower than a healthy node (n1 511, n2 441, n3 40
    samples/s, this host alone, 2026-12-02). The proposed
    reference is the median over nodes (the slower healthy node's figure); judged with no upper bound and a
    lower one at half of it, n1 and n2 pass and n3 is named. A busy moment of this host only slows a node:
    the faster healthy node may run any amount faster (no upper bound to cross), the slower one is the
    reference itself, and n3 stays outside until a healthy node is slowed half as much as n3 is. With 3 busy
    processes (n3 about 5× slower) a busy moment of this host did that once, beside the test suite's other
    worker: n1 153, n2 597, n3 117 samples/s. 5 cost about 30 s more than 3 (the slow node starts slowly too).
    Node n2 is broken instead: a `corrupt` fault flips one bit of its replay's model (the silent-data-corruption
    check, ddlbench.certify.replay), so its replay alone differs from the three that agree (n1, n3; the
    slow node computes the same numbers): n2 fails that check, by name, while its throughput passes."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        json.dumps(
            {
                "name": "pernode", "results_dir": str(tmp_path / "results"), "models": ["resnet8"],
                "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1], "each_node": ["n1", "n2", "n3"],
                "batch_size": [16], "warmup_steps": 2, "steps": 12, "timeout_s": 120, "replay_steps": 2,
                "slurm": {"pinned_one_at_a_time": True},
            }
        )
    )  # fmt: skip
    marker = slurm_dir() / "degraded" / "n3"
    common = ["certify", "--system", "testcluster", "--partition", "cpu", "--db", str(tmp_path / "h.sqlite")]
    proposed = tmp_path / "proposed.yaml"
    marker.write_text(f"{BUSY}\n")
    try:
        run = run_cli(
            *common, "--suite", str(suite), "--profile", "slurm", "--write-references", str(proposed),
            "--min-tolerance", "0.5", "--json", str(tmp_path / "first.json"),
            env=slurm_env | {"DDLBENCH_INJECT_FAULT": "corrupt@on_n2-"},
        )  # fmt: skip
    finally:
        marker.unlink()
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]  # nothing referenced yet: not a pass
    folder = tmp_path / "results" / "pernode_testcluster_cpu"
    records = list(records_of(folder).values())
    assert sorted(record.point.node for record in records) == ["n1", "n2", "n3"]
    for record in records:
        assert record.status == "ok" and record.provenance.launcher == "srun"
        assert record.ranks[0].slurm_node == record.point.node  # --nodelist put it there
    spans = sorted((r.provenance.start_time, r.provenance.end_time) for r in records)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))  # one at a time
    # the proposal's value: the median over the three nodes' figures (the slower healthy node's)
    first = json.loads((tmp_path / "first.json").read_text())
    per_node_first = [f for f in first["figures"] if f["node"] and f["kind"] == "throughput"]
    replays = {f["node"]: f for f in first["figures"] if f["kind"] == "replay"}
    assert {node: f["status"] for node, f in replays.items()} == {"n1": "pass", "n2": "failed", "n3": "pass"}
    corrupted = next(record for record in records if record.point.node == "n2")
    assert f"rank 0 of {corrupted.point_id} on n2" in replays["n2"]["finding"], replays["n2"]
    assert f"failed: {replays['n2']['name']} on n2: rank 0 of" in run.stdout
    speeds = sorted(f["value"] for f in per_node_first)
    proposal = yaml.safe_load(proposed.read_text())
    reference = proposal["systems"]["testcluster:cpu"][per_node_first[0]["name"]]
    assert reference["value"] == pytest.approx(speeds[1], rel=1e-5) and reference["lower"] <= -0.5, reference
    # what a busy machine cannot fake: a node faster than the reference is no fault (a busy moment slows,
    # never speeds up), so the band keeps only its lower end, at half the reference
    reference |= {"lower": -0.5, "upper": None}
    proposed.write_text(yaml.safe_dump(proposal))
    judged = run_cli(
        *common, "--references", str(proposed), "--from-records", str(folder), "--json", str(tmp_path / "c.json")
    )
    certificate = json.loads((tmp_path / "c.json").read_text())
    per_node = {f["node"]: f for f in certificate["figures"] if f["node"] and f["kind"] == "throughput"}
    values = {node: round(f["value"], 1) for node, f in per_node.items()}
    # the degraded node is the slowest, by the factor its busy neighbours cost
    assert min(values, key=values.__getitem__) == "n3", values
    assert judged.returncode == 1, (judged.stdout, values)
    # slow told apart from broken: n3 is slow and computes right, n2 is fast enough and computes wrong
    assert certificate["nodes_outside"] == ["n2", "n3"], values
    assert per_node["n1"]["passed"] and per_node["n2"]["passed"] and per_node["n3"]["status"] == "slow"
    assert "nodes outside their band: n2, n3" in judged.stdout
    # the partition is uneven: its nodes' throughputs are further apart than the spread limit, n3 the slowest
    spread = next(f for f in certificate["figures"] if f["name"] == f"spread/{per_node['n1']['name']}")
    assert spread["status"] == "failed" and spread["finding"].startswith("n3 ") and spread["n"] == 3, spread
