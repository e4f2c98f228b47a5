"""An srun step that SLURM never made is started again; one whose ranks ran is not (a fake `srun` at the
subprocess boundary, real ranks; the real controller's outage is in tests/test_slurm_outage.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from conftest import make_point

from ddlbench.launch.launchers import SrunLauncher
from ddlbench.launch.patience import PATIENCE_VAR
from ddlbench.launch.worker import rank_file

# fails its first FAILS calls with MESSAGE, as srun does when it cannot make the step; then runs the ranks'
# command as the single task of a step would (its own options skipped)
FAKE_SRUN = """#!/bin/bash
n=$(cat "$STATE/calls" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/calls"
if [ "$n" -lt "$FAILS" ]; then echo "srun: error: $MESSAGE" >&2; exit 1; fi
while [[ $1 == -* ]]; do shift; done
SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 exec "$@"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(tmp_path: Path, monkeypatch, *, fails: int, message: str):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "srun").write_text(FAKE_SRUN)
    (folder / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(tmp_path))
    monkeypatch.setenv("FAILS", str(fails))
    monkeypatch.setenv("MESSAGE", message)
    monkeypatch.setenv(PATIENCE_VAR, "60")
    environ = {**os.environ, "SLURM_JOB_ID": "7", "DDLBENCH_STEP_NODES": "127.0.0.1",
               "DDLBENCH_STEP_PORT": str(free_port())}  # fmt: skip
    point = make_point(steps=2)
    rank_dir = tmp_path / "ranks"
    rank_dir.mkdir()
    outcome = SrunLauncher(environ).launch(point, rank_dir=rank_dir, dump_params=None, timeout_s=120)
    return outcome, int((tmp_path / "calls").read_text()), rank_file(rank_dir, 0).exists()


@pytest.mark.parametrize(
    "message",
    [
        "Unable to create step for job 7: Unable to contact slurm controller (connect failure)",
        # the step of a point that ended during an outage still holds the node's memory for a moment after
        "Unable to create step for job 7: Memory required by task is not available",
    ],
)
def test_a_step_slurm_never_made_is_started_again(tmp_path, monkeypatch, message):
    outcome, calls, ran = launch(tmp_path, monkeypatch, fails=2, message=message)
    assert calls == 3 and ran
    assert outcome.returncodes == (0,) and not outcome.timed_out


def test_a_step_refused_for_good_is_not_started_again(tmp_path, monkeypatch):
    message = "Unable to create step for job 7: Requested node configuration is not available"
    outcome, calls, ran = launch(tmp_path, monkeypatch, fails=5, message=message)
    assert calls == 1 and not ran
    assert outcome.returncodes == (1,)
