"""A controller outage in the middle of three sweeps, on the real one-host cluster: `snakemake --profile
slurm`, `ddlbench submit` in waves (under a submit limit of 3) and `ddlbench submit --pack` run side by
side while slurmctld is stopped for OUTAGE_S and started again with its saved state. Every point of every
road must end ok, and no job may have been submitted twice.

One outage serves the three roads (each one alone would cost the same outage again). What each road meets
during it: Snakemake's plugin submits (through the sbatch guard) and polls; `submit` waits for room in the
queue (squeue) and submits its next wave; the packed dispatcher starts points as srun steps; runners inside
jobs ask scontrol for their allocation and launch their ranks' step.

Snakemake submits one job every SUBMIT_EVERY_S (its own rate limit), not one after another's end: a
submission after an end waits for the plugin's next poll, which can fall in the second between the job's
end and the controller's stop (then the next job went in before the outage, and the one after it waited
for that job's end, after the outage: a CI run's guard log stayed empty). With SUBMIT_EVERY_S < OUTAGE_S,
any outage that starts before the last point's turn holds a submission.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import BIN, REPO
from slurm_support import records_of, sweep, user_qos

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

OUTAGE_S = 65
SUBMIT_EVERY_S = 30  # Snakemake's rate limit: its 4 points go in at 0, 30, 60 and 90 s
SLURM_SH = REPO / "tests" / "cluster" / "slurm.sh"


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def submitted_since(began: str) -> list[tuple[str, str]]:
    """(job id, submit line) of every job of this user submitted since `began` (slurmdbd answers while
    the controller is down, and keeps what squeue forgets)."""
    text = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-u", getpass.getuser(), "-S", began, "--format=JobID,SubmitLine"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    jobs = []
    for line in text.splitlines():
        job_id, _, submit_line = line.partition("|")
        if "_" in job_id and not job_id.endswith("_0") and "[" not in job_id:
            continue  # an array's later tasks: one submission, listed once by its first task
        jobs.append((job_id, submit_line))
    return jobs


def queue_of_all_states() -> list[tuple[int, str, str]]:
    """(job id, state, comment) of this user's jobs squeue still lists, ended ones included (MinJobAge)."""
    command = ["squeue", "-h", "-u", getpass.getuser(), "-t", "all", "-o", "%A|%T|%k"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    return [(int(job), state, comment) for job, state, comment in (line.split("|", 2) for line in text.splitlines())]


def job_states() -> dict[str, str]:
    """Job (or array task) id → its state, for this user's jobs of the last day (sacct)."""
    command = ["sacct", "-X", "-n", "-P", "-u", getpass.getuser(), "-S", "now-1days", "--format=JobID,State"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    return {job: state.split()[0] for job, _, state in (line.partition("|") for line in text.splitlines())}


def snakemake_job_in(states: set[str], after: int) -> bool:
    """Whether a job the Snakemake plugin submitted (comment rule_run_point_…) since job `after` is in one of
    `states`."""
    return any(job > after and state in states and "rule_run_point" in comment
               for job, state, comment in queue_of_all_states())  # fmt: skip


def wait_for(condition, what: str, runs: dict[str, subprocess.Popen], timeout_s: float = 300) -> None:
    """Poll `condition` every 0.5 s until it holds; fail if `timeout_s` passes or a road ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        ended = {road: run.poll() for road, run in runs.items() if run.poll() is not None}
        assert not ended, f"roads ended before the outage ({what}): {ended}"
        time.sleep(0.5)


def test_three_roads_survive_a_controller_outage(write_sweep, tmp_path):
    with user_qos("ddlbench_outage3", "MaxSubmitJobsPerUser=3") as qos:
        env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "DDLBENCH_INJECT_FAULT": "",
        }
        site = ["--partition", "cpu", "--time-margin-s", "60"]
        profile = subprocess.run(
            [str(BIN / "ddlbench"), "profile", "slurm", *site, "--status-wait", "2", "--jobs", "4"],
            env=env, capture_output=True, text=True, cwd=REPO, check=False,
        )  # fmt: skip
        assert profile.returncode == 0, profile.stderr
        shape = dict(nodes=[1, 2], batch_size=[4, 8], steps=30, timeout_s=240)
        sweeps = {road: sweep(write_sweep, f"outage_{road}", **shape) for road in ("smk", "waves", "pack")}
        dirs = {road: tmp_path / "results" / f"outage_{road}" for road in sweeps}
        began = time.strftime("%Y-%m-%dT%H:%M:%S")
        newest = max((job for job, _, _ in queue_of_all_states()), default=0)
        ddlbench = str(BIN / "ddlbench")
        # one submission every SUBMIT_EVERY_S: later points are submitted during the outage
        limit = f"1/{SUBMIT_EVERY_S}s"
        smk = [str(BIN / "snakemake"), "--profile", "slurm", "--configfile", str(sweeps["smk"])]
        runs = {"smk": start([*smk, "--max-jobs-per-timespan", limit], env, tmp_path / "smk.log")}
        try:
            # the other two roads start once Snakemake's first job runs, so that when it has completed (and
            # the outage starts) each still needs the controller: `submit` waits for room for its 4th point
            # (3 fit the submit limit, none of them can have ended first) and the packed allocation has
            # points left to start as srun steps; Snakemake's next turn to submit comes during the outage
            # (it ends well before SUBMIT_EVERY_S, and the outage is longer than that)
            running = {"RUNNING", "COMPLETING", "COMPLETED"}
            wait_for(lambda: snakemake_job_in(running, newest), "Snakemake's first job running", runs)
            # its points sleep 0.3 s in each of their 30 steps (9 s in all): started after Snakemake's first
            # job runs, none of its first three can end before that job has, whatever each one's start-up took
            # (in a CI run a 1-node point of `submit` ended first, its 4th point went in before the outage, and
            # the road never met the outage)
            runs["waves"] = start(
                [ddlbench, "submit", "--configfile", str(sweeps["waves"]), *site, "--qos", qos],
                env | {"DDLBENCH_INJECT_FAULT": "slow:0.3"},
                tmp_path / "waves.log",
            )
            runs["pack"] = start(
                [ddlbench, "submit", "--configfile", str(sweeps["pack"]), *site, "--pack", "2"],
                env,
                tmp_path / "pack.log",
            )
            wait_for(lambda: snakemake_job_in({"COMPLETED"}, newest), "Snakemake's first job completed", runs)
            submitted = [
                job for job, _, comment in queue_of_all_states() if job > newest and "rule_run_point" in comment
            ]
            assert len(submitted) < 4, f"Snakemake submitted all its points before the outage: {submitted}"
            subprocess.run([str(SLURM_SH), "ctld-stop"], check=True, timeout=60)
            stopped = time.monotonic()
            try:
                time.sleep(OUTAGE_S)
                # a road may finish during the outage (its last results came in), never fail in it
                failed = {road: run.poll() for road, run in runs.items() if run.poll() not in (None, 0)}
                assert not failed, (failed, {road: (tmp_path / f"{road}.log").read_text()[-2000:] for road in failed})
            finally:
                subprocess.run([str(SLURM_SH), "ctld-start"], check=True, timeout=120)
            outage = time.monotonic() - stopped
            codes = {road: run.wait(timeout=900) for road, run in runs.items()}
        finally:
            for run in runs.values():
                if run.poll() is None:
                    run.kill()
    logs = {road: (tmp_path / f"{road}.log").read_text() for road in runs}
    assert outage >= 60
    assert codes == {"smk": 0, "waves": 0, "pack": 0}, {road: logs[road][-3000:] for road in runs}
    for road, folder in dirs.items():
        records = records_of(folder)
        assert len(records) == 4, (road, sorted(records))
        assert {record.status for record in records.values()} == {"ok"}, {p: r.reason for p, r in records.items()}
    # the outage was met, not missed: each road said the controller was not answering, and went on; the
    # Snakemake plugin's sbatch through the guard, which writes into the sweep's logs
    assert "SLURM controller is not answering" in logs["waves"]
    assert "SLURM controller is not answering" in logs["pack"]
    guard = (dirs["smk"] / "logs" / "sbatch-guard.log").read_text()
    assert "SLURM controller is not answering (`" in guard and "sbatch" in guard, guard
    # nothing submitted twice: every submission is one job, and every point was submitted once
    jobs = submitted_since(began)
    lines = Counter(line for _, line in jobs)
    assert all(count == 1 for count in lines.values()), [line for line, count in lines.items() if count > 1]
    for point in records_of(dirs["smk"]):
        assert sum(f"rule_run_point_wildcards_{point}" in line for _, line in jobs) == 1, point
    # a point of `submit` is submitted again only when its job failed before the point ran (a task whose
    # launcher step a controller just back refused): never two jobs that ran it
    states = job_states()
    for point, ids in json.loads((dirs["waves"] / "slurm-jobs.json").read_text()).items():
        ran = [job for job in ids if states.get(job) != "FAILED"]
        assert len(ran) == 1, (point, {job: states.get(job) for job in ids})
    assert sum("outage_pack" in line for _, line in jobs) == 1  # one allocation of 2 nodes for the 4 points
