"""A packed sweep on the real test cluster (`ddlbench submit --pack`): every point a job step of one
allocation, side by side where they fit; a killed step, a timed-out point and an allocation that ends
early cost only what they must."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, REPO, run_cli
from slurm_support import (
    login_without_torch,
    one_row_per_point,
    profile_env,
    records_of,
    sbatch_wait,
    sweep,
    wait_until,
)
from test_slurm_limits import LIMIT, QOS, limited_qos  # noqa: F401 (limited_qos: a fixture)

from ddlbench.launch.resources import Site

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory) -> dict[str, str]:
    return profile_env(tmp_path_factory, Site(partition="cpu", time_margin_s=60))


def _allocations(stdout: str) -> list[str]:
    return [line.split("\tjob ")[1].split("\t")[0] for line in stdout.splitlines() if line.startswith("allocation ")]


def _summary(sweep_dir: Path, job_id: str) -> dict:
    path = sweep_dir / "packed" / f"allocation-{job_id}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_packed_sweep_runs_every_point_as_a_step_of_one_allocation(slurm_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "packed", batch_size=[8, 16])  # 1 and 2 nodes × 2 batches: 4 points
    sweep_dir = tmp_path / "results" / "packed"
    planned = run_cli("plan", "--configfile", str(sweep_file), "--pack", "2", env=slurm_env)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith("4 points in 1 allocation(s) of up to 2 node(s)")
    # as on a login node without torch: the allocation's dispatcher and its points' ranks have it
    no_torch = login_without_torch(tmp_path / "no-torch")
    submitted = run_cli("submit", "--configfile", str(sweep_file), "--pack", "auto", env=slurm_env | no_torch)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    (job_id,) = _allocations(submitted.stdout)
    records = records_of(sweep_dir)
    assert len(records) == 4
    steps = set()
    for record in records.values():
        assert record.status == "ok", record.reason
        slurm = record.provenance.slurm
        assert slurm.job_id == job_id and slurm.num_nodes == 2
        assert slurm.step_id.startswith(f"{job_id}.")
        steps.add(slurm.step_id)
        nodes = slurm.step_nodes.split(",")
        assert len(nodes) == record.point.nodes
        assert sorted(rank.slurm_node for rank in record.ranks) == sorted(nodes)  # where SLURM ran the ranks
    assert len(steps) == 4  # a step each
    summary = _summary(sweep_dir, job_id)
    assert summary["state"] == "done" and summary["not_started"] == []
    single = [p for p in summary["points"] if len(p["nodes"]) == 1]
    assert len(single) == 2 and single[0]["nodes"] != single[1]["nodes"]  # side by side, a node each
    assert single[0]["start_s"] < single[1]["end_s"] and single[1]["start_s"] < single[0]["end_s"]
    assert json.loads((sweep_dir / "slurm-jobs.json").read_text()) == {point: [job_id] for point in records}
    table = one_row_per_point(sweep_file, slurm_env, 4)
    assert set(table["status"]) == {"ok"}


def test_a_killed_step_and_a_timed_out_point_end_only_their_own_steps(slurm_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "packfail", batch_size=[8, 16], timeout_s=40)
    sweep_dir = tmp_path / "results" / "packfail"
    # both b8 points hang: the 2-node one is killed by hand, the 1-node one runs into its timeout
    env = {**os.environ, **slurm_env, "DDLBENCH_INJECT_FAULT": "hang@-n2x1-b8-,hang@-n1x1-b8-"}
    submitted = run_cli("submit", "--configfile", str(sweep_file), "--pack", "2", "--no-wait", env=env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    (job_id,) = _allocations(submitted.stdout)

    def hanging_step() -> str | None:
        queued = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %N"], capture_output=True, text=True)
        for line in queued.stdout.splitlines():
            step, nodes = line.split()
            first_done = list(sweep_dir.glob("points/*n2x1-b16*/record.json"))
            if step.split(".")[1].isdigit() and nodes == "n[1-2]" and first_done:
                return step  # the 2-node step running after the b16 one has its record: the hanging b8
        return None

    step = wait_until(hanging_step, timeout_s=120, what="the hanging 2-node step", poll_s=1)
    subprocess.run(["scancel", step], check=True, env=env)
    wait_until(lambda: _summary(sweep_dir, job_id).get("state") == "done", timeout_s=180, what="the allocation")
    records = {point_id.split("-ddp-")[1].split("-t1")[0]: record for point_id, record in records_of(sweep_dir).items()}
    assert {key: r.status for key, r in records.items()} == {
        "n2x1-b16": "ok",
        "n2x1-b8": "failed",
        "n1x1-b16": "ok",
        "n1x1-b8": "timeout",
    }
    assert records["n2x1-b8"].provenance.slurm.step_id == step
    assert all(r.provenance.slurm.job_id == job_id for r in records.values())


def test_an_allocation_that_ends_early_leaves_a_record_for_each_unrun_point_and_submit_fails(
    slurm_env, write_sweep, tmp_path
):
    sweep_file = sweep(write_sweep, "packstop", nodes=[1], batch_size=[4, 8, 16], timeout_s=240)
    sweep_dir = tmp_path / "results" / "packstop"
    env = {**os.environ, **slurm_env, "DDLBENCH_INJECT_FAULT": "hang@-b4-"}
    # one node: the points run one after another in the plan's order (b16, b4, b8), b4 hanging
    command = [str(BIN / "ddlbench"), "submit", "--configfile", str(sweep_file), "--pack", "1"]
    submit = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = wait_until(lambda: _job_of(sweep_dir), timeout_s=120, what="the allocation's job id")
        wait_until(
            lambda: any("-b4-" in p["point_id"] for p in _summary(sweep_dir, job_id).get("points", [])),
            timeout_s=120,
            what="the hanging point to start",
        )
        first = records_of(sweep_dir)
        status = run_cli("status", "--configfile", str(sweep_file), "--points", env=slurm_env).stdout
        states = {line.split()[1].split("-")[4]: line.split()[0] for line in status.splitlines()[1:]}
        assert states == {"b16": "ok", "b4": "running", "b8": "pending"}, status  # one squeue for the allocation
        assert f"waiting for nodes in allocation {job_id}" in status
        subprocess.run(["scancel", job_id], check=True, env=env)  # the allocation ends: scancel, time limit, preemption
        out, err = submit.communicate(timeout=300)
    finally:
        submit.kill()
    summary = _summary(sweep_dir, job_id)
    assert summary["state"] == "stopped" and summary["ends_from"] == "scontrol show job"  # SLURM's end time
    records = {point_id.split("-")[4]: record for point_id, record in records_of(sweep_dir).items()}
    assert records["b16"].status == "ok" and len(first) == 1
    assert records["b4"].status == "timeout" and records["b4"].reason.startswith("stopped: the allocation ended")
    assert records["b8"].status == "timeout" and records["b8"].reason.startswith("not started: the allocation ended")
    assert records["b8"].provenance.slurm.job_id == job_id
    # submit says so, names the points and the command that runs them again, and fails
    assert submit.returncode == 3, out + err[-3000:]
    assert "2 point(s) not run" in out, out
    rerun = f"ddlbench rerun --configfile {sweep_file} --status unrun"  # exactly these, not every timeout
    assert rerun in out, out
    again = run_cli(*rerun.split()[1:], env=slurm_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 point(s) of sweep 'packstop' with status unrun to run again" in again.stdout
    records = records_of(sweep_dir)
    assert {r.status for r in records.values()} == {"ok"} and len(records) == 3
    (kept,) = first
    assert records[kept].provenance.slurm.job_id == job_id  # the first record stays as measured


def _job_of(sweep_dir: Path) -> str | None:
    """The packed allocation's job, from the jobs index that `submit` writes as it submits."""
    index = sweep_dir / "slurm-jobs.json"
    try:
        jobs = {job for ids in json.loads(index.read_text()).values() for job in ids}
    except (OSError, ValueError):
        return None
    return next(iter(jobs)) if len(jobs) == 1 else None


