"""Where a rank runs: one GPU per rank bound by SLURM (the srun options, and the rank's rule for its
device), ranks sharing a GPU only with `share_gpus`, the rank's CPUs on its GPU's NUMA node, and the
site's network variables. CPU-only: torch.cuda is stood in for where the rule needs GPUs, /sys is a
folder of the test's own; tests/test_slurm_gpu.py checks the binding on the real SLURM cluster and
tests/test_gpu.py on CUDA."""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

import pytest
import torch

from ddlbench.config import sweep_config_from_mapping
from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch import devices
from ddlbench.launch.launchers import LocalLauncher, SrunLauncher
from ddlbench.launch.mpi import MpiPlan, MpirunLauncher
from ddlbench.launch.placement import (
    GPU_BIND_VAR,
    LAUNCH_VAR,
    NETWORK_ENV_NAMES,
    LaunchSettings,
    check_gpu_bind,
    check_network_env,
    launch_settings,
    network_env_seen,
    pass_on,
)
from ddlbench.launch.resources import Site, resources_for, site_from_mapping, snakemake_resources
from ddlbench.sweep import expand_sweep
from tests.conftest import make_point

# --- the rank's device ---------------------------------------------------------------------------------


@pytest.fixture
def gpus(monkeypatch):
    """torch.cuda with `count` GPUs visible; the device set current is kept in `chosen`."""
    chosen: list[torch.device] = []

    def visible(count: int) -> list[torch.device]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        return chosen

    return visible


def test_a_rank_slurm_bound_to_one_gpu_takes_the_one_it_sees(gpus):
    chosen = gpus(1)
    bound = {"CUDA_VISIBLE_DEVICES": "1", GPU_BIND_VAR: "single:1"}
    assert devices.rank_device(1, 2, bound) == (torch.device("cuda", 0), "nccl")
    assert chosen == [torch.device("cuda", 0)]


def test_a_rank_that_sees_all_of_its_hosts_gpus_takes_its_local_ranks(gpus):
    gpus(4)
    for environ in ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, {GPU_BIND_VAR: "none"}, {}):
        assert devices.rank_device(2, 4, environ) == (torch.device("cuda", 2), "nccl")
    # more GPUs than ranks: still its local rank's
    assert devices.rank_device(1, 2, {}) == (torch.device("cuda", 1), "nccl")


def test_fewer_gpus_than_ranks_are_refused_naming_them_and_the_ways_out(gpus):
    gpus(1)
    with pytest.raises(DdlbenchError) as refused:
        devices.rank_device(1, 2, {"CUDA_VISIBLE_DEVICES": "0"})
    message = str(refused.value)
    assert "2 ranks on this host need one GPU each, but 1 are visible to local rank 1" in message
    assert "CUDA_VISIBLE_DEVICES='0'" in message and "`share_gpus: true`" in message and "fewer ranks" in message
    # a binding that leaves several GPUs to a task (closest, on a NUMA node) is named, with a better one
    gpus(2)
    with pytest.raises(DdlbenchError, match=r"bound by srun --gpu-bind=closest\); .*gpu_bind .*single:1"):
        devices.rank_device(0, 4, {"CUDA_VISIBLE_DEVICES": "0,1", GPU_BIND_VAR: "closest"})
    with pytest.raises(DdlbenchError, match="CUDA_VISIBLE_DEVICES unset"):
        devices.rank_device(0, 4, {})


def test_ranks_asked_to_share_take_the_gpus_in_turn_over_gloo(gpus):
    chosen = gpus(2)
    taken = [devices.rank_device(rank, 5, {}, share_gpus=True) for rank in range(5)]
    assert taken == [(torch.device("cuda", rank % 2), "gloo") for rank in range(5)]
    assert chosen == [torch.device("cuda", rank % 2) for rank in range(5)]
    # enough GPUs: sharing asked for, but none happens
    assert devices.rank_device(1, 2, {}, share_gpus=True) == (torch.device("cuda", 1), "nccl")


def test_without_cuda_a_rank_trains_on_the_cpu_over_gloo(gpus):
    gpus(0)
    assert devices.rank_device(1, 2, {GPU_BIND_VAR: "single:1"}) == (torch.device("cpu"), "gloo")


# --- ranks that land on one GPU all the same --------------------------------------------------------------


_CURRENT = threading.local()


