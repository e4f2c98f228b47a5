"""Fault injection for testing the failure paths for real: DDLBENCH_INJECT_FAULT=<fault>[,<fault>...],
each <fault> being <kind>[~first][@<text>].

<kind> is raise | oom | hang | nan | kill; the fault strikes the last rank at the first measured step of every
point whose id contains <text> (all points without it); the first matching fault wins. `~first` limits it to
a job's first run (SLURM_RESTART_COUNT unset or 0), so a requeued job runs clean. Nothing happens when the
variable is unset.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

ENV_VAR = "DDLBENCH_INJECT_FAULT"
KINDS = ("raise", "oom", "hang", "nan", "kill")


class InjectedFault(RuntimeError):
    """The exception of the `raise` fault."""


def planned_fault(point_id: str, environ: dict[str, str] | None = None) -> str | None:
    environ = environ if environ is not None else os.environ
    value = environ.get(ENV_VAR, "")
    restarted = int(environ.get("SLURM_RESTART_COUNT") or 0) > 0
    for entry in filter(None, value.split(",")):
        kind, _, target = entry.partition("@")
        kind, _, when = kind.partition("~")
        if kind not in KINDS or when not in ("", "first"):
            raise ValueError(f"{ENV_VAR}={value!r}: unknown fault {entry!r}; accepted kinds: {', '.join(KINDS)}")
        if target in point_id and not (when == "first" and restarted):
            return kind
    return None


def strike(kind: str, model: nn.Module) -> None:
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
