"""Fault injection for testing the failure paths for real: DDLBENCH_INJECT_FAULT=<fault>[,<fault>...],
each <fault> being <kind>[~first][@<text>].

<kind> is raise | oom | hang | nan | kill | slow:<seconds> | slower:<fraction> | lost | corrupt. The fault strikes
the last rank of
every point whose id contains <text> (all points without it); the first matching fault wins, except that
`corrupt` is looked up on its own (it acts in the replay, after the training the others act in, so
`slow:0.3@n1x1,corrupt@n1x1` makes one point both). raise, oom, hang, nan and kill strike once, at the
first measured step; slow:<seconds> makes that rank a straggler: it sleeps
that long at the start of every measured step, inside the step, outside every phase (so its record counts
the delay as busy time, and its peers wait for it in their collectives). slower:<fraction> makes every measured
step of that rank (1 + fraction) times as long as its work: at the step's end, inside it and outside every
phase, the rank holds its core busy (`hold`: a spin, not a sleep) for fraction × the time the step took so far
(after a device synchronisation), so the slowdown is that fraction whatever the host's speed at the moment
(slow:<seconds> is a fixed time, a smaller share of a step that a busy host lengthens). `~first` limits a fault
to a job's first run (SLURM_RESTART_COUNT unset or 0), so a requeued job runs clean. Nothing happens when the
variable is unset. `lost` strikes no rank: the job `ddlbench submit` made for the point exits at once with
status 1, before the point runs and without a record (a job lost to the machine), the first time only
(a marker in the point's folder, `lost.struck`, says it struck): what submit's resubmit-once is for.
`corrupt` flips one bit (the highest of the mantissa) of one weight of the last rank's replay model before
its first replay step (ddlbench.train.replay; a point without `replay_steps` has no replay, and the fault
does nothing there): a GPU that corrupts silently, for the tests to show that the replay check names it.
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
KINDS = ("raise", "oom", "hang", "nan", "kill", "slow:<seconds>", "slower:<fraction>", "lost", "corrupt")
CORRUPT = "corrupt"
LOST_MARKER = "lost.struck"


class InjectedFault(RuntimeError):
    """The exception of the `raise` fault."""


def planned_fault(point_id: str, environ: dict[str, str] | None = None) -> str | None:
    """The fault planned for `point_id` (its kind, `slow:<seconds>` with its delay), or None; `corrupt`
    is not one of these (planned_corruption)."""
    return next((kind for kind in _matching(point_id, environ) if kind != CORRUPT), None)


def planned_corruption(point_id: str, environ: dict[str, str] | None = None) -> bool:
    """Whether a `corrupt` fault is planned for `point_id`'s replay."""
    return CORRUPT in _matching(point_id, environ)


def _matching(point_id: str, environ: dict[str, str] | None) -> list[str]:
    """The kinds of every fault of the variable that strikes `point_id` now, in order; a bad entry is refused."""
    environ = environ if environ is not None else os.environ
    value = environ.get(ENV_VAR, "")
    restarted = int(environ.get("SLURM_RESTART_COUNT") or 0) > 0
    kinds = []
    for entry in filter(None, value.split(",")):
        kind, _, target = entry.partition("@")
        kind, _, when = kind.partition("~")
        if not _known(kind) or when not in ("", "first"):
            raise ValueError(f"{ENV_VAR}={value!r}: unknown fault {entry!r}; accepted kinds: {', '.join(KINDS)}")
        if target in point_id and not (when == "first" and restarted):
            kinds.append(kind)
    return kinds


def _known(kind: str) -> bool:
    for prefix in ("slow:", "slower:"):
        if kind.startswith(prefix):
            try:
                amount = float(kind.removeprefix(prefix))
            except ValueError:
                return False
            return math.isfinite(amount) and amount > 0
    return kind in KINDS


def flip_one_bit(model: nn.Module) -> str:
    """The `corrupt` fault: flip the highest mantissa bit of the first element of the model's first floating
    parameter, in place (its value changes by up to half, and stays finite); what was flipped, in words."""
    for name, parameter in model.named_parameters():
        if parameter.dtype.is_floating_point and parameter.numel():
            flat = parameter.detach().view(-1)
            mantissa = round(-math.log2(torch.finfo(parameter.dtype).eps))
            bits = flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[parameter.element_size()])
            before = flat[0].item()
            bits[0] = bits[0] ^ (1 << (mantissa - 1))
            return f"bit {mantissa - 1} of {name}[0]: {before!r} -> {flat[0].item()!r}"
    raise ValueError("the model has no floating parameter to corrupt")


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


def stretch(kind: str | None) -> float:
    """The fraction a `slower:<fraction>` fault lengthens every measured step of its rank by; 0 for other faults."""
    return float(kind.removeprefix("slower:")) if kind and kind.startswith("slower:") else 0.0


def hold(seconds: float) -> None:
    """Keep the calling thread busy for `seconds` (a spin on the monotonic clock): a `slower:` fault's extra time
    spent as slower hardware would spend it. A sleep would give the core away, and a step after it found its
    caches cold and the host's other work run in between: CI's launches with a sleep came out 1.44-1.53× as long
    where 1.3 was injected (docs/testing.md)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def strike(kind: str, model: nn.Module) -> None:
    """The one-off faults, at the first measured step (slow:<seconds> and slower:<fraction> act at every step:
    delay_s, stretch)."""
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