def _settle(keys: dict[tuple[str, int], str], *, share_gpus: bool, backend: str = "nccl"):
    """Every rank of `keys` ((host, local rank) -> its GPU) settling its backend through one store, each in a
    thread as each rank is a process; rank → (backend, shared_with) or the exception it raised."""
    store = torch.distributed.HashStore()
    hosts = sorted({host for host, _ in keys})
    per_host = {host: sum(1 for h, _ in keys if h == host) for host in hosts}
    results: dict[tuple[str, int], object] = {}

    def rank(host: str, local: int) -> None:
        _CURRENT.host = host  # each thread stands for one rank on `host`
        try:
            results[host, local] = devices.settle_backend(
                store, torch.device("cuda", local), backend, host=host, local_rank=local,
                local_ranks=per_host[host], world_size=len(keys), share_gpus=share_gpus,
            )  # fmt: skip
        except DdlbenchError as exc:
            results[host, local] = exc

    threads = [threading.Thread(target=rank, args=key) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.fixture
def keyed(monkeypatch):
    """device_key from a table (host, local rank) -> GPU UUID, as each rank's GPU would name itself."""

    def use(table: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
        monkeypatch.setattr(devices, "device_key", lambda device: table[_CURRENT.host, device.index])
        return table

    return use


def test_ranks_on_distinct_gpus_keep_nccl(keyed):
    table = keyed({("n1", 0): "GPU-a", ("n1", 1): "GPU-b", ("n2", 0): "GPU-c", ("n2", 1): "GPU-d"})
    assert list(_settle(table, share_gpus=False).values()) == [("nccl", [])] * 4


def test_two_ranks_on_one_gpu_are_refused_on_every_rank_unless_the_sweep_shares(keyed):
    # a binding that named one GPU twice on n1 (map_gpu:0); n2 is fine, but its ranks stop too
    table = keyed({("n1", 0): "GPU-a", ("n1", 1): "GPU-a", ("n2", 0): "GPU-c", ("n2", 1): "GPU-d"})
    refused = _settle(table, share_gpus=False)
    assert all(isinstance(result, DdlbenchError) for result in refused.values()), refused
    assert "local ranks 0, 1 of n1 are all on GPU-a" in str(refused["n1", 0])
    assert "ranks of another host share one GPU" in str(refused["n2", 0])
    assert "`share_gpus: true`" in str(refused["n2", 1])
    shared = _settle(table, share_gpus=True)
    # every rank of the job meets over gloo, the sharing ones say with whom
    assert shared == {
        ("n1", 0): ("gloo", [1]), ("n1", 1): ("gloo", [0]), ("n2", 0): ("gloo", []), ("n2", 1): ("gloo", []),
    }  # fmt: skip


def test_off_cuda_nothing_is_exchanged():
    store = torch.distributed.HashStore()
    settled = devices.settle_backend(
        store, torch.device("cpu"), "gloo", host="h", local_rank=0, local_ranks=2, world_size=2, share_gpus=False
    )
    assert settled == ("gloo", []) and store.num_keys() == 0


# --- the rank's CPUs on its GPU's NUMA node ------------------------------------------------------------


@pytest.fixture
def sys_pci(tmp_path, monkeypatch):
    """A /sys/bus/pci/devices of the test's own: device(name, numa_node, local_cpulist)."""
    monkeypatch.setattr(devices, "SYS_PCI_DEVICES", tmp_path)

    def device(name: str, numa_node: str, local_cpulist: str | None) -> None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "numa_node").write_text(numa_node + "\n")
        if local_cpulist is not None:
            (folder / "local_cpulist").write_text(local_cpulist + "\n")

    return device


def test_the_gpus_numa_node_and_local_cpus_are_read_from_sys(sys_pci):
    sys_pci("0000:3b:00.0", "1", "16-31,48-63")
    assert devices.sysfs_name("00000000:3B:00.0") == "0000:3b:00.0"
    numa_node, local = devices.gpu_numa("00000000:3B:00.0")
    assert numa_node == 1 and local == (*range(16, 32), *range(48, 64))
    # as measured on an H200 VM: no NUMA information
    sys_pci("0000:00:06.0", "-1", "0-15")
    assert devices.gpu_numa("00000000:00:06.0") == (None, tuple(range(16)))
    assert devices.gpu_numa("00000000:99:00.0") == (None, None)  # no such device


def _aligned(current: set[int], numa_node, local, needed: int) -> tuple[str, set[int] | None]:
    moved: list[set[int]] = []
    note = devices.align_cpus(numa_node, local, needed, affinity=lambda: current, set_affinity=moved.append)
    return note, (moved[0] if moved else None)


def test_a_rank_moves_onto_its_gpus_numa_node_only_where_that_leaves_it_enough_cpus():
    local = tuple(range(8, 16))
    note, moved = _aligned(set(range(16)), 1, local, 4)
    assert moved == set(range(8, 16)) and note == "restricted to the 8 of its 16 CPUs local to the GPU (NUMA node 1)"
    assert _aligned(set(range(8, 12)), 1, local, 4) == ("already on the GPU's NUMA node 1", None)
    note, moved = _aligned({6, 7, 8}, 1, local, 2)
    assert moved is None and "1 of the rank's 3 CPUs are local to the GPU (NUMA node 1), fewer than its 2" in note
    note, moved = _aligned({0, 1}, 1, local, 1)
    assert moved is None and "none of the rank's 2 CPUs is local to the GPU" in note
    note, moved = _aligned(set(range(16)), None, tuple(range(16)), 1)
    assert moved is None and "no NUMA information" in note


def test_a_rank_really_restricts_its_affinity():
    before = os.sched_getaffinity(0)
    first = min(before)
    try:
        note = devices.align_cpus(0, (first,), 1)
        assert os.sched_getaffinity(0) == ({first} if len(before) > 1 else before)
        assert note.startswith("restricted to the 1 of its") or note.startswith("already on")
    finally:
        os.sched_setaffinity(0, before)


def test_the_gpu_record_carries_its_numa_node_local_cpus_and_what_the_rank_did(sys_pci, monkeypatch):
    sys_pci("0000:c1:00.0", "3", "48-63")
    properties = SimpleNamespace(name="Fake H100", uuid="1234-abcd", pci_domain_id=0, pci_bus_id=0xC1, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    environ = {"CUDA_VISIBLE_DEVICES": "5", GPU_BIND_VAR: "single:1"}
    identity = devices.gpu_identity(torch.device("cuda", 0), environ, cpu_alignment="already on", shared_with=[])
    assert identity == {
        "visible": "5", "bind": "single:1", "index": 0, "name": "Fake H100", "uuid": "GPU-1234-abcd",
        "pci_bus_id": "00000000:C1:00.0", "numa_node": 3, "local_cpus": list(range(48, 64)),
        "cpu_alignment": "already on", "shared_with": [],
    }  # fmt: skip
    assert devices.place_on_gpu_numa_node(torch.device("cpu"), 1) == ""


# --- the site's settings: gpu_bind and network_env --------------------------------------------------------


ACCEPTED_BINDS = ["closest", "single:1", "per_task:1", "map_gpu:0,1", "map_gpu:0*2", "mask_gpu:0x1,0x2", "none"]


@pytest.mark.parametrize("value", [*ACCEPTED_BINDS, "verbose,closest"])
def test_accepted_gpu_binds(value):
    assert check_gpu_bind(value) == value
    assert site_from_mapping({"partition": "gpu", "gpus_per_rank": 1, "gpu_bind": value}).gpu_bind == value


@pytest.mark.parametrize("value", ["nearest", "single:0", "map_gpu:", "map_gpu:a", "closest; rm -rf /", 1, None])
def test_a_gpu_bind_srun_would_not_take_is_refused_naming_the_key_and_the_choices(value):
    with pytest.raises(ConfigError, match=r"^gpu_bind: .* is not accepted; choose one of closest, single:N, per_task"):
        site_from_mapping({"partition": "gpu", "gpu_bind": value})


def test_network_env_takes_known_names_and_one_line_values():
    assert check_network_env({"NCCL_IB_DISABLE": 1, "NCCL_SOCKET_IFNAME": "ib0,ib1"}) == {
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ib0,ib1",
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"^network_env.LD_PRELOAD: 'LD_PRELOAD' is not a network variable .*"
                                          r"accepted: NCCL_SOCKET_IFNAME, .*GLOO_SOCKET_IFNAME"):  # fmt: skip
        site_from_mapping({"partition": "gpu", "network_env": {"LD_PRELOAD": "x.so"}})
    for bad in (True, None, ["ib0"], "", "ib0\nexport X=1"):
        with pytest.raises(ConfigError, match=r"^network_env.NCCL_SOCKET_IFNAME: .* is not accepted"):
            check_network_env({"NCCL_SOCKET_IFNAME": bad})
    with pytest.raises(ConfigError, match="not a mapping"):
        check_network_env(["NCCL_DEBUG=INFO"])


def test_the_site_file_round_trips_its_launch_settings(tmp_path):
    from ddlbench.launch.profile import ProfileOptions, write_profile
    from ddlbench.launch.resources import load_site

    site = site_from_mapping(
        {"partition": "gpu", "gpus_per_rank": 1, "gpu_bind": "map_gpu:1,0", "network_env": {"NCCL_DEBUG": "WARN"}}
    )
    write_profile(site, ProfileOptions(), directory=tmp_path)
    assert load_site(tmp_path / "ddlbench-site.yaml") == site
    assert Site(partition="p").gpu_bind == "single:1" and Site(partition="p").network_env == {}


def test_the_command_line_adds_network_variables_and_a_binding_to_the_sites():
    import argparse

    from ddlbench.cli import slurm

    args = argparse.Namespace(**dict.fromkeys(slurm.SITE_OPTIONS), require_account=False, network_env=None)
    args.gpu_bind, args.network_env = "per_task:1", ["NCCL_IB_HCA=mlx5_0:1", "NCCL_DEBUG=INFO=x"]
    assert slurm._site_overrides(args) == {
        "gpu_bind": "per_task:1", "network_env": {"NCCL_IB_HCA": "mlx5_0:1", "NCCL_DEBUG": "INFO=x"},
    }  # fmt: skip
    args.network_env = ["NCCL_DEBUG"]
    with pytest.raises(DdlbenchError, match="give NAME=VALUE"):
        slurm._site_overrides(args)


def test_launch_settings_travel_in_the_environment(monkeypatch):
    monkeypatch.delenv(LAUNCH_VAR, raising=False)
    assert launch_settings(os.environ) == LaunchSettings()
    site = site_from_mapping({"partition": "gpu", "gpus_per_rank": 1, "network_env": {"GLOO_SOCKET_IFNAME": "eth0"}})
    pass_on(site)
    settings = launch_settings(os.environ)
    network = (("GLOO_SOCKET_IFNAME", "eth0"),)
    assert settings == LaunchSettings(gpus_per_rank=1, gpu_bind="single:1", network_env=network)
    assert json.loads(os.environ[LAUNCH_VAR]) == {
        "gpu_bind": "single:1", "gpus_per_rank": 1, "network_env": {"GLOO_SOCKET_IFNAME": "eth0"},
    }  # fmt: skip
    with pytest.raises(DdlbenchError, match=f"{LAUNCH_VAR} is not the launch settings of a site: gpu_bind"):
        launch_settings({LAUNCH_VAR: json.dumps({"gpu_bind": "--help"})})


# --- the launchers -------------------------------------------------------------------------------------


def _json(site: dict) -> str:
    from ddlbench.launch.placement import settings_of

    return settings_of(site_from_mapping({"partition": "gpu", **site})).to_json()


def test_the_srun_step_binds_one_gpu_to_each_task_where_the_site_asks_for_gpus(tmp_path):
    point = make_point(nodes=2, ranks_per_node=2, threads=3)
    environ = {LAUNCH_VAR: _json({"gpus_per_rank": 1, "network_env": {"NCCL_IB_DISABLE": 1}})}
    launcher = SrunLauncher(environ)
    command = launcher.command(point, rank_dir=tmp_path, dump_params=None)
    assert command[:8] == [
        "srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=3",
        "--gpus-per-task=1", "--gpu-bind=single:1", "--overlap",
    ]  # fmt: skip
    assert launcher.step_env(point) == {"NCCL_IB_DISABLE": "1", GPU_BIND_VAR: "single:1"}
    mapped = SrunLauncher({LAUNCH_VAR: _json({"gpus_per_rank": 1, "gpu_bind": "map_gpu:1,0"})})
    assert "--gpu-bind=map_gpu:1,0" in mapped.command(point, rank_dir=tmp_path, dump_params=None)
    # no GPUs asked for, or ranks that may share them: no binding, nothing said to the ranks
    for launcher, shared in ((SrunLauncher({LAUNCH_VAR: _json({})}), False), (SrunLauncher({}), False),
                             (SrunLauncher(environ), True)):  # fmt: skip
        shaped = make_point(nodes=2, ranks_per_node=2, share_gpus=shared)
        assert not any("gpu" in word for word in launcher.command(shaped, rank_dir=tmp_path, dump_params=None)[:9])
        assert GPU_BIND_VAR not in launcher.step_env(shaped)


def test_open_mpi_ranks_get_the_sites_network_variables_by_name(tmp_path):
    point = make_point(nodes=2, ranks_per_node=2)
    launcher = MpirunLauncher({"PATH": "/bin", LAUNCH_VAR: _json({"network_env": {"NCCL_SOCKET_IFNAME": "ib0"}})})
    env = launcher.rank_environment(point, claimed=None)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    plan = MpiPlan(executable="mpirun", flavour="openmpi", hosts=("n1", "n2"), on_this_host=False)
    command = launcher.command(point, plan, env, rank_dir=tmp_path, dump_params=None)
    assert "NCCL_SOCKET_IFNAME" in {command[i + 1] for i, word in enumerate(command) if word == "-x"}
    assert "ib0" not in command


def test_local_ranks_get_the_sites_network_variables_and_record_them(tmp_path, monkeypatch):
    """A real local point: the site's variables reach the ranks (gloo uses GLOO_SOCKET_IFNAME=lo), and each
    rank records the network variables it saw, only those."""
    from ddlbench.launch.runner import run_point

    monkeypatch.setenv(LAUNCH_VAR, _json({"network_env": {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"}}))
    monkeypatch.setenv(GPU_BIND_VAR, "single:1")  # a stray binding never reaches local ranks
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, on a GPU host too
    record = run_point(make_point(ranks_per_node=2), out=tmp_path / "record.json", launcher=LocalLauncher().name)
    assert record.status == "ok", record.reason
    assert [rank.network_env for rank in record.ranks] == [{"NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "lo"}] * 2
    assert all("bind" not in rank.gpu for rank in record.ranks)
    assert network_env_seen({"NCCL_DEBUG": "INFO", "PATH": "/bin"}) == {"NCCL_DEBUG": "INFO"}
    assert len(set(NETWORK_ENV_NAMES)) == len(NETWORK_ENV_NAMES)


# --- share_gpus: sweep → point → allocation ------------------------------------------------------------


def test_share_gpus_is_a_sweep_option_that_reaches_the_points_and_their_allocation():
    base = {"name": "s", "models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1],
            "ranks_per_node": [4]}  # fmt: skip
    (plain,) = expand_sweep(sweep_config_from_mapping(base)).points
    (shared,) = expand_sweep(sweep_config_from_mapping(base | {"share_gpus": True})).points
    assert not plain.share_gpus and shared.share_gpus
    assert "share_gpus" not in plain.to_dict() and "-sharedgpu" not in plain.point_id  # ids of old points stand
    assert "-sharedgpu-" in shared.point_id and shared.point_id != plain.point_id
    site = Site(partition="gpu", gpus_per_rank=1, mem_per_rank_mb=1000)
    assert resources_for(plain, site).gpus_per_node == 4
    # the node's ranks share what the job gets: one GPU asked for, all of them with --exclusive
    assert resources_for(shared, site).gpus_per_node == 1
    assert snakemake_resources(resources_for(shared, site))["gres"] == "gpu:1"
    with pytest.raises(ConfigError, match="share_gpus"):
        sweep_config_from_mapping(base | {"share_gpus": "yes"})


def test_inside_an_allocation_the_profiles_site_is_passed_on_and_gpus_only_where_it_holds_some(tmp_path, monkeypatch):
    from ddlbench.launch import inside, profile, slurm
    from ddlbench.launch.profile import ProfileOptions, write_profile

    site = site_from_mapping({"partition": "gpu", "gpus_per_rank": 1, "network_env": {"NCCL_DEBUG": "INFO"}})
    write_profile(site, ProfileOptions(), directory=tmp_path)
    monkeypatch.setattr(profile, "default_site_file", lambda: tmp_path / "ddlbench-site.yaml")
    monkeypatch.delenv(LAUNCH_VAR, raising=False)
    for gpus, bound in ((2, 1), (0, 0)):
        monkeypatch.setattr(
            slurm, "current_allocation", lambda environ, gpus=gpus: SimpleNamespace(job_id="7", num_gpus=gpus)
        )
        os.environ.pop(LAUNCH_VAR, None)
        inside.pass_on_profile_site()
        settings = launch_settings(os.environ)
        assert (settings.gpus_per_rank, settings.network_env) == (bound, (("NCCL_DEBUG", "INFO"),))
    os.environ[LAUNCH_VAR] = LaunchSettings().to_json()  # passed on by the submission: kept
    inside.pass_on_profile_site()
    assert launch_settings(os.environ) == LaunchSettings()
