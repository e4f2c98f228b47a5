"""Waiting out a controller that does not answer: which SLURM failures are transient, how long to wait
between tries, how long to keep trying, and who is told meanwhile.

A busy production controller answers "Socket timed out on send/recv operation" or "Unable to contact
slurm controller" now and then, and is restarted for upgrades and configuration changes (minutes).
Hours of waves must outlive that: every scheduler call ddlbench makes is tried again on such an answer
(ddlbench.launch.slurm_call.run_slurm; the sbatch guard, ddlbench.launch.submit_once, for the
submissions Snakemake's plugin and submitit make), with capped exponential backoff and "equal" jitter
(AWS Architecture Blog, "Exponential Backoff And Jitter", 2015: clients retrying in step hammer a
controller as it comes back; half of each wait is kept, so no retry comes at once), for as long as the
site's `controller_patience_s` (default 30 min: a controller restart with its state reloaded). A failure
that is not transient (a refusal, a bad option) is raised at
once. Torch-free.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

# the environment variable that carries the site's patience to every process ddlbench starts (the sbatch
# guard that Snakemake's plugin calls, the runners inside jobs)
PATIENCE_VAR = "DDLBENCH_CONTROLLER_PATIENCE_S"
DEFAULT_PATIENCE_S = 1800.0

# what SLURM's clients print when the controller (or slurmdbd, for sacct and sacctmgr) did not answer,
# as opposed to answering no. From slurm_errno.c and the clients' messages (22.05 to 24.11).
_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were transmitted"
    r"|Communication connection failure|Connection refused|Connection reset by peer|connect failure"
    r"|Transport endpoint is not connected|Slurm backup controller in standby mode"
    r"|Slurmctld (?:is )?not responding|Unable to establish control machine"
    r"|Problem talking to the database|persistent connection|Unable to connect to database"
    r"|slurmdbd(?: is)? not (?:running|responding)|Network is unreachable|No route to host",
    re.IGNORECASE,
)


def is_transient(message: str) -> bool:
    """Whether a SLURM client's failure says the controller (or slurmdbd) did not answer, which passes."""
    return bool(_TRANSIENT.search(message))


def why_transient(message: str) -> str:
    """The words of a transient failure from where they say what happened ("Unable to contact slurm
    controller (connect failure)"), without the client's own prefix ("Batch job submission failed:"): a
    caller that reads a command's stderr for "submission failed" (Snakemake's SLURM plugin does, even
    when sbatch exits 0) must not take a retry that went through for a refusal."""
    for line in reversed(message.splitlines()):
        found = _TRANSIENT.search(line)
        if found:
            return line[found.start() :].strip()
    return message.strip().splitlines()[-1] if message.strip() else ""


@dataclass(frozen=True, kw_only=True)
class Patience:
    """How long a scheduler call keeps trying, and the waits between tries: after failed try k (k = 1, 2, ...)
    a uniform random time in [c/2, c] with c = min(max_wait_s, first_wait_s × 2^(k−1)) (equal jitter)."""

    patience_s: float = DEFAULT_PATIENCE_S
    first_wait_s: float = 2.0
    max_wait_s: float = 60.0
    source: str = "the site's controller_patience_s"  # where patience_s comes from, as a message names it

    def waits(self, rng: random.Random | None = None) -> Iterator[float]:
        rng = rng or random.Random()
        ceiling = self.first_wait_s
        while True:
            yield rng.uniform(0.5 * ceiling, ceiling)  # half of it at least: a retry is never immediate
            ceiling = min(self.max_wait_s, ceiling * 2)


def current_patience() -> Patience:
    """The patience this process was given (PATIENCE_VAR, set from the site file), else the default."""
    text = os.environ.get(PATIENCE_VAR, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_PATIENCE_S
    except ValueError:
        log.warning(
            "%s=%r is not a number of seconds; waiting the default %g s", PATIENCE_VAR, text, DEFAULT_PATIENCE_S
        )
        seconds = DEFAULT_PATIENCE_S
    return Patience(patience_s=max(seconds, 0.0))


def set_patience(seconds: float) -> None:
    """Give this process and every process it starts `seconds` of patience with the controller."""
    os.environ[PATIENCE_VAR] = f"{float(seconds):g}"


# who hears that the controller is not answering (the progress line), and that it answers again
_listeners: list[Callable[[str | None], None]] = []


def listen(callback: Callable[[str | None], None]) -> Callable[[], None]:
    """Call `callback` with a line while the controller does not answer, and with None once it does;
    returns the function that stops listening."""
    _listeners.append(callback)
    return lambda: _listeners.remove(callback) if callback in _listeners else None


def _tell(line: str | None) -> None:
    for callback in list(_listeners):
        try:
            callback(line)
        except Exception:  # a listener's failure must not end a scheduler call
            log.exception("outage listener failed")


class OutageOver(Exception):
    """The controller did not answer within the patience."""


# what `before_retry` answers when it could not look (the controller still does not answer)
UNKNOWN = object()


def keep_trying(
    attempt: Callable[[], tuple[bool, object]],
    *,
    what: str,
    patience: Patience | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    before_retry: Callable[[], object] | None = None,
    rng: random.Random | None = None,
) -> object:
    """Call `attempt` until it succeeds: it returns (True, value) for a value, or (False, message) for a
    transient failure (anything else it raises goes straight up). Between tries the wait grows
    (Patience.waits). `before_retry`, where given, is asked after each failed try whether the try took
    effect after all (a submission whose answer was lost): its answer, unless None, is the value; while
    it answers UNKNOWN (it could not look) nothing is tried again, so a submission is never repeated
    on a guess. Past the patience, OutageOver names `what`, how long it was tried and the last message."""
    patience = patience or current_patience()
    began = clock()
    waits = patience.waits(rng)
    tries = 0
    told = False
    unsettled = False  # a try failed and `before_retry` has not yet said whether it took effect
    message: object = ""
    while True:
        if unsettled and before_retry is not None:
            found = before_retry()
            if found is UNKNOWN:
                pass  # the queue did not answer either: wait, and ask again before anything is repeated
            elif found is not None:
                log.warning("%s had gone through although its answer was lost: not repeated", what)
                if told:
                    _tell(None)
                return found
            else:
                unsettled = False
        if not unsettled:
            tries += 1
            done, message = attempt()
            if done:
                if told:
                    log.warning("the SLURM controller answers again (%s, after %.0f s)", what, clock() - began)
                    _tell(None)
                return message
            unsettled = before_retry is not None
        elapsed = clock() - began
        wait = next(waits)
        if elapsed + wait > patience.patience_s:
            if told:
                _tell(None)
            raise OutageOver(
                f"{what}: the SLURM controller did not answer for {elapsed:.0f} s ({tries} tries; patience "
                f"{patience.patience_s:g} s, {patience.source}): {message}"
            )
        line = f"the SLURM controller is not answering ({what}: {message}); trying again, {elapsed:.0f} s so far"
        log.warning("%s; next try in %.0f s", line, wait)
        _tell(line)
        told = True
        sleep(wait)
