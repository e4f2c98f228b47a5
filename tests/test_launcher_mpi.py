"""The mpirun launcher: its commands for Open MPI and MPICH/Hydra, where it finds hosts and when it refuses;
and, with a real mpirun, ranks that learn who they are and where to meet from MPI (mpi4py) and train
as a local launch does.

Tests that run mpirun skip when neither mpirun nor mpiexec is on PATH (`apt-get install openmpi-bin`),
unless DDLBENCH_REQUIRE_MPI=1, when they fail instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlbench.cli import LAUNCHERS as CLI_LAUNCHERS
from ddlbench.errors import DdlbenchError
from ddlbench.launch.cores import PIN_BY_LOCAL_RANK_VAR, PIN_VAR, pin_from_environment
from ddlbench.launch.launchers import LAUNCHERS, LocalLauncher, SrunLauncher, select_launcher
from ddlbench.launch.mpi import (
    MpiPlan,
    MpirunLauncher,
    find_mpirun,
    flavour_of,
    kill_session,
    known_hosts,
    mpirun_command,
    read_hostfile,
)
from ddlbench.launch.rendezvous import MPI_VAR, misplacement, rank_env
from tests.conftest import make_point, run_cli

OPEN_MPI_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA_VERSION = "HYDRA build details:\n    Version:                                 4.0.2\n"
INTEL_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
WORKER = ["python", "-m", "ddlbench.launch.worker"]


@pytest.fixture
def mpirun() -> str:
    path = find_mpirun(os.environ)
    if path is None:
        if os.environ.get("DDLBENCH_REQUIRE_MPI") == "1":
            pytest.fail("DDLBENCH_REQUIRE_MPI=1 but neither mpirun nor mpiexec is on PATH; apt-get install openmpi-bin")
        pytest.skip("neither mpirun nor mpiexec is on PATH; apt-get install openmpi-bin")
    return path


@pytest.fixture
def fake_mpirun(tmp_path) -> Path:
    """A bin folder whose mpirun only answers --version as Open MPI does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "mpirun"
    script.write_text(f"#!/bin/sh\nprintf '{OPEN_MPI_VERSION}'\n")
    script.chmod(0o755)
    return bin_dir


# --- commands -----------------------------------------------------------------------------------------


def test_open_mpi_command_places_ranks_per_node_and_names_the_variables_to_pass_on():
    point = make_point(nodes=2, ranks_per_node=4, threads=3)
    worker = [*WORKER, "--spec", point.to_json()]
    command = mpirun_command(
        "openmpi", "/usr/bin/mpirun", point=point, hosts=("n1", "n2"), worker=worker,
        exported=("DDLBENCH_MPI", "OMP_NUM_THREADS"), as_root=True,
    )  # fmt: skip
    assert command == [
        "/usr/bin/mpirun", "-np", "8", "--host", "n1:4,n2:4", "--map-by", "ppr:4:node", "--bind-to", "none",
        "--allow-run-as-root", "-x", "DDLBENCH_MPI", "-x", "OMP_NUM_THREADS", *worker,
    ]  # fmt: skip
    assert command[command.index("--spec") + 1] == point.to_json()  # an argv element: no shell, no quoting


def test_open_mpi_is_told_to_allow_root_only_for_root():
    point = make_point(ranks_per_node=2)
    command = mpirun_command("openmpi", "mpirun", point=point, hosts=("vm",), worker=WORKER)
    assert "--allow-run-as-root" not in command


def test_hydra_command_passes_the_whole_environment():
    point = make_point(nodes=2, ranks_per_node=4)
    command = mpirun_command(
        "hydra", "mpiexec", point=point, hosts=("n1", "n2"), worker=WORKER, exported=("X",), as_root=True
    )
    assert command == ["mpiexec", "-n", "8", "-ppn", "4", "-hosts", "n1,n2", "-genvall", *WORKER]


@pytest.mark.parametrize(
    ("text", "flavour"),
    [(OPEN_MPI_VERSION, "openmpi"), (HYDRA_VERSION, "hydra"), (INTEL_VERSION, "hydra")],
)
def test_the_flavour_comes_from_the_version_text(text, flavour):
    assert flavour_of(text) == flavour


def test_an_unknown_mpirun_is_refused_naming_what_it_said_and_what_is_accepted():
    with pytest.raises(DdlbenchError, match=r"'Spectrum mpirun 10.4'.*accepted: Open MPI, MPICH/Hydra"):
        flavour_of("Spectrum mpirun 10.4\n")


# --- hosts --------------------------------------------------------------------------------------------


