"""Who starts the ranks and how they meet. The srun path is exercised for real on the SLURM cluster
(next issue); here its command and its reading of SLURM's variables are checked."""

from __future__ import annotations

import pytest

from ddlbench.errors import DdlbenchError
from ddlbench.launch.launchers import LocalLauncher, SrunLauncher, select_launcher
from ddlbench.launch.rendezvous import rank_env, slurm_master_port
from tests.conftest import make_point


def test_rank_env_from_local_launch():
    env = rank_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "NODE_RANK": "1",
            "DDLBENCH_INIT_METHOD": "file:///x",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.init_method) == (
        3,
        4,
        1,
        1,
        "file:///x",
    )


def test_rank_env_from_srun():
    env = rank_env({
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
        "MASTER_ADDR": "n1", "MASTER_PORT": "20042",
    })  # fmt: skip
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (5, 8, 1, 2)
    assert env.init_method == "tcp://n1:20042"


@pytest.mark.parametrize(
    ("environ", "message"),
    [({}, "neither RANK"), ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "NODE_RANK": "0"}, "no rendezvous"),
     ({"SLURM_PROCID": "0"}, "SLURM_NTASKS is not set")],
)  # fmt: skip
def test_rank_env_errors_name_what_is_missing(environ, message):
    with pytest.raises(DdlbenchError, match=message):
        rank_env(environ)


def test_srun_command_asks_for_the_points_geometry(tmp_path):
    point = make_point(nodes=2, ranks_per_node=4, threads=3)
    command = SrunLauncher({}).command(point, rank_dir=tmp_path, dump_params=None)
    assert command[:5] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=3"]
    assert command[command.index("--spec") + 1] == point.to_json()  # an argv element: no shell, no quoting


def test_master_port_is_shared_by_a_job_and_differs_between_jobs():
    assert slurm_master_port("123") == slurm_master_port("123")
    assert slurm_master_port("123") != slurm_master_port("124")
    assert 1024 < slurm_master_port("99999999") < 65536


def test_auto_picks_srun_only_inside_an_allocation(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert isinstance(select_launcher("auto", {"SLURM_JOB_ID": "7"}), SrunLauncher)
    assert isinstance(select_launcher("auto", {}), LocalLauncher)
    with pytest.raises(DdlbenchError, match="accepted: auto, local, srun, mpirun"):
        select_launcher("torchrun", {})


def test_the_ranks_srun_step_keeps_job_wide_slurm_variables_only():
    from ddlbench.launch.launchers import step_environment

    inherited = {
        "PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CONF": "/etc/slurm.conf",
        "SLURM_MEM_PER_NODE": "2000", "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_NTASKS_PER_GPU": "1", "SLURM_TRES_PER_TASK": "cpu:1", "SLURM_CPUS_PER_TASK": "4",
        "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0", "SLURM_CPU_BIND": "cores", "SLURM_DISTRIBUTION": "cyclic",
    }  # fmt: skip
    assert step_environment(inherited) == {
        "PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CONF": "/etc/slurm.conf",
        "SLURM_MEM_PER_NODE": "2000", "SLURM_ARRAY_TASK_ID": "3",
    }  # fmt: skip


def test_a_rank_without_cuda_trains_on_the_cpu_and_records_the_gpus_slurm_made_visible():
    import torch

    from ddlbench.launch.devices import gpu_identity, rank_device

    if torch.cuda.is_available():
        pytest.skip("CPU path; tests/test_gpu.py covers CUDA")
    device, backend = rank_device(1, 2, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert (device.type, backend) == ("cpu", "gloo")
    assert gpu_identity(device, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {"visible": "0,1"}
    assert gpu_identity(device, {}) == {"visible": None}
