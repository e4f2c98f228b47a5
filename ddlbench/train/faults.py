"""Fault injection for testing the failure paths for real: DDLBENCH_INJECT_FAULT=<kind>[@<text>].

<kind> is raise | oom | hang | nan | kill; the fault strikes the last rank at the first measured step of every
point whose id contains <text> (all points without it). Nothing happens when the variable is unset.
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
    value = (environ if environ is not None else os.environ).get(ENV_VAR, "")
    if not value:
        return None
    kind, _, target = value.partition("@")
    if kind not in KINDS:
        raise ValueError(f"{ENV_VAR}={value!r}: unknown fault {kind!r}; accepted: {', '.join(KINDS)}")
    return kind if target in point_id else None


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
