"""What the tests against the one-host SLURM cluster (tests/cluster/slurm.sh) share."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import BIN, run_cli

from ddlbench.config import load_sweep_config
from ddlbench.launch.profile import ProfileOptions, write_profile
from ddlbench.launch.resources import Site
from ddlbench.records import read_record


def cluster_answers() -> str | None:
    if shutil.which("sinfo") is None:
        return "sinfo is not installed"
    try:
        result = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer"
    if result.returncode != 0 or "cpu" not in result.stdout:
        return f"no SLURM cluster with a `cpu` partition: {result.stderr.strip() or result.stdout.strip()}"
    return None


def require_cluster() -> None:
    """Skip without the test cluster; fail instead under DDLBENCH_REQUIRE_SLURM=1 (CI)."""
    problem = cluster_answers()
    if problem:
        if os.environ.get("DDLBENCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"DDLBENCH_REQUIRE_SLURM=1 but {problem}; run `make slurm-up`")
        pytest.skip(f"{problem}; run `make slurm-up`")


def profile_env(tmp_path_factory, site: Site) -> dict[str, str]:
    """Environment for commands that submit: a profile `slurm` with `site` in a private XDG_CONFIG_HOME.
    Skips (fails under DDLBENCH_REQUIRE_SLURM=1) without a cluster."""
    require_cluster()
    config_home = tmp_path_factory.mktemp("xdg")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(config_home))
        write_profile(site, ProfileOptions(jobs=8, status_wait_s=2, latency_wait_s=5))
    return {
        "XDG_CONFIG_HOME": str(config_home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DDLBENCH_INJECT_FAULT": "",
    }


# a login node without torch (issue 30): refuses torch and torch.* wherever SLURM_JOB_ID is unset, so the
# login-side commands (submit, its wait, its finish) cannot import it while the jobs they start can
LOGIN_WITHOUT_TORCH = """\
import os
import sys


class LoginWithoutTorch:
    def find_spec(self, name, path=None, target=None):
        if (name == "torch" or name.startswith("torch.")) and not os.environ.get("SLURM_JOB_ID"):
            raise ImportError("torch is not importable on this login node (a test's blocker)")
        return None


sys.meta_path.insert(0, LoginWithoutTorch())
"""


def login_without_torch(folder: Path) -> dict[str, str]:
    """Environment for a login-side command that cannot import torch: a sitecustomize first on PYTHONPATH,
    written into `folder`, refusing torch outside SLURM jobs."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(LOGIN_WITHOUT_TORCH)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


ENDED_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")
ENDED_STATES += ("BOOT_FAIL", "DEADLINE")


def sbatch_wait(args: list[str], *, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`sbatch --parsable ARGS`, then wait for the job to end, polling scontrol every half second:
    what `sbatch --wait` does, without its sleeps of 2, 8 and then 32 s between checks (a 10 s job was
    seen as ended up to 32 s late). returncode: the job's exit code (128 + the signal where one ended it),
    or sbatch's own where the submission failed; stdout: sbatch's (the job id)."""
    submitted = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, env=env, timeout=60)
    if submitted.returncode != 0:
        return submitted
    job = submitted.stdout.strip().split(";")[0]
    end = time.monotonic() + timeout
    while True:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env)
        fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
        if fields.get("JobState") in ENDED_STATES:
            code, _, signal = fields.get("ExitCode", "1:0").partition(":")
            returncode = int(code) or (128 + int(signal) if signal not in ("", "0") else 0)
            if fields["JobState"] != "COMPLETED" and returncode == 0:
                returncode = 1
            return subprocess.CompletedProcess(submitted.args, returncode, submitted.stdout, fields["JobState"])
        if time.monotonic() > end:
            subprocess.run(["scancel", job], env=env)
            raise subprocess.TimeoutExpired(submitted.args, timeout)
        time.sleep(0.5)


def wait_until(predicate, *, timeout_s: float, what: str, poll_s: float = 1.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


def records_of(sweep_dir: Path) -> dict[str, object]:
    return {path.parent.name: read_record(path) for path in sorted((sweep_dir / "points").glob("*/record.json"))}


def one_row_per_point(sweep_file: Path, env: dict[str, str], expected_points: int) -> pd.DataFrame:
    result = run_cli("report", "--configfile", str(sweep_file), env=env)
    assert result.returncode == 0, result.stderr
    table = pd.read_parquet(load_sweep_config(sweep_file).sweep_dir / "table.parquet")
    assert len(table) == expected_points
    assert table["point_id"].is_unique
    return table


def sweep(write_sweep, name: str, **overrides) -> Path:
    """A small sweep of resnet8 points. Its 120 s limit is a guard against a hang, not a figure: a profile runs
    the points at once (4 points of 1-4 ranks: up to 9 rank processes, each about 6 CPU-s of torch start-up)
    on a 2-core host beside the other tests, and a 2-rank point passed 30 s that way (CI of 0e580e5). A test
    that waits for a point to time out names a shorter limit."""
    config = dict(
        name=name,
        models=["resnet8"],
        datasets=["cifar10"],
        strategies=["ddp"],
        nodes=[1, 2],
        ranks_per_node=[1],
        batch_size=[8],
        warmup_steps=1,
        steps=3,
        timeout_s=120,
    )
    return write_sweep(f"{name}.yaml", **(config | overrides))


def sacctmgr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def user_qos(name: str, *settings: str):
    """A QOS of the tests' own (`settings` such as "MaxWall=00:01:00"), open to this user while the block
    runs: only jobs naming it count against its limits or are held by them, so other tests are not. Its
    jobs are cancelled and it is taken from the user afterwards, whatever happened."""
    import getpass

    require_cluster()
    user = getpass.getuser()
    if not subprocess.run(
        ["sacctmgr", "-nP", "show", "qos", name, "format=name"], capture_output=True, text=True
    ).stdout:
        assert sacctmgr("add", "qos", name).returncode == 0
    try:
        if settings:
            changed = sacctmgr("modify", "qos", name, "set", *settings)
            assert changed.returncode == 0, changed.stderr
        assert sacctmgr("modify", "user", user, "set", f"qos+={name}").returncode == 0
        yield name
    finally:
        subprocess.run(["scancel", "--qos", name, "-u", user], capture_output=True, timeout=60)
        sacctmgr("modify", "user", user, "set", f"qos-={name}")