def test_per_node_certification_runs_every_node_at_once_in_one_allocation(slurm_env, tmp_path):
    """`ddlbench certify --pack all`: the single-node point once on each of the partition's 4 nodes
    (`each_node: all`), each a step pinned to its node, all four at once, in one job of the partition
    (asked for: `auto` would not wait for the whole partition, running allocations as wide as the widest point)."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        json.dumps(
            {
                "name": "packnode", "results_dir": str(tmp_path / "results"), "models": ["resnet8"],
                "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1], "each_node": "all",
                "batch_size": [8], "warmup_steps": 1, "steps": 3, "timeout_s": 120,
            }
        )
    )  # fmt: skip
    run = run_cli(
        "certify", "--system", "testcluster", "--partition", "cpu", "--db", str(tmp_path / "h.sqlite"),
        "--suite", str(suite), "--pack", "all", "--write-references", str(tmp_path / "proposed.yaml"), env=slurm_env,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]  # nothing referenced yet: not a pass
    folder = tmp_path / "results" / "packnode_testcluster_cpu"
    records = list(records_of(folder).values())
    assert sorted(record.point.node for record in records) == ["n1", "n2", "n3", "n4"]
    (job_id,) = {record.provenance.slurm.job_id for record in records}
    for record in records:
        assert record.status == "ok", record.reason
        assert record.provenance.slurm.num_nodes == 4
        assert record.provenance.slurm.step_nodes == record.point.node == record.ranks[0].slurm_node
    summary = _summary(folder, job_id)
    latest_start = max(p["start_s"] for p in summary["points"])
    assert all(p["end_s"] > latest_start for p in summary["points"])  # all four running at one moment
    assert (tmp_path / "proposed.yaml").exists()


def test_snakemake_inside_an_allocation_hands_the_points_without_a_record_to_the_dispatcher(
    slurm_env, write_sweep, tmp_path
):
    """The documented way (docs/slurm.md): `DDLBENCH_PACK=1 snakemake --configfile S --cores 2` as an sbatch
    job (or inside salloc): the whole workflow runs in one allocation, and one of its jobs, `ddlbench
    run-packed`, plans the points without a record into it and runs each as a step on nodes of its own.
    Run again, it finds nothing to do; a deleted record runs its one point again."""
    sweep_file = sweep(write_sweep, "packsnake", batch_size=[8, 16])
    sweep_dir = tmp_path / "results" / "packsnake"
    env = {**os.environ, **slurm_env}

    def snakemake_in_an_allocation(name: str) -> tuple[str, str]:
        script = tmp_path / f"{name}.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"#SBATCH --nodes=2 --exclusive --mem=0 --time=10 --output={tmp_path}/{name}-%j.out\n"
            "export DDLBENCH_PACK=1\n"
            f"cd {REPO}\n"
            f"exec {BIN}/snakemake --configfile {sweep_file} --cores 2\n"
        )
        done = sbatch_wait([str(script)], env=env, timeout=600)
        output = "\n".join(path.read_text() for path in tmp_path.glob(f"{name}-*.out"))
        assert done.returncode == 0, output[-3000:]
        return done.stdout.strip().split(";")[0], output

    job_id, _ = snakemake_in_an_allocation("first")
    records = records_of(sweep_dir)
    assert len(records) == 4 and {r.status for r in records.values()} == {"ok"}
    steps = {r.provenance.slurm.step_id for r in records.values()}
    assert len(steps) == 4 and all(step.startswith(f"{job_id}.") for step in steps)
    for record in records.values():
        assert sorted(rank.slurm_node for rank in record.ranks) == sorted(record.provenance.slurm.step_nodes.split(","))
    summary = _summary(sweep_dir, job_id)
    assert summary["state"] == "done" and len(summary["points"]) == 4 and summary["not_started"] == []
    (output,) = _inside_outputs(sweep_dir)  # what Snakemake waited for: the summary's copy
    assert json.loads(output.read_text()) == summary
    assert (sweep_dir / "report.html").exists()  # the whole workflow ran inside
    stamps = {path: path.stat().st_mtime_ns for path in sweep_dir.glob("points/*/record.json")}

    _, said = snakemake_in_an_allocation("again")
    assert "Nothing to be done" in said, said[-3000:]
    assert {path: path.stat().st_mtime_ns for path in sweep_dir.glob("points/*/record.json")} == stamps

    deleted = next(iter(stamps))
    deleted.unlink()
    third, _ = snakemake_in_an_allocation("third")
    again = records_of(sweep_dir)
    assert {r.status for r in again.values()} == {"ok"} and len(again) == 4
    assert {point for point, r in again.items() if r.provenance.slurm.job_id == third} == {deleted.parent.name}
    assert [p["point_id"] for p in _summary(sweep_dir, third)["points"]] == [deleted.parent.name]
    assert len(_inside_outputs(sweep_dir)) == 2


def _inside_outputs(sweep_dir: Path) -> list[Path]:
    """The outputs of Snakemake's run-packed jobs (inside-<digest>.json; not the plans, inside-<job>.plan.json)."""
    return [path for path in sweep_dir.glob("packed/inside-*.json") if not path.name.endswith(".plan.json")]


