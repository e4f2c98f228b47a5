"""Runners racing for the nodes of one allocation (ddlbench.launch.claims): real processes, one claims file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# One runner: claims 1 or 2 of 3 nodes again and again. While it holds them it creates a mark per node
# and per lane with O_EXCL, which fails if any other runner holds the same node or lane at that moment.
RUNNER = """
import os, sys, time
from ddlbench.launch import claims
job, rounds, marks, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
claims.POLL_S = 0.002
held = 0
for _ in range(rounds):
    with claims.claimed_nodes(job, ["n1", "n2", "n3"], count=count) as (nodes, lane):
        made = []
        for name in [f"node-{node}" for node in nodes] + [f"lane-{lane}"]:
            os.close(os.open(os.path.join(marks, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            made.append(name)
        time.sleep(0.001)
        for name in made:
            os.unlink(os.path.join(marks, name))
    held += 1
print(held)
"""


def test_runners_racing_for_nodes_never_hold_one_twice_and_lose_nothing(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the claims file lives in the temporary folder
    rounds = 100
    runners = [
        subprocess.Popen(
            [sys.executable, str(script), "77", str(rounds), str(marks), str(1 + index % 2)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(4)
    ]
    outcomes = [runner.communicate(timeout=300) for runner in runners]
    for runner, (out, err) in zip(runners, outcomes, strict=True):
        assert runner.returncode == 0, err[-2000:]  # FileExistsError: a node or lane held twice at once
        assert out.split() == [str(rounds)]  # every claim granted and given back
    assert list(marks.iterdir()) == []
    state = json.loads(Path(tmp_path / "ddlbench-claims-77.json").read_text())
    assert state["claims"] == {}  # nothing left held, nothing half-written
    assert not list(tmp_path.glob(".ddlbench-claims-77.json.*"))  # no temporary file left behind
