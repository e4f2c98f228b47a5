"""zero2's collectives on a group of one rank: the calibration's probe (ddlbench.train.calibration.kernels,
_alone_collectives) against calls of a size it never timed, on a real one-rank gloo group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

# In a process of its own: the group of one is this process's default process group. The probe's figures go
# into a machine file's `alone_collectives`, as ddlbench.analysis.machine.machine_file writes them, and the
# model's rate at 48 MiB (between the probed 24 and 96 MiB) is set against 48 MiB calls made as zero2's trainer
# makes them (async, waited at once), alternated, medians of 7.
SCRIPT = r"""
import json, os, statistics, time, types
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.train.calibration.kernels import Timer, _alone_collectives
from ddlbench.train.calibration.records import stats_figure
sizes = (4 << 20, 24 << 20, 96 << 20, 384 << 20)
probe = types.SimpleNamespace(warmup=1, iterations=5, alone_collective_bytes=sizes)
entries = _alone_collectives(Timer(torch.device("cpu")), probe)
figures = {}
for entry in entries:
    figures.setdefault(entry["op"], []).append(stats_figure(entry["times_s"], bytes=entry["bytes"]))
machine = MachineModel.from_dict({"name": "probe", "compute": {"alone_collectives": figures}})
size = 48 << 20
whole, other = torch.ones(size // 4), torch.empty(size // 4)
scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
calls = {"reduce_scatter": lambda: scatter(other, whole, async_op=True).wait(),
         "all_gather": lambda: gather(other, whole, async_op=True).wait()}
measured = {op: [] for op in calls}
for op, call in calls.items():
    call()
for _ in range(7):
    for op, call in calls.items():
        began = time.perf_counter(); call(); measured[op].append(time.perf_counter() - began)
print(json.dumps({op: {"predicted": machine.alone_collective_s(op, size), "measured": statistics.median(times),
                       "smallest": figures[op][0]["value"], "largest": figures[op][-1]["value"]}
                  for op, times in measured.items()}))
"""


@pytest.mark.serial
def test_the_probe_predicts_a_call_of_a_size_it_never_timed():
    """A call's seconds at 48 MiB, from the probe's rates at 24 and 96 MiB, within a factor of 2 of 48 MiB calls
    timed apart: the probe times the calls themselves, waited for (its 384 MiB call takes longer than ten of
    its 4 MiB ones: data really moves), and the rate between sizes is what the sizes around say. A probe that
    timed only the call's launch, or a model that read the figure per call instead of per byte, is off by far
    more (a 4 MiB call's seconds stood for a 48 MiB one: ×12)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PORT": str(port), "OMP_NUM_THREADS": "1"},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    for op, figures in result.items():
        assert figures["largest"] > 10 * figures["smallest"] > 0, (op, figures)
        ratio = figures["predicted"] / figures["measured"]
        assert 0.5 < ratio < 2.0, (op, figures)
