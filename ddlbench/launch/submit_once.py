"""sbatch that outlives a controller outage and never submits twice: the guard in front of every
submission (ddlbench's own, submitit's, and the Snakemake SLURM plugin's).

Each submission gets a key of its own, added to the job's comment (`ddlbench-submission=<key>`). When
sbatch fails because the controller did not answer, the submission is not simply repeated: the answer
may have been lost after the controller took the job. The user's queue is read first (one squeue call)
and a job carrying the key is taken as the submission's; only when the queue says it is not there is
sbatch run again, with growing waits, for as long as the site's patience (ddlbench.launch.patience).
While squeue does not answer either, nothing is submitted.

Snakemake's plugin and submitit run `sbatch` by name, so `guard_sbatch()` puts a directory first on PATH
whose `sbatch` runs this module (`python -m ddlbench.launch.submit_once ARGS`), which runs the real one.
A job that ended and left the queue (after MinJobAge, 300 s by default) before the controller answered
again cannot be found by its key, and its submission would be repeated; an outage shorter than
MinJobAge, or jobs longer than the outage, are safe. Torch-free.
"""

from __future__ import annotations

import getpass
import logging
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.launch.patience import UNKNOWN, Patience
from ddlbench.launch.slurm_call import SlurmError, run_slurm

log = logging.getLogger(__name__)

KEY_PREFIX = "ddlbench-submission="
REAL_SBATCH_VAR = "DDLBENCH_REAL_SBATCH"  # the sbatch the guard runs (found once, before PATH changed)
# where the guard also writes what it waited for: Snakemake's plugin shows nothing of a successful sbatch's
# stderr, so an outage it outlived would otherwise leave no trace
GUARD_LOG_VAR = "DDLBENCH_SBATCH_GUARD_LOG"
GUARD_DIR_NAME = "ddlbench-sbatch-guard"


def with_key(args: list[str], key: str) -> list[str]:
    """sbatch's arguments with `key` added to the job's comment (kept after any comment already given)."""
    out: list[str] = []
    comment = None
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--comment" and index + 1 < len(args):
            comment, skip = args[index + 1], True
        elif arg.startswith("--comment="):
            comment = arg.split("=", 1)[1]
        else:
            out.append(arg)
    tagged = f"{comment} {KEY_PREFIX}{key}" if comment else f"{KEY_PREFIX}{key}"
    return ["--comment", tagged, *out]


def _job_id_of(line: str) -> str:
    """The array job id or job id of an `squeue -o %A` field (the id sbatch printed)."""
    return line.strip().split("_")[0]


def find_submitted(key: str, *, user: str | None = None) -> object:
    """The id of the user's job whose comment carries `key`; None where the queue has none; UNKNOWN
    where squeue did not answer (then it cannot be known whether the job was taken)."""
    user = user or getpass.getuser()
    try:
        text = run_slurm(["squeue", "-h", "-u", user, "-o", "%A|%k"], patience=Patience(patience_s=0))
    except SlurmError as exc:
        log.info("cannot read the queue yet (%s)", exc)
        return UNKNOWN
    for line in text.splitlines():
        job_id, _, comment = line.partition("|")
        if f"{KEY_PREFIX}{key}" in comment.split():
            return _job_id_of(job_id)
    return None


def submit_once(
    args: list[str],
    *,
    stdin: str | None = None,
    sbatch: str = "sbatch",
    patience: Patience | None = None,
    key: str | None = None,
) -> str:
    """Run `sbatch ARGS` (the script from `stdin` where given) once, however often the controller fails
    to answer; sbatch's stdout, or, where a lost answer's job was found in the queue, the line sbatch
    would have printed for it."""
    key = key or uuid.uuid4().hex
    command = [sbatch, *with_key(args, key)]
    parsable = "--parsable" in args

    def already() -> object:
        found = find_submitted(key)
        if found is None or found is UNKNOWN:
            return found
        return f"{found}\n" if parsable else f"Submitted batch job {found}\n"

    return run_slurm(command, patience=patience, before_retry=already, stdin=stdin)


def real_sbatch() -> str:
    """The sbatch the guard stands in front of: the one named by REAL_SBATCH_VAR, else the first on PATH
    that is not the guard."""
    named = os.environ.get(REAL_SBATCH_VAR)
    if named:
        return named
    parts = [part for part in os.environ.get("PATH", "").split(os.pathsep) if GUARD_DIR_NAME not in part]
    found = shutil.which("sbatch", path=os.pathsep.join(parts))
    if not found:
        raise SlurmError("sbatch not found: is this a SLURM login node, and is SLURM on PATH?")
    return found


def guard_sbatch(log_file: Path | None = None) -> Path | None:
    """Put the guard's `sbatch` first on this process's PATH (so that Snakemake's plugin and submitit,
    and every process started from here, submit through it); its directory, or None without sbatch.
    `log_file`: where the guard also says what it waited for."""
    if log_file is not None:
        os.environ[GUARD_LOG_VAR] = str(log_file)
    path = os.environ.get("PATH", "")
    folder = Path(tempfile.gettempdir()) / f"{GUARD_DIR_NAME}-{os.getuid()}"
    if str(folder) in path.split(os.pathsep):
        return folder
    try:
        os.environ[REAL_SBATCH_VAR] = real_sbatch()
    except SlurmError:
        return None
    folder.mkdir(mode=0o700, exist_ok=True)
    script = folder / "sbatch"
    text = (
        "#!/bin/sh\n"
        "# written by ddlbench (ddlbench.launch.submit_once): sbatch, tried again while the controller does\n"
        "# not answer, and never twice\n"
        f'exec {shlex.quote(sys.executable)} -m ddlbench.launch.submit_once "$@"\n'
    )
    if not script.exists() or script.read_text() != text:
        write_text_atomic(script, text)
        script.chmod(0o755)
    os.environ["PATH"] = f"{folder}{os.pathsep}{path}"
    return folder


def main(argv: list[str]) -> int:
    """`python -m ddlbench.launch.submit_once ARGS`: sbatch ARGS, guarded; exits as sbatch would."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if os.environ.get(GUARD_LOG_VAR):
        try:
            Path(os.environ[GUARD_LOG_VAR]).parent.mkdir(parents=True, exist_ok=True)
            handlers.append(logging.FileHandler(os.environ[GUARD_LOG_VAR]))
        except OSError:
            pass  # the log is a courtesy; the submission is not
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s ddlbench sbatch guard: %(message)s", handlers=handlers
    )
    stdin = sys.stdin.read() if "/dev/stdin" in argv or "-" in argv else None
    try:
        sys.stdout.write(submit_once(argv, stdin=stdin, sbatch=real_sbatch()))
    except SlurmError as exc:  # sbatch's own words, as the caller would have read them
        sys.stderr.write(exc.stderr or f"sbatch: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
