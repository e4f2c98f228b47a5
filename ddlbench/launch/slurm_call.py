"""One SLURM client call that outlives a controller outage (ddlbench.launch.patience): the little that
the sbatch guard (ddlbench.launch.submit_once) needs, kept light, since the guard starts once per
submission. ddlbench.launch.slurm builds the cluster's facts on it. Torch-free."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable

from ddlbench.errors import DdlbenchError
from ddlbench.launch.patience import OutageOver, Patience, is_transient, keep_trying, why_transient

COMMAND_TIMEOUT_S = 60


class SlurmError(DdlbenchError):
    """A SLURM command failed or is missing; `stderr` is what the command printed, where it ran."""

    def __init__(self, message: str, *, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


def run_slurm(
    command: list[str],
    *,
    timeout_s: float = COMMAND_TIMEOUT_S,
    patience: Patience | None = None,
    before_retry: Callable[[], object] | None = None,
    stdin: str | None = None,
) -> str:
    """Run a SLURM client command and return its stdout. A transient failure (the controller did not
    answer, or the command ran past `timeout_s`) is tried again with growing waits for as long as the
    patience (ddlbench.launch.patience: the site's controller_patience_s); any other failure raises at
    once. A command that changes something passes `before_retry` (ddlbench.launch.patience.keep_trying),
    which finds out whether a try whose answer was lost took effect, so that it is never done twice."""
    shown = shlex.join(command)

    def attempt() -> tuple[bool, str]:
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, check=False, input=stdin
            )
        except FileNotFoundError:
            raise SlurmError(f"{command[0]} not found: is this a SLURM login node, and is SLURM on PATH?") from None
        except subprocess.TimeoutExpired:
            return False, f"no answer within {timeout_s:g} s"
        if result.returncode == 0:
            return True, result.stdout
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        if is_transient(result.stderr):
            return False, why_transient(result.stderr) or f"exit {result.returncode}"
        # every line: sbatch names the reason of a refusal (QOSMaxWallDurationPerJobLimit) before its summary
        detail = " ".join(lines)[-1000:] if lines else f"exit {result.returncode}"
        raise SlurmError(f"`{shown}` failed: {detail}", stderr=result.stderr)

    try:
        return keep_trying(attempt, what=f"`{_short(shown)}`", patience=patience, before_retry=before_retry)
    except OutageOver as exc:
        raise SlurmError(str(exc)) from None


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"
