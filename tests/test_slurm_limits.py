"""A sweep larger than an enforced submit limit, on the real one-host cluster (tests/cluster/slurm.sh
enforces associations, limits and QOS): through `snakemake --profile slurm` and through `ddlbench
submit`, every point runs and none fails at submission.

The limit is a QOS of these tests' own (MaxSubmitJobsPerUser=3), which only jobs naming it count
against: other tests running at the same time, in QOS normal, are neither held nor counted.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest
import yaml
from conftest import BIN, run_cli, run_snakemake
from slurm_support import records_of, sacctmgr, sweep, user_qos

pytestmark = pytest.mark.slurm

QOS = "ddlbench_limit3"
LIMIT = 3


def sbatch_in_qos(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sbatch", f"--qos={QOS}", "--time=5", "--output=/dev/null", *args, "--wrap", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def limited_qos():
    """QOS ddlbench_limit3, open to this user, at most 3 jobs queued per user; the limit is lifted and the
    QOS removed from the user afterwards, whatever the tests did."""
    with user_qos(QOS, f"MaxSubmitJobsPerUser={LIMIT}"):
        try:
            # the limit holds: an array of 4 tasks is 4 jobs, one too many
            refused = sbatch_in_qos("--array=0-3", "--hold")
            assert refused.returncode != 0 and "QOSMaxSubmitJobPerUserLimit" in refused.stderr, refused.stderr
            yield QOS
        finally:
            sacctmgr("modify", "qos", QOS, "set", "MaxSubmitJobsPerUser=-1")


@pytest.fixture
def env(tmp_path):
    """A private XDG_CONFIG_HOME for the profile, and the venv's commands first on PATH."""
    return {
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DDLBENCH_INJECT_FAULT": "",
    }


def six_points(write_sweep, name: str):
    """resnet8 on 1 and 2 nodes × 3 batch sizes, one measured step each."""
    return sweep(write_sweep, name, nodes=[1, 2], batch_size=[4, 8, 16], steps=1, timeout_s=60)


def test_profile_sweep_larger_than_the_submit_limit_completes(limited_qos, env, write_sweep, tmp_path):
    written = run_cli(
        "profile", "slurm", "--partition", "cpu", "--qos", limited_qos, "--time-margin-s", "60",
        "--status-wait", "3", env=env,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    assert f"jobs: {LIMIT}, not 100: QOS '{QOS}' MaxSubmitJobsPerUser is {LIMIT}" in written.stdout
    profile = (tmp_path / "xdg" / "snakemake" / "slurm" / "config.yaml").read_text()
    assert yaml.safe_load(profile)["jobs"] == LIMIT
    sweep_file = six_points(write_sweep, "limited_smk")
    result = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "QOSMaxSubmitJobPerUserLimit" not in result.stderr
    records = records_of(tmp_path / "results" / "limited_smk")
    assert len(records) == 6
    assert {record.status for record in records.values()} == {"ok"}, {p: r.reason for p, r in records.items()}


def test_snakemake_is_refused_when_the_users_own_jobs_leave_too_little_room(limited_qos, env, write_sweep, tmp_path):
    written = run_cli("profile", "slurm", "--partition", "cpu", "--qos", limited_qos, env=env)
    assert written.returncode == 0, written.stderr
    held = [sbatch_in_qos("--hold", "--parsable").stdout.strip() for _ in range(2)]
    try:
        assert all(held), held
        result = run_snakemake("--profile", "slurm", "--configfile", str(six_points(write_sweep, "crowded")), env=env)
    finally:
        subprocess.run(["scancel", *held], timeout=60)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        f"Snakemake would queue up to {LIMIT} jobs at once, but QOS '{QOS}' MaxSubmitJobsPerUser is {LIMIT} and 2 "
        "of your jobs already count against it, leaving room for 1; run with `--jobs 1`"
    ) in result.stderr
    assert not (tmp_path / "results" / "crowded" / "points").exists()