@pytest.mark.usefixtures("limited_qos")
def test_more_allocations_than_the_submit_limit_go_in_as_earlier_ones_end(slurm_env, write_sweep, tmp_path):
    """Four single-node allocations (a point pinned to each node, packed a node at a time) under a QOS that
    lets 3 jobs be queued: the fourth waits for room, none is refused."""
    nodes = ["n1", "n2", "n3", "n4"]
    sweep_file = sweep(write_sweep, "packlimit", nodes=[1], each_node=nodes, steps=1)
    submitted = run_cli(
        "submit", "--configfile", str(sweep_file), "--pack", "1", "--qos", QOS, env=slurm_env
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert len(set(_allocations(submitted.stdout))) == 4
    # the fourth waited for room (the limits read), or was refused for the limit and tried again (limits that
    # sacctmgr had not yet passed to the controller): either way it went in, and no point failed for it
    waited = f"wait for room in the queue (QOS '{QOS}' MaxSubmitJobsPerUser={LIMIT}" in submitted.stderr
    assert waited or "sbatch refused for a limit" in submitted.stderr, submitted.stderr[-3000:]
    records = records_of(tmp_path / "results" / "packlimit")
    assert sorted(r.point.node for r in records.values()) == nodes
    assert {r.status for r in records.values()} == {"ok"}
