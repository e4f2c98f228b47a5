"""Inside a job, the workflow is planned again (Snakemake's job step parses the Snakefile): there the checks
meant for the login node are not repeated, and nothing asks the controller, which may not be answering."""

from __future__ import annotations

import os

import yaml

from ddlbench.launch.slurm import query_cluster
from ddlbench.launch.submission import MEMORY_DEFAULTS_VAR
from ddlbench.preflight import prepare_workflow
from tests.test_preflight import fake_cluster, sweep  # noqa: F401 (the fixture)


def test_a_job_plans_its_points_without_asking_the_controller(tmp_path, fake_cluster, monkeypatch):  # noqa: F811
    bin_dir, _ = fake_cluster
    site = tmp_path / "site-no-memory.yaml"  # the partition's defaults give each rank its memory
    site.write_text(yaml.safe_dump({"partition": "cpu"}))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(MEMORY_DEFAULTS_VAR, raising=False)
    monkeypatch.setenv(MEMORY_DEFAULTS_VAR, "")  # put back as it was after the test
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    for name in ("DDLBENCH_REAL_SBATCH", "DDLBENCH_SBATCH_GUARD_LOG"):  # the login side puts its guard in place
        monkeypatch.setenv(name, "")  # and both are put back as they were after the test
    login = prepare_workflow("sweep", sweep(tmp_path), site_file=str(site), cores=1, environ=os.environ)
    passed_on = os.environ[MEMORY_DEFAULTS_VAR]  # what sbatch's exported environment carries to the jobs
    assert '"per_cpu_mb": 1000' in passed_on
    # in the job: no scontrol answers (the controller is away), yet the plan and its resources are the same
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'scontrol: error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    query_cluster.cache_clear()
    calls = []
    monkeypatch.setattr("ddlbench.launch.submission.query_cluster", lambda: calls.append(1) or query_cluster())
    job = {**os.environ, "SLURM_JOB_ID": "7", MEMORY_DEFAULTS_VAR: passed_on}
    inside = prepare_workflow("sweep", sweep(tmp_path), site_file=str(site), cores=1, environ=job)
    assert calls == []
    assert inside.resources == login.resources
