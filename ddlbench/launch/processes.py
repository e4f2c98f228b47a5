"""Supervision of launched processes: wait for all, stop the rest when one fails, enforce the time limit."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

# After one rank fails the others usually block in a collective; give them this long to fail on their
# own (their own failure text is useful), then stop them.
FAILURE_GRACE_S = 5.0
TERMINATE_GRACE_S = 3.0
POLL_S = 0.05


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    returncodes: tuple[int, ...]
    ranks_of_process: tuple[tuple[int, ...], ...]  # the ranks each process ran (one each locally; all under srun)
    timed_out: bool
    stopped: tuple[bool, ...]  # whether ddlbench stopped the process (its return code is then ours)
    wall_s: float
    # lines the launcher itself printed that explain a failure (srun: "Exceeded job memory limit")
    launcher_messages: tuple[str, ...] = field(default_factory=tuple)
    step_id: str | None = None  # the SLURM job step that ran the ranks, where srun said ("<job>.<step>")
    # processes the kernel's out-of-memory killer ended on this host while the ranks ran here (host_oom_kills'
    # difference over the launch); None where the ranks ran elsewhere or the kernel does not count them
    host_oom_kills: int | None = None


def host_oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's out-of-memory killer has ended on this host since it booted (the
    `oom_kill` line of /proc/vmstat, Linux 4.13 and later); None where the kernel does not say. A rank it
    ends gets SIGKILL and writes nothing, as one that kills itself does; this count tells the two apart."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def start_process(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    # a session of its own per process, so that stopping it reaches its children too
    return subprocess.Popen(command, env=env, start_new_session=True)


class StderrTee(threading.Thread):
    """Copies a launcher's stderr to ours line by line, keeping the lines that match `pattern`."""

    def __init__(self, stream: IO[str], pattern: re.Pattern[str], *, step: re.Pattern[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.pattern = pattern
        self.step = step  # its first group names the job step (srun -v: "launching StepId=12.3 on host n1")
        self.matches: list[str] = []
        self.step_id: str | None = None
        self.tail: list[str] = []  # the last lines, for a failure's cause (a step the controller never made)

    def run(self) -> None:
        for line in self.stream:
            sys.stderr.write(line)
            self.tail = [*self.tail[-19:], line.strip()]
            if self.pattern.search(line):
                self.matches.append(line.strip())
            if self.step is not None and self.step_id is None:
                found = self.step.search(line)
                self.step_id = found.group(1) if found else None
        sys.stderr.flush()


def supervise(
    processes: list[subprocess.Popen], *, ranks_of_process: list[tuple[int, ...]], timeout_s: float
) -> LaunchOutcome:
    began = time.monotonic()
    deadline = began + timeout_s
    first_failure: float | None = None
    stopped = [False] * len(processes)
    timed_out = False
    try:
        while True:
            codes = [process.poll() for process in processes]
            if all(code is not None for code in codes):
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
            elif any(code not in (None, 0) for code in codes):
                first_failure = first_failure or now
            if timed_out or (first_failure is not None and now - first_failure > FAILURE_GRACE_S):
                for index, process in enumerate(processes):
                    if process.poll() is None:
                        stopped[index] = True
                stop_processes(processes)
                break
            time.sleep(POLL_S)
    except BaseException:
        stop_processes(processes)
        raise
    return LaunchOutcome(
        returncodes=tuple(process.wait() for process in processes),
        ranks_of_process=tuple(ranks_of_process),
        timed_out=timed_out,
        stopped=tuple(stopped),
        wall_s=time.monotonic() - began,
    )


def stop_processes(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process group still running, then SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 0.0)):
        running = [process for process in processes if process.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):  # it ended between poll and kill
                os.killpg(process.pid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(process.poll() is None for process in running):
            time.sleep(POLL_S)
    for process in processes:
        process.wait()


def describe_returncode(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
