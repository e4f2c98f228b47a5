"""`ddlbench status --watch` follows a sweep from its files (no queue): it shows the points ended and
running, and stops once every point has a record."""

from __future__ import annotations

import os
import subprocess
import time

from conftest import BIN, REPO

from ddlbench.config import load_sweep_config
from ddlbench.records import record_path
from ddlbench.sweep import expand_sweep
from tests.test_aggregate import record_for, write


def test_watch_shows_a_running_point_and_stops_when_its_record_lands(write_sweep):
    path = write_sweep(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1], repetitions=3)
    plan = expand_sweep(load_sweep_config(path))
    first, second, last = plan.points
    write(plan, [record_for(first, 100.0), record_for(second, 100.0)])
    log = plan.config.sweep_dir / "logs" / "run_point" / f"{last.point_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("started\n")  # Snakemake creates a job's log as it starts it
    watcher = subprocess.Popen(
        [str(BIN / "ddlbench"), "status", "--configfile", str(path), "--watch", "--no-queue", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip
    time.sleep(4)  # it starts (imports) and looks several times; the point is still running
    assert watcher.poll() is None, watcher.communicate()[0]
    write(plan, [record_for(last, 100.0, status="oom")])
    out, _ = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, out
    assert "3 points: 2 ok, 1 running" in out  # not a terminal: a plain line when the counts change
    assert "2 ok, 1 oom" in out and record_path(plan.config.sweep_dir, last.point_id).exists()
