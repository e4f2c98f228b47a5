"""Scheduler calls that outlive a controller outage: retried on transient failures only, within the
patience, and a submission never made twice (fake SLURM clients at the subprocess boundary; the real
controller's outage is in tests/test_slurm_outage.py)."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from ddlbench.launch import patience as patience_module
from ddlbench.launch.patience import UNKNOWN, OutageOver, Patience, is_transient, keep_trying, listen
from ddlbench.launch.slurm import SlurmError, run_slurm
from ddlbench.launch.submit_once import KEY_PREFIX, guard_sbatch, submit_once, with_key

QUICK = Patience(patience_s=30.0, first_wait_s=0.01, max_wait_s=0.02)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)", True),
        ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", True),
        ("sacctmgr: error: Problem talking to the database: Connection refused", True),
        ("sbatch: error: Batch job submission failed: Invalid partition name specified", False),
        ("sbatch: error: QOSMaxWallDurationPerJobLimit", False),
    ],
)
def test_transient_failures_are_told_from_refusals(message, transient):
    assert is_transient(message) is transient


def test_waits_grow_with_jitter_up_to_the_cap():
    waits = Patience(patience_s=1e9, first_wait_s=2, max_wait_s=60).waits(random.Random(1))
    drawn = [next(waits) for _ in range(12)]
    ceilings = [min(60, 2 * 2**k) for k in range(12)]
    assert all(0.5 * c <= w <= c for w, c in zip(drawn, ceilings, strict=True))
    assert len(set(drawn)) == len(drawn)  # jittered: clients retrying together do not retry in step


def test_keep_trying_until_the_controller_answers_and_tells_listeners():
    clock = FakeClock()
    answers = iter([(False, "connect failure")] * 3 + [(True, "ok")])
    heard: list[str | None] = []
    stop = listen(heard.append)
    try:
        value = keep_trying(lambda: next(answers), what="squeue", patience=QUICK, sleep=clock.sleep, clock=clock)
    finally:
        stop()
    assert value == "ok"
    assert len(clock.slept) == 3
    assert all(line and "not answering" in line for line in heard[:3])
    assert heard[-1] is None  # told again once it answers


def test_keep_trying_gives_up_after_the_patience_naming_it():
    clock = FakeClock()
    calls = []

    def attempt():
        calls.append(clock.now)
        return False, "Unable to contact slurm controller"

    with pytest.raises(OutageOver, match=r"did not answer for .* patience 5 s"):
        keep_trying(attempt, what="squeue", patience=Patience(patience_s=5, first_wait_s=1, max_wait_s=2),
                    sleep=clock.sleep, clock=clock)  # fmt: skip
    assert clock.now <= 5 and len(calls) >= 3


def test_a_lost_answer_is_found_and_not_repeated():
    clock = FakeClock()
    tries = []
    looks = iter([UNKNOWN, UNKNOWN, "123"])  # the queue does not answer twice, then shows the job

    def attempt():
        tries.append(1)
        return False, "Socket timed out on send/recv operation"

    value = keep_trying(attempt, what="sbatch", patience=QUICK, sleep=clock.sleep, clock=clock,
                        before_retry=lambda: next(looks))  # fmt: skip
    assert value == "123"
    assert len(tries) == 1  # never submitted again while it could not be known whether it went in


def test_with_key_keeps_the_plugins_comment():
    args = with_key(["--parsable", "--comment", "rule_run_point_wildcards_p1", "/dev/stdin"], "k1")
    assert args[:2] == ["--comment", f"rule_run_point_wildcards_p1 {KEY_PREFIX}k1"]
    assert args[2:] == ["--parsable", "/dev/stdin"]
    assert with_key(["--comment=x", "s.sh"], "k") == ["--comment", f"x {KEY_PREFIX}k", "s.sh"]


def _fake_clients(folder: Path, *, sbatch: str, squeue: str) -> dict[str, str]:
    """Fake sbatch and squeue scripts in `folder`; they share a queue file and a call log."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in (("sbatch", sbatch), ("squeue", squeue)):
        path = folder / name
        path.write_text(f"#!/bin/bash\nstate={folder}\necho {name} >> $state/calls\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


# sbatch's comment, from its arguments (as with_key passes it: `--comment TEXT` first)
TAKE = 'echo "$(( $(wc -l < $state/queue 2>/dev/null || echo 0) + 41 ))|$2" >> $state/queue'


def test_run_slurm_retries_a_transient_failure_and_raises_a_refusal_at_once(tmp_path, monkeypatch):
    env = _fake_clients(
        tmp_path,
        sbatch="echo 'sbatch: error: Invalid partition name specified' >&2; exit 1",
        squeue='n=$(grep -c squeue $state/calls); if [ "$n" -lt 3 ]; then '
        "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1; fi; echo '7|x'",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    assert run_slurm(["squeue", "-h"], patience=QUICK) == "7|x\n"
    assert (tmp_path / "calls").read_text().split() == ["squeue"] * 3
    with pytest.raises(SlurmError, match="Invalid partition name"):
        run_slurm(["sbatch", "x.sh"], patience=QUICK)
    assert (tmp_path / "calls").read_text().split().count("sbatch") == 1


def test_submit_once_finds_a_submission_whose_answer_was_lost(tmp_path, monkeypatch):
    # the controller takes the job, then the answer times out; the queue shows it on the next look
    env = _fake_clients(
        tmp_path,
        sbatch=f"{TAKE}; echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2"
        "; exit 1",
        squeue="cat $state/queue 2>/dev/null; true",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    out = submit_once(["--parsable", "job.sh"], sbatch="sbatch", patience=QUICK)
    assert out == "41\n"
    calls = (tmp_path / "calls").read_text().split()
    assert calls.count("sbatch") == 1  # not submitted again
    assert len((tmp_path / "queue").read_text().splitlines()) == 1


def test_submit_once_submits_again_only_once_the_queue_says_it_is_not_there(tmp_path, monkeypatch):
    # sbatch fails twice without taking the job; squeue does not answer at first; the third sbatch goes in
    env = _fake_clients(
        tmp_path,
        sbatch='n=$(grep -c sbatch $state/calls); if [ "$n" -lt 3 ]; then '
        "echo 'sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)' >&2; "
        f"exit 1; fi; {TAKE}; echo 'Submitted batch job 41'",
        squeue='n=$(grep -c squeue $state/calls); if [ "$n" -lt 2 ]; then '
        "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1; fi; "
        "cat $state/queue 2>/dev/null; true",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    assert submit_once(["job.sh"], sbatch="sbatch", patience=QUICK) == "Submitted batch job 41\n"
    calls = (tmp_path / "calls").read_text().split()
    assert calls.count("sbatch") == 3
    # before each repeat the queue was read and answered: never a repeat on a guess
    assert calls.index("sbatch", 1) > calls.index("squeue", calls.index("squeue") + 1)
    assert len((tmp_path / "queue").read_text().splitlines()) == 1


def test_the_guard_stands_first_on_path_and_runs_the_real_sbatch(tmp_path, monkeypatch):
    env = _fake_clients(tmp_path / "bin", sbatch=f"{TAKE}; echo 'Submitted batch job 41'", squeue="true")
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("DDLBENCH_REAL_SBATCH", "")  # found anew (and put back as it was after the test)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    folder = guard_sbatch()
    assert folder is not None and os.environ["PATH"].split(os.pathsep)[0] == str(folder)
    import subprocess

    result = subprocess.run(["sbatch", "job.sh"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Submitted batch job 41\n"
    assert KEY_PREFIX in (tmp_path / "bin" / "queue").read_text()  # the real one ran, with the key
    assert guard_sbatch() == folder  # once on PATH, not again
    assert os.environ["PATH"].count(str(folder)) == 1


def test_patience_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(patience_module.PATIENCE_VAR, "90")
    assert patience_module.current_patience().patience_s == 90
    monkeypatch.setenv(patience_module.PATIENCE_VAR, "soon")
    assert patience_module.current_patience().patience_s == patience_module.DEFAULT_PATIENCE_S


def test_the_guards_words_after_a_retry_are_not_read_as_a_refusal(tmp_path, monkeypatch):
    """Snakemake's SLURM plugin fails a job whose sbatch printed "submission failed" on stderr, even when
    sbatch exited 0: the guard's account of a retry that went through must not say it."""
    import subprocess

    env = _fake_clients(
        tmp_path / "bin",
        sbatch='n=$(grep -c sbatch $state/calls); if [ "$n" -lt 2 ]; then '
        "echo 'sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)' >&2; "
        f"exit 1; fi; {TAKE}; echo 'Submitted batch job 41'",
        squeue="cat $state/queue 2>/dev/null; true",
    )
    log_file = tmp_path / "logs" / "sbatch-guard.log"
    environ = {**os.environ, "PATH": env["PATH"], "DDLBENCH_REAL_SBATCH": str(tmp_path / "bin" / "sbatch"),
               "DDLBENCH_SBATCH_GUARD_LOG": str(log_file), patience_module.PATIENCE_VAR: "30"}  # fmt: skip
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "ddlbench.launch.submit_once", "job.sh"], capture_output=True, text=True, env=environ
    )
    assert result.returncode == 0 and result.stdout == "Submitted batch job 41\n", result.stderr
    assert "not answering" in result.stderr and "submission failed" not in result.stderr.lower()
    assert "Unable to contact slurm controller" in log_file.read_text()  # and the sweep's log keeps it


def test_the_progress_line_says_when_the_controller_is_not_answering():
    import io

    from ddlbench.launch.patience import _tell
    from ddlbench.launch.progress import Progress

    stream = io.StringIO()
    progress = Progress(title="sweep 's'", stream=stream, isatty=False)
    progress.update({"a": "running", "b": "pending"})
    _tell("the SLURM controller is not answering (`squeue`: connect failure); trying again, 9 s so far")
    said = stream.getvalue().splitlines()
    assert said[-1].startswith("sweep 's': 2 points: 1 running, 1 pending") and "not answering since" in said[-1]
    progress.update({"a": "ok", "b": "running"})  # while it lasts, every line says so
    assert "not answering since" in stream.getvalue().splitlines()[-1]
    _tell(None)
    assert "not answering" not in stream.getvalue().splitlines()[-1]
    progress.close()
    _tell("the SLURM controller is not answering")  # a closed line no longer listens
    assert "not answering" not in stream.getvalue().splitlines()[-1]


def test_status_reads_a_snakemake_jobs_point_from_a_guarded_comment():
    """The guard's key follows the plugin's comment; status still finds the point the job runs."""
    from ddlbench.launch.slurm import QueuedJob
    from ddlbench.launch.status import points_of_job

    comment = with_key(["--comment", "rule_run_point_wildcards_resnet8-x-r0-1234abcd", "job.sh"], "k9")[1]
    job = QueuedJob(job_id="139", state="RUNNING", name="uuid", comment=comment)
    assert points_of_job(job, {}) == ["resnet8-x-r0-1234abcd"]


def test_status_is_a_look_it_reports_from_the_records_when_the_controller_does_not_answer(
    write_sweep, tmp_path, monkeypatch, capsys
):
    """`ddlbench status` tries squeue for STATUS_PATIENCE_S, not the site's patience (30 min by default: a
    look at a sweep during an outage waited that long), then says the queue was not read and reports."""
    from ddlbench.cli import main
    from ddlbench.cli import sweep as sweep_cli

    env = _fake_clients(
        tmp_path / "bin",
        sbatch="exit 1",
        squeue="echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv(patience_module.PATIENCE_VAR, "90")
    monkeypatch.setattr(sweep_cli, "STATUS_PATIENCE_S", 1.0)
    sweep = write_sweep(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1], batch_size=[4, 8])
    assert main(["status", "--configfile", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "queue not read" in out and "did not answer" in out and "a status's look" in out, out
    assert "sweep 'tiny': 2 points: 2 not started" in out, out
    # one try: its first wait (1-2 s) is past its patience of 1 s; the site's 90 s would have tried 5-7 times
    assert (tmp_path / "bin" / "calls").read_text().split() == ["squeue"]