def test_hostfiles_of_open_mpi_mpich_and_pbs_give_distinct_hosts_in_order(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nn2 slots=4\nn1:2\nn2\n\nn3  # spare\nn3\n")
    assert read_hostfile(hostfile) == ("n2", "n1", "n3")


@pytest.mark.parametrize(
    ("text", "message"),
    [("n1\n$(reboot)\n", r"line 2: '\$\(reboot\)' is not a host name; accepted: letters"), ("# none\n", "no host")],
)
def test_a_bad_hostfile_is_refused_naming_the_line(tmp_path, text, message):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    with pytest.raises(DdlbenchError, match=message):
        read_hostfile(hostfile)


def test_hosts_come_from_the_hostfile_option_then_ddlbench_hostfile_then_pbs_then_this_host(tmp_path):
    files = {}
    for name in ("option", "env", "pbs"):
        files[name] = tmp_path / name
        files[name].write_text(f"{name}-host\n")
    env = {"DDLBENCH_HOSTFILE": str(files["env"]), "PBS_NODEFILE": str(files["pbs"])}
    assert known_hosts(files["option"], env)[0] == ("option-host",)
    assert known_hosts(None, env)[0] == ("env-host",)
    assert known_hosts(None, {"PBS_NODEFILE": str(files["pbs"])})[0] == ("pbs-host",)
    hosts, source = known_hosts(None, {})
    assert hosts == (socket.gethostname(),) and source.startswith("this host")


def test_a_point_needing_more_nodes_than_hosts_known_is_refused_before_anything_starts(tmp_path, fake_mpirun):
    launcher = MpirunLauncher({"PATH": str(fake_mpirun)})
    with pytest.raises(DdlbenchError, match=r"needs 2 nodes, but mpirun knows 1 host \(.*\) from this host"):
        launcher.check(make_point(nodes=2))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1\nn2\n")
    plan = MpirunLauncher({"PATH": str(fake_mpirun)}, hostfile=hostfile).plan(make_point(nodes=2))
    assert (plan.flavour, plan.hosts, plan.on_this_host) == ("openmpi", ("n1", "n2"), False)


def test_the_refusal_reaches_the_user_as_one_line_and_writes_no_record(tmp_path, fake_mpirun, monkeypatch):
    from ddlbench.launch.runner import run_point

    monkeypatch.setenv("PATH", str(fake_mpirun))
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    monkeypatch.delenv("DDLBENCH_HOSTFILE", raising=False)
    with pytest.raises(DdlbenchError, match="needs 2 nodes"):
        run_point(make_point(nodes=2), out=tmp_path / "record.json", launcher="mpirun")
    assert not (tmp_path / "record.json").exists()


def test_without_mpirun_the_launcher_says_what_to_install(tmp_path):
    with pytest.raises(DdlbenchError, match="needs mpirun or mpiexec on PATH"):
        MpirunLauncher({"PATH": str(tmp_path)}).check(make_point())


# --- selection, environment, pinning ------------------------------------------------------------------


def test_auto_picks_mpirun_in_a_pbs_job_only_and_srun_first(monkeypatch, tmp_path):
    monkeypatch.setattr("shutil.which", lambda name, path=None: f"/usr/bin/{name}")
    pbs = {"PBS_NODEFILE": str(tmp_path / "nodes"), "PBS_JOBID": "7.pbs"}
    assert isinstance(select_launcher("auto", pbs), MpirunLauncher)
    assert isinstance(select_launcher("auto", pbs | {"SLURM_JOB_ID": "7"}), SrunLauncher)
    assert isinstance(select_launcher("auto", {}), LocalLauncher)
    assert isinstance(select_launcher("mpirun", {}), MpirunLauncher)
    monkeypatch.setattr("shutil.which", lambda name, path=None: None)
    assert isinstance(select_launcher("auto", pbs), LocalLauncher)


def test_a_hostfile_is_refused_for_other_launchers():
    with pytest.raises(DdlbenchError, match="for the mpirun launcher only, not for 'local'"):
        select_launcher("local", {}, hostfile=Path("hosts"))


def test_the_cli_accepts_every_launcher_and_names_them_for_a_wrong_one(capsys):
    from ddlbench.cli import build_parser

    assert CLI_LAUNCHERS == LAUNCHERS
    assert build_parser().parse_args(["run-point", "--launcher", "mpirun", "--hostfile", "h"]).hostfile == Path("h")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run-point", "--launcher", "torchrun"])
    err = capsys.readouterr().err  # argparse quotes the choices in some Python releases, not in others
    assert "invalid choice: 'torchrun'" in err and all(name in err.split("choose from")[1] for name in LAUNCHERS)


def test_ranks_get_threads_the_mpi_mark_and_a_cpu_slice_per_local_rank():
    point = make_point(ranks_per_node=2, threads=2)
    launcher = MpirunLauncher({"PATH": "/bin", PIN_VAR: "7", "OMP_NUM_THREADS": "16", "LOCAL_WORLD_SIZE": "8"})
    env = launcher.rank_environment(point, claimed=(4, 5, 6, 7))
    assert env[MPI_VAR] == "1" and env["OMP_NUM_THREADS"] == "2" and env["MKL_NUM_THREADS"] == "2"
    assert env[PIN_BY_LOCAL_RANK_VAR] == "4,5;6,7" and PIN_VAR not in env  # a stale pin would win
    assert PIN_BY_LOCAL_RANK_VAR not in launcher.rank_environment(point, claimed=None)
    # the worker maps local ranks to GPUs by LOCAL_WORLD_SIZE: the point's, never the caller's
    assert env["LOCAL_WORLD_SIZE"] == "2"


def test_open_mpi_passes_on_what_remote_ranks_need_by_name_only(tmp_path):
    point = make_point(nodes=2, ranks_per_node=2, threads=2)
    launcher = MpirunLauncher({"PATH": "/bin", "HOME": "/root", "SECRET_TOKEN": "x"})
    env = launcher.rank_environment(point, claimed=None)
    plan = MpiPlan(executable="mpirun", flavour="openmpi", hosts=("n1", "n2"), on_this_host=False)
    command = launcher.command(point, plan, env, rank_dir=tmp_path, dump_params=None)
    exported = {command[index + 1] for index, word in enumerate(command) if word == "-x"}
    assert {MPI_VAR, "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PATH"} <= exported
    assert not {"HOME", "SECRET_TOKEN"} & exported and "2" not in exported  # names, never values


def test_a_process_marked_for_mpi_but_not_started_by_it_is_refused():
    # mpi4py would quietly make it rank 0 of a world of 1
    with pytest.raises(DdlbenchError, match=r"DDLBENCH_MPI=1 .*\(none of OMPI_COMM_WORLD_RANK, PMI_RANK"):
        rank_env({MPI_VAR: "1", "RANK": "0"})


def test_a_placement_other_than_the_points_ranks_per_node_is_named_host_by_host():
    even = [(0, 2, "n1"), (0, 2, "n1"), (2, 2, "n2"), (2, 2, "n2")]
    assert misplacement(even, "2") is None and misplacement(even, None) is None
    uneven = [(0, 3, "n1"), (0, 3, "n1"), (0, 3, "n1"), (3, 1, "n2")]
    assert misplacement(uneven, "2").startswith("mpirun placed the 4 ranks 3 on n1, 1 on n2, but the point runs 2")


@pytest.mark.parametrize("local_rank_var", ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"])
def test_a_rank_pins_itself_to_the_slice_of_its_local_rank(local_rank_var):
    allowed = sorted(os.sched_getaffinity(0))
    mine = ",".join(map(str, allowed))  # the whole affinity: pinning to it changes nothing in this test
    environ = {PIN_BY_LOCAL_RANK_VAR: f"999;{mine}", local_rank_var: "1"}
    assert pin_from_environment(environ) == f"ddlbench: pinned to {mine}"
    assert pin_from_environment({PIN_BY_LOCAL_RANK_VAR: "999"}) == "none"  # no local rank: unpinned


@pytest.mark.slow
def test_what_is_left_of_mpiruns_session_is_killed():
    # a stand-in for mpirun: a session leader whose child sits in a process group of its own
    leader = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys; p = subprocess.Popen(['sleep', '60'], "
         "process_group=0); print(p.pid, flush=True); os._exit(0)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    child = int(leader.stdout.readline())
    leader.wait()
    kill_session(leader.pid)
    for _ in range(100):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the orphan of the session still runs")


# --- real mpirun ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ranks_learn_who_they_are_and_where_to_meet_from_mpi(mpirun, tmp_path):
    point = make_point(ranks_per_node=2)
    # a file per rank: mpirun forwards the ranks' stdout in chunks that may run two lines together
    probe = (
        "import json, os; from ddlbench.launch.rendezvous import rank_env; "
        f"open(os.path.join({str(tmp_path)!r}, f'{{os.getpid()}}.json'), 'w').write("
        "json.dumps(rank_env(os.environ).__dict__)); os._exit(0)"
    )
    launcher = MpirunLauncher()
    plan = launcher.plan(point)
    command = mpirun_command(
        plan.flavour, plan.executable, point=point, hosts=plan.hosts, worker=[sys.executable, "-c", probe],
        as_root=os.geteuid() == 0,
    )  # fmt: skip
    env = launcher.rank_environment(point, claimed=None)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    # exit 0 after os._exit: MPI was finalised in rank_env, else Open MPI calls the exit improper
    assert result.returncode == 0, result.stderr
    ranks = sorted((json.loads(path.read_text()) for path in tmp_path.glob("*.json")), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in ranks] == [
        (0, 2, 0, 0),
        (1, 2, 1, 0),
    ]
    # one address for all, rank 0's pick broadcast over MPI: loopback on one host, a port it found free
    assert ranks[0]["init_method"] == ranks[1]["init_method"]
    assert ranks[0]["init_method"].startswith("tcp://127.0.0.1:")


@pytest.mark.slow
def test_every_rank_refuses_a_placement_other_than_the_points(mpirun):
    point = make_point(ranks_per_node=2)
    probe = "import os; from ddlbench.launch.rendezvous import rank_env; rank_env(os.environ); os._exit(0)"
    launcher = MpirunLauncher()
    plan = launcher.plan(point)
    command = mpirun_command(
        plan.flavour, plan.executable, point=point, hosts=plan.hosts, worker=[sys.executable, "-c", probe],
        as_root=os.geteuid() == 0,
    )  # fmt: skip
    env = launcher.rank_environment(point, claimed=None) | {"LOCAL_WORLD_SIZE": "1"}  # as if 1 per node
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.count("mpirun placed the 2 ranks 2 on ") >= 1, result.stderr


@pytest.mark.slow
@pytest.mark.equivalence
def test_two_rank_ddp_under_mpirun_matches_single_process(tmp_path, mpirun):
    from tests.equivalence import check_against_reference

    # the launcher gives the ranks no RANK, no rendezvous file and no MASTER_ADDR: they can only have met
    # at the tcp:// address that rank 0 broadcast through MPI
    record = check_against_reference(
        tmp_path, launcher="mpirun", nodes=1, ranks_per_node=2, batch_size=8, model_options=(("norm", "group"),),
        shards=2,  # each rank's half apart in the reference too: batch-size-proof (tests/test_ddp.py)
    )  # fmt: skip
    assert record.provenance.launcher == "mpirun"
    assert sorted(result.rank for result in record.ranks) == [0, 1]
    pinned = [result.cpus for result in record.ranks if result.cpu_binding.startswith("ddlbench: pinned")]
    assert len(pinned) in (0, 2) and not (pinned and set(pinned[0]) & set(pinned[1]))


@pytest.mark.slow
def test_a_rank_failure_under_mpirun_is_a_failure_record(tmp_path, mpirun):
    point = make_point(ranks_per_node=2)
    began = time.monotonic()
    result = run_cli(
        "run-point", "--spec", point.to_json(), "--out", str(tmp_path / "record.json"), "--launcher", "mpirun",
        env={"DDLBENCH_INJECT_FAULT": "raise"}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["status"] == "failed" and record["provenance"]["launcher"] == "mpirun"
    assert record["reason"].startswith("rank 1 on ") and "InjectedFault" in record["reason"]
    assert time.monotonic() - began < 60  # mpirun ended the job; nothing waited for the time limit


@pytest.mark.slow
def test_a_hung_rank_under_mpirun_times_out_and_leaves_no_process(tmp_path, mpirun, monkeypatch):
    from ddlbench.launch.runner import run_point

    monkeypatch.setenv("DDLBENCH_INJECT_FAULT", "hang")
    record = run_point(make_point(ranks_per_node=2, timeout_s=12.0), out=tmp_path / "record.json", launcher="mpirun")
    assert record.status == "timeout"
    left = [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit() and _mentions(entry, tmp_path)]
    assert not left, f"ranks left running: {left}"


def _mentions(process: Path, text: Path) -> bool:
    try:
        return str(text).encode() in (process / "cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return False


@pytest.mark.slow
@pytest.mark.equivalence
def test_horovod_under_mpirun_uses_its_gloo_controller(tmp_path, mpirun):
    if importlib.util.find_spec("horovod") is None:
        if os.environ.get("DDLBENCH_REQUIRE_HOROVOD") == "1":
            pytest.fail("DDLBENCH_REQUIRE_HOROVOD=1 but horovod is not installed; run `make horovod`")
        pytest.skip("horovod is not installed; run `make horovod`")
    from tests.equivalence import check_against_reference

    record = check_against_reference(
        tmp_path, launcher="mpirun", strategy="horovod", nodes=1, ranks_per_node=2, batch_size=8,
        model_options=(("norm", "group"),), shards=2,  # each rank's half apart in the reference too
    )  # fmt: skip
    assert {result.facts["controller"] for result in record.ranks} == {"gloo"}
