"""Nodes of an allocation shared by points that start on their own: Snakemake run inside `salloc`/`sbatch`
with DDLBENCH_PACK=1.

There no dispatcher hands out nodes (ddlbench.launch.allocation does that for `submit --pack`): each
point's runner claims the nodes of its step from a claims file of the allocation, under an exclusive
lock, and gives them back when its step ends. A claim names the runner's pid, so the claim of a runner
that died is dropped by the next one who looks. Every runner of the allocation runs on the host where
Snakemake runs (the batch host, or the host of `salloc`), so a file in its temporary folder is shared.
The file is replaced whole (a temporary file renamed over it) while the lock is held: a runner killed
mid-write leaves the claims as they were, never half of them. Each claim also holds a lane, the lowest
number no other live claim holds, from which its step's rendezvous port is derived.

A point pinned to a node (`each_node`) claims that node. A point that does not fit waits, polling, until
its nodes are free; Snakemake's `--resources alloc_nodes=N` keeps the runners from waiting at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.slurm import run_slurm

log = logging.getLogger(__name__)

PACK_VAR = "DDLBENCH_PACK"  # "1": the points of this allocation share its nodes, a step each
POLL_S = 1.0


def packing_enabled(environ) -> bool:
    return environ.get(PACK_VAR) == "1" and bool(environ.get("SLURM_JOB_ID"))


def allocation_hosts(environ) -> list[str]:
    """The allocation's nodes, in SLURM's order (one scontrol call)."""
    node_list = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not node_list:
        raise DdlbenchError("SLURM_JOB_NODELIST is not set: packed points run inside a SLURM allocation")
    return run_slurm(["scontrol", "show", "hostnames", node_list]).split()


def claims_file(job_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"ddlbench-claims-{job_id}.json"


@contextlib.contextmanager
def claimed_nodes(
    job_id: str, hosts: list[str], *, count: int, pin: str = "", timeout_s: float = float("inf")
) -> Iterator[tuple[list[str], int]]:
    """Hold `count` nodes of `hosts` (or the node `pin`) until the block ends; yields them and the claim's
    lane: the lowest number no other live claim of the allocation holds (its step's rendezvous port,
    ddlbench.launch.rendezvous.step_port, then differs from every other running step's)."""
    if pin and pin not in hosts:
        raise DdlbenchError(f"the point is pinned to node {pin}, which this allocation ({','.join(hosts)}) lacks")
    if count > len(hosts):
        raise DdlbenchError(f"the point needs {count} nodes; this allocation has {len(hosts)}: {','.join(hosts)}")
    path = claims_file(job_id)
    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        taken = _try_claim(path, hosts, count=count, pin=pin)
        if taken is not None:
            break
        if time.monotonic() > deadline:
            raise DdlbenchError(f"no {count} free node(s) of allocation {job_id} within {timeout_s:g} s")
        if not waited:
            log.info("waiting for %d free node(s) of allocation %s", count, job_id)
            waited = True
        time.sleep(POLL_S)
    nodes, lane = taken
    try:
        yield nodes, lane
    finally:
        _release(path)


def _locked(path: Path):
    lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (closed by the caller's context)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def _read(path: Path) -> dict:
    """The claims, as {pid: {"nodes": [...], "lane": n}}; an unreadable file holds none."""
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        state = {}
    claims = state.get("claims", {})
    return {
        "claims": {
            pid: claim if isinstance(claim, dict) else {"nodes": claim, "lane": None} for pid, claim in claims.items()
        }
    }


def _write(path: Path, state: dict) -> None:
    write_text_atomic(path, json.dumps(state))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_claim(path: Path, hosts: list[str], *, count: int, pin: str) -> tuple[list[str], int] | None:
    with _locked(path):
        state = _read(path)
        live = {pid: claim for pid, claim in state["claims"].items() if _alive(int(pid))}
        dropped = len(live) < len(state["claims"])
        state["claims"] = live
        busy = {node for claim in live.values() for node in claim["nodes"]}
        free = [host for host in hosts if host not in busy]
        fits = (pin in free) if pin else len(free) >= count
        if not fits:
            if dropped:
                _write(path, state)
            return None
        taken = [pin] if pin else free[:count]
        lanes = {claim["lane"] for claim in live.values()}
        lane = next(number for number in range(len(live) + 1) if number not in lanes)
        state["claims"][str(os.getpid())] = {"nodes": taken, "lane": lane}
        _write(path, state)
        return taken, lane


def _release(path: Path) -> None:
    with _locked(path):
        state = _read(path)
        if state["claims"].pop(str(os.getpid()), None) is not None:
            _write(path, state)
