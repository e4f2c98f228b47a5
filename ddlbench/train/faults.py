"""Fault injection for testing the failure paths for real: DDLBENCH_INJECT_FAULT=<fault>[,<fault>...],
each <fault> being <kind>[~first][@<text>].

<kind> is raise | oom | hang | nan | kill | slow:<seconds> | lost. The fault strikes the last rank of every point
whose id contains <text> (all points without it); the first matching fault wins. raise, oom, hang, nan
and kill strike once, at the first measured step; slow:<seconds> makes that rank a straggler: it sleeps
that long at the start of every measured step, inside the step, outside every phase (so its record counts
the delay as busy time, and its peers wait for it in their collectives). `~first` limits a fault to a
job's first run (SLURM_RESTART_COUNT unset or 0), so a requeued job runs clean. Nothing happens when the
variable is unset. `lost` strikes no rank: the job `ddlbench submit` made for the point exits at once with
status 1, before the point runs and without a record (a job lost to the machine), the first time only
(a marker in the point's folder, `lost.struck`, says it struck): what submit's resubmit-once is for.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

ENV_VAR = "DDLBENCH_INJECT_FAULT"
KINDS = ("raise", "oom", "hang", "nan", "kill", "slow:<seconds>", "lost")
LOST_MARKER = "lost.struck"


class InjectedFault(RuntimeError):
    """The exception of the `raise` fault."""


def planned_fault(point_id: str, environ: dict[str, str] | None = None) -> str | None:
    """The fault planned for `point_id` (its kind, `slow:<seconds>` with its delay), or None."""
    environ = environ if environ is not None else os.environ
    value = environ.get(ENV_VAR, "")
    restarted = int(environ.get("SLURM_RESTART_COUNT") or 0) > 0
    for entry in filter(None, value.split(",")):
        kind, _, target = entry.partition("@")
        kind, _, when = kind.partition("~")
        if not _known(kind) or when not in ("", "first"):
            raise ValueError(f"{ENV_VAR}={value!r}: unknown fault {entry!r}; accepted kinds: {', '.join(KINDS)}")
        if target in point_id and not (when == "first" and restarted):
            return kind
    return None


def _known(kind: str) -> bool:
    if kind.startswith("slow:"):
        try:
            seconds = float(kind.removeprefix("slow:"))
        except ValueError:
            return False
        return math.isfinite(seconds) and seconds > 0
    return kind in KINDS


def lose_job_once(point_id: str, folder: Path) -> None:
    """The `lost` fault (see the module docstring): exit the job at once, unless `folder` (the point's) holds
    the marker of a strike already."""
    if planned_fault(point_id) != "lost":
        return
    marker = folder / LOST_MARKER
    if marker.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    marker.touch()
    sys.stderr.write(f"{ENV_VAR}: the job of {point_id} lost before the point ran\n")
    sys.stderr.flush()
    os._exit(1)


def delay_s(kind: str | None) -> float:
    """The delay a `slow:<seconds>` fault adds to every measured step of its rank; 0 for other faults."""
    return float(kind.removeprefix("slow:")) if kind and kind.startswith("slow:") else 0.0


def strike(kind: str, model: nn.Module) -> None:
    """The one-off faults, at the first measured step (slow:<seconds> acts at every step: delay_s)."""
    if kind == "raise":
        raise InjectedFault(f"fault injected by {ENV_VAR}")
    if kind == "oom":
        torch.empty(1 << 62, dtype=torch.uint8)  # a real allocation failure: 4 EiB
    elif kind == "hang":
        time.sleep(10**9)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word, as under the kernel's OOM killer
    elif kind == "nan":
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