def test_submit_sweep_larger_than_the_submit_limit_completes(limited_qos, env, write_sweep, tmp_path):
    sweep_file = six_points(write_sweep, "limited_submit")
    sweep_dir = tmp_path / "results" / "limited_submit"
    submitted = run_cli(
        "submit", "--configfile", str(sweep_file), "--partition", "cpu", "--qos", limited_qos,
        "--time-margin-s", "60", env=env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "QOSMaxSubmitJobPerUserLimit" not in submitted.stderr
    records = records_of(sweep_dir)
    assert {record.status for record in records.values()} == {"ok"} and len(records) == 6
    index = yaml.safe_load((sweep_dir / "slurm-jobs.json").read_text())
    arrays = {job_ids[0].split("_")[0] for job_ids in index.values()}
    # two shapes (1 and 2 nodes) of 3 points each, which the limit of 3 lets in one array at a time
    assert len(arrays) >= 2
    assert "wait for room in the queue (QOS 'ddlbench_limit3' MaxSubmitJobsPerUser=3" in submitted.stderr


def test_sbatch_refusals_for_the_limit_are_retried_until_every_point_is_in(limited_qos, write_sweep, caplog):
    """As if the limits could not be read (a group limit counting other users' jobs, say): arrays go in
    too large, sbatch refuses them, and they are tried again smaller and later, never recorded as failed."""
    from ddlbench.launch.resources import Site
    from ddlbench.launch.slurm import query_cluster
    from ddlbench.launch.submission import plan_resources, submit_points, wait_for
    from ddlbench.launch.waves import QueueWatch
    from ddlbench.sweep import plan_sweep

    plan = plan_sweep(yaml.safe_load(six_points(write_sweep, "refused").read_text()))
    site = Site(partition="cpu", qos=limited_qos, time_margin_s=60)
    planned = plan_resources(plan.points, site, sweep=plan.config)
    blind = dataclasses.replace(query_cluster(), limits_enforced=False, max_job_count=None)
    caplog.set_level("WARNING", logger="ddlbench.launch.waves")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        jobs = submit_points(
            list(plan.points), planned, sweep_dir=plan.config.sweep_dir, name="refused", facts=blind,
            watch=QueueWatch(poll_s=2, max_poll_s=10),
        )  # fmt: skip
        wait_for(jobs, watch=QueueWatch(poll_s=2, max_poll_s=10))
    assert "sbatch refused for a limit (sbatch: error: QOSMaxSubmitJobPerUserLimit" in caplog.text
    records = records_of(plan.config.sweep_dir)
    assert {record.status for record in records.values()} == {"ok"} and len(records) == 6


WALL_QOS = "ddlbench_wall1"


@pytest.fixture(scope="module")
def short_qos():
    """QOS ddlbench_wall1, open to this user, whose jobs may run 1 minute at most (MaxWall): a job asking
    more would pend forever (no DenyOnLimit)."""
    with user_qos(WALL_QOS, "MaxWall=00:01:00"):
        yield WALL_QOS


def test_points_over_a_qos_maxwall_are_refused_before_anything_is_submitted(short_qos, env, write_sweep, tmp_path):
    import getpass

    sweep_file = sweep(write_sweep, "too_long", nodes=[1], batch_size=[4], steps=1, timeout_s=1800)
    site = ["--partition", "cpu", "--qos", short_qos, "--time-margin-s", "60"]
    roads = {
        "submit": run_cli("submit", "--configfile", str(sweep_file), *site, "--no-wait", env=env),
        "submit --pack": run_cli("submit", "--configfile", str(sweep_file), *site, "--pack", "auto", env=env),
    }
    assert run_cli("profile", "slurm", *site, env=env).returncode == 0
    roads["snakemake"] = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=env)
    for road, result in roads.items():
        assert result.returncode == 2, (road, result.stderr[-2000:])
        assert f"over QOS '{short_qos}' MaxWall=1 min" in result.stderr, (road, result.stderr[-2000:])
        assert "lower timeout_s" in result.stderr, road
    queued = subprocess.run(
        ["squeue", "-h", "-u", getpass.getuser(), "--qos", short_qos, "-o", "%i"], capture_output=True, text=True
    )
    assert queued.returncode == 0 and queued.stdout.strip() == ""  # nothing went in
    assert not (tmp_path / "results" / "too_long" / "submitit").exists()
