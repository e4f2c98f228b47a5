"""The point → SLURM allocation mapping (golden), site settings, pre-submission checks, and parsing of
what SLURM prints. Pure: no cluster needed; the real cluster is in test_slurm_cluster.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_point

from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch.profile import MARKER, ProfileOptions, write_profile
from ddlbench.launch.resources import (
    LAUNCHER_MEM_MB,
    Site,
    resources_for,
    site_from_mapping,
    snakemake_resources,
    submitit_parameters,
)
from ddlbench.launch.slurm import (
    ClusterFacts,
    Partition,
    QueuedJob,
    check_resources,
    parse_allocation,
    parse_config,
    parse_nodes,
    parse_partitions,
    parse_queue,
    parse_time_min,
)
from ddlbench.launch.status import sweep_status
from ddlbench.sweep import plan_sweep
from ddlbench.train.faults import delay_s, planned_fault, stretch

SITE = Site(partition="gpu", account="proj42", gpus_per_rank=1, mem_per_rank_mb=8000, time_margin_s=300)


def test_resources_of_a_multi_node_point_golden():
    point = make_point(nodes=4, ranks_per_node=4, threads=8, timeout_s=900)
    resources = resources_for(point, SITE)
    assert resources.ntasks == 16
    assert resources.mem_per_node_mb == 4 * 8000 + LAUNCHER_MEM_MB
    assert resources.time_min == 20  # (900 + 300) s
    assert resources.time_limit == "0-00:20:00"
    assert snakemake_resources(resources) == {
        "slurm_partition": "gpu",
        "slurm_account": "proj42",
        "nodes": 4,
        "cpus_per_task": 8,
        "mem_mb": 32768,
        "runtime": 20,
        "mpi": "srun",
        "tasks": 0,
        "tasks_per_node": 4,
        "gres": "gpu:4",
        "tasks_per_gpu": 0,  # never --ntasks-per-gpu: every rank of a node sees the node's GPUs
        "slurm_extra": "--exclusive",
    }
    assert submitit_parameters(resources) == {
        "slurm_partition": "gpu",
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": 8,
        "slurm_mem": "32768M",
        "timeout_min": 20,
        "slurm_signal_delay_s": 90,
        "slurm_srun_args": ["--ntasks=1", "--nodes=1"],
        "slurm_additional_parameters": {"nodes": 4, "ntasks_per_node": 4, "account": "proj42"},
        "gpus_per_node": 4,
        "slurm_exclusive": True,
    }


def test_one_rank_and_one_rank_per_node_points_keep_the_same_resource_keys():
    site = Site(partition="cpu", mem_per_rank_mb=1000, time_margin_s=60)
    single = snakemake_resources(resources_for(make_point(timeout_s=61), site))
    spread = snakemake_resources(resources_for(make_point(nodes=3, timeout_s=61), site))
    assert single.keys() == spread.keys()  # Snakemake needs one set of keys per rule
    assert (single["mpi"], single["tasks"], single["tasks_per_node"]) == ("", 1, 0)
    assert (spread["mpi"], spread["tasks"], spread["tasks_per_node"]) == ("srun", 3, 0)
    assert single["runtime"] == 3  # 121 s rounds up to whole minutes


def test_sweep_settings_and_rerun_factors_change_the_allocation_not_the_point():
    point = make_point(timeout_s=600)
    resources = resources_for(point, SITE, partition="big", mem_per_rank_mb=100, mem_factor=2, time_factor=2)
    assert resources.partition == "big"
    assert resources.mem_per_node_mb == 200 + LAUNCHER_MEM_MB
    assert resources.time_min == 25  # (2 × 600 + 300) s
    assert resources_for(point, SITE).signal_delay_s == 90
    assert resources_for(point, Site(partition="p", time_margin_s=30, mem_per_rank_mb=100)).signal_delay_s == 15


def test_a_pinned_point_asks_for_its_node_and_waits_its_turn_only_when_asked():
    pinned = make_point(node="n2")
    one_at_a_time = resources_for(pinned, SITE, pinned_one_at_a_time=True)
    extra = "--exclusive --nodelist=n2 --dependency=singleton"  # SITE asks for whole nodes
    assert snakemake_resources(one_at_a_time)["slurm_extra"] == extra
    assert snakemake_resources(resources_for(pinned, SITE))["slurm_extra"] == "--exclusive --nodelist=n2"
    extra = submitit_parameters(one_at_a_time)["slurm_additional_parameters"]
    assert extra["nodelist"] == "n2" and extra["dependency"] == "singleton"
    # only pinned points wait: the sweep's other points are submitted as always
    unpinned = resources_for(make_point(), SITE, pinned_one_at_a_time=True)
    assert snakemake_resources(unpinned)["slurm_extra"] == "--exclusive"
    with pytest.raises(ConfigError, match="not a node name"):
        snakemake_resources(resources_for(make_point(node="n1; rm -rf /"), SITE))


@pytest.mark.parametrize(
    ("raw", "key", "fragment"),
    [
        ({}, "partition", "must name the SLURM partition"),
        ({"partition": "p", "gpus": 1}, "gpus", "unknown site setting"),
        ({"partition": "p", "mem_per_rank_mb": "lots"}, "mem_per_rank_mb", "integer >= 16"),
        ({"partition": "p", "time_margin_s": -1}, "time_margin_s", "integer >= 0"),
        ({"partition": " "}, "partition", "not a name"),
        ({"partition": "p", "require_account": "yes"}, "require_account", "true or false"),
        ({"partition": "p", "exclusive": 1}, "exclusive", "true or false"),
        ({"partition": "p", "gpus_per_rank": 2}, "gpus_per_rank", "give 0 (CPU) or 1 (one GPU per rank)"),
    ],
)
def test_bad_site_settings_name_the_key(raw, key, fragment):
    with pytest.raises(ConfigError) as error:
        site_from_mapping(raw)
    assert error.value.key == key
    assert fragment in str(error.value)


PARTITIONS_TEXT = (
    "PartitionName=cpu AllowGroups=ALL Default=YES MaxTime=02:00:00 Nodes=n[1-4] State=UP TotalCPUs=8 TotalNodes=4\n"
    "PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=1-00:00:00 Nodes=g[1-2] State=UP TotalNodes=2\n"
    "PartitionName=debug MaxTime=UNLIMITED TotalNodes=1 State=DOWN\n"
)


def test_partitions_and_times_are_parsed():
    partitions = parse_partitions(PARTITIONS_TEXT)
    assert partitions["cpu"] == Partition(name="cpu", total_nodes=4, max_time_min=120, state="UP")
    assert partitions["gpu"].max_time_min == 24 * 60
    assert partitions["debug"].max_time_min is None
    assert [parse_time_min(t) for t in ("30", "5:00", "1:00:01", "2-03", "2-03:04:00", "INFINITE")] == [
        30,
        5,
        61,
        2 * 1440 + 180,
        2 * 1440 + 184,
        None,
    ]


NODES_TEXT = "\n".join(
    f"NodeName=n{i} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 CPULoad=0.1 AvailableFeatures=(null) "
    f"Gres=gpu:2 NodeAddr=127.0.0.1 RealMemory=5514 AllocMem=0 FreeMem=9000 Sockets=2 State={state} "
    "Partitions=cpu,gpu BootTime=2026-11-22T15:49:22 CfgTRES=cpu=2,mem=5514M,billing=2"
    for i, state in enumerate(["IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN"], start=1)
)
FACTS = ClusterFacts(
    partitions=parse_partitions(PARTITIONS_TEXT), nodes=parse_nodes(NODES_TEXT), def_mem_per_cpu_mb=1000
)
FITS = {"partition": "cpu", "mem_per_rank_mb": 1000}


def test_nodes_config_and_memory_defaults_are_parsed():
    nodes = parse_nodes(
        NODES_TEXT + "\nNodeName=g1 CPUTot=64 RealMemory=512000 MemSpecLimit=2048 "
        "Gres=gpu:a100:4(S:0-1),gpu:a10:2 State=DOWN+NOT_RESPONDING Partitions=gpu"
    )
    assert (nodes["n1"].cpus, nodes["n1"].memory_mb, nodes["n1"].gpus, nodes["n1"].partitions) == (
        2, 5514, 2, ("cpu", "gpu"),
    )  # fmt: skip
    assert (nodes["g1"].memory_mb, nodes["g1"].gpus) == (512000 - 2048, 6)
    assert [node.usable for node in nodes.values()] == [True, True, True, False, False]
    assert parse_config("DefMemPerCPU            = 1000\nAccountingStorageEnforce = associations,limits\n") == {
        "DefMemPerCPU": "1000", "AccountingStorageEnforce": "associations,limits",
    }  # fmt: skip
    gpu = parse_partitions(
        "PartitionName=gpu State=UP TotalNodes=2 JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=65536 "
        "DefMemPerNode=UNLIMITED MaxMemPerNode=262144"
    )["gpu"]
    assert (gpu.def_mem_per_gpu_mb, gpu.def_mem_per_node_mb, gpu.max_mem_per_node_mb) == (65536, None, 262144)
    defaults = FACTS.memory_defaults("cpu")  # the partition sets nothing: the cluster's DefMemPerCPU
    assert (defaults.per_cpu_mb, defaults.smallest_node_mb) == (1000, 5514)


def test_default_memory_comes_from_the_partition_and_fits_a_two_by_two_sweep():
    site = Site(partition="cpu")  # what `ddlbench profile slurm --partition cpu` writes
    for point in (make_point(nodes=n, ranks_per_node=r, threads=1) for n in (1, 2) for r in (1, 2)):
        resources = resources_for(point, site, memory_defaults=FACTS.memory_defaults("cpu"))
        assert resources.mem_per_node_mb == 1000 * point.ranks_per_node + LAUNCHER_MEM_MB
        assert "DefMemPerCPU" in resources.mem_source
        check_resources([(point.point_id, resources)], FACTS)
    gpu = ClusterFacts(
        partitions={"g": Partition(name="g", total_nodes=1, max_time_min=None, state="UP", def_mem_per_gpu_mb=9000)},
        nodes={},
    )
    point = make_point(ranks_per_node=4)
    per_gpu = resources_for(point, Site(partition="g", gpus_per_rank=1), memory_defaults=gpu.memory_defaults("g"))
    assert per_gpu.mem_per_node_mb == 4 * 9000 + LAUNCHER_MEM_MB
    bare = Partition(name="h", total_nodes=1, max_time_min=None, state="UP")
    no_defaults = ClusterFacts(
        partitions={"h": bare}, nodes=parse_nodes("NodeName=x CPUTot=8 RealMemory=16768 Partitions=h")
    )
    shared = resources_for(point, Site(partition="h"), memory_defaults=no_defaults.memory_defaults("h"))
    assert shared.mem_per_node_mb <= 16768  # the node's memory shared by its 4 ranks and the launcher
    assert shared.mem_per_node_mb == (16768 - LAUNCHER_MEM_MB) // 4 * 4 + LAUNCHER_MEM_MB
    with pytest.raises(ConfigError, match="mem_per_rank_mb"):
        resources_for(point, Site(partition="h"))  # no defaults known: refused, never a made-up figure


@pytest.mark.parametrize(
    ("point_kw", "site_kw", "facts_kw", "fragment"),
    [
        ({}, {"partition": "gpux"}, {}, "partition 'gpux' does not exist; partitions of this cluster: cpu, debug, gpu"),
        ({}, {"partition": "debug"}, {}, "partition 'debug' is DOWN, not UP"),
        ({"nodes": 8}, {}, {}, "needs 8 nodes, but partition 'cpu' has 4"),
        ({"timeout_s": 3 * 3600}, {}, {}, "is over the 120 min that partition 'cpu' allows"),
        ({}, {}, {"account_required": True}, "requires an account and none is set"),
        ({"ranks_per_node": 3}, {}, {}, "needs 3 CPUs per node, but the nodes of partition 'cpu' have at most 2"),
        ({"ranks_per_node": 1, "threads": 1, "loader_workers": 2}, {}, {}, "needs 3 CPUs per node"),
        (
            {"ranks_per_node": 2},
            {"mem_per_rank_mb": 4096},
            {},
            "needs 8960 MB of memory per node (4096 MB per rank from the site's mem_per_rank_mb, plus the launcher's "
            "share), but the nodes of partition 'cpu' have at most 5514",
        ),
        ({"ranks_per_node": 2}, {"gpus_per_rank": 2}, {}, "gpus_per_rank"),
        ({"nodes": 4}, {}, {}, "only 3 of the 4 nodes of partition 'cpu' that have them take jobs (n4 IDLE+DRAIN)"),
    ],
)
def test_points_the_cluster_would_refuse_are_refused_before_submission(point_kw, site_kw, facts_kw, fragment):
    import dataclasses

    point = make_point(**point_kw)
    with pytest.raises((DdlbenchError, ConfigError)) as error:
        planned = [(point.point_id, resources_for(point, site_from_mapping(FITS | site_kw)))]
        check_resources(planned, dataclasses.replace(FACTS, **facts_kw))
    assert fragment in str(error.value)
    if not isinstance(error.value, ConfigError):
        assert f"point {point.point_id}:" in str(error.value)
        assert "\n" not in str(error.value)


def test_gpu_requests_are_checked_against_the_nodes_gres():
    site = Site(partition="gpu", gpus_per_rank=1, mem_per_rank_mb=1000)
    two = make_point(nodes=2, ranks_per_node=2)
    check_resources([(two.point_id, resources_for(two, site))], FACTS)  # 2 GPUs on each of n1..n3
    three = make_point(nodes=1, ranks_per_node=3, threads=1, oversubscribe=True)
    facts = dataclasses_replace_nodes(FACTS, cpus=8)
    with pytest.raises(DdlbenchError, match="needs 3 GPUs per node, but the nodes of partition 'gpu' have at most 2"):
        check_resources([(three.point_id, resources_for(three, site))], facts)


def dataclasses_replace_nodes(facts: ClusterFacts, **changes) -> ClusterFacts:
    import dataclasses

    return dataclasses.replace(
        facts, nodes={name: dataclasses.replace(node, **changes) for name, node in facts.nodes.items()}
    )


def test_a_point_that_fits_passes_the_checks():
    point = make_point(nodes=3, timeout_s=3600)
    site = Site(partition="cpu", account="a", time_margin_s=300, mem_per_rank_mb=1000)
    check_resources([(point.point_id, resources_for(point, site))], FACTS)


def test_allocation_is_read_from_scontrol():
    line = (
        "JobId=57 ArrayJobId=50 ArrayTaskId=3 JobName=x UserId=root(0) Restarts=1 Partition=gpu "
        "NodeList=g[1-2] NumNodes=2 NumCPUs=16 NumTasks=8 AllocTRES=cpu=16,mem=64G,node=2,gres/gpu=8 Comment=x y"
    )
    job = parse_allocation("57", line)
    assert (job.job_id, job.array_job_id, job.array_task_id) == ("57", "50", "3")
    assert (job.partition, job.node_list, job.num_nodes, job.num_cpus, job.num_gpus, job.restarts) == (
        "gpu",
        "g[1-2]",
        2,
        16,
        8,
        1,
    )
    plain = parse_allocation("9", "JobId=9 Partition=cpu NodeList=n1 NumNodes=1 NumCPUs=2 AllocTRES=cpu=2")
    assert (plain.array_job_id, plain.num_gpus, plain.restarts, plain.exclusive) == (None, 0, 0, None)
    assert parse_allocation("9", "JobId=9 OverSubscribe=NO").exclusive is True
    assert parse_allocation("9", "JobId=9 OverSubscribe=OK").exclusive is False


def test_status_joins_records_and_the_queue(tmp_path):
    from ddlbench.launch.runner import write_unfinished_record

    plan = plan_sweep(
        {"models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2, 3, 4],
         "results_dir": str(tmp_path)}
    )  # fmt: skip
    p1, p2, p3, p4 = plan.points
    sweep_dir = plan.config.sweep_dir
    write_unfinished_record(p1, out=sweep_dir / "points" / p1.point_id / "record.json", status="oom", reason="big")
    queue = parse_queue(
        f"101|RUNNING|uuid|acc|normal|rule_run_point_wildcards_{p2.point_id}\n77_1|PENDING|ddlbench-x|acc|normal|\n"
        "5|RUNNING|other|acc|normal|\n"
    )
    assert queue[1] == QueuedJob(
        job_id="77_1", state="PENDING", name="ddlbench-x", comment="", account="acc", qos="normal"
    )
    statuses = sweep_status(plan, queue=queue, jobs_index={p3.point_id: ["77_1"]}, sweep_dir=sweep_dir)
    by_id = {status.point_id: status for status in statuses}
    assert (by_id[p1.point_id].state, by_id[p1.point_id].reason) == ("oom", "big")
    assert (by_id[p2.point_id].state, by_id[p2.point_id].job_ids) == ("running", ("101",))
    assert (by_id[p3.point_id].state, by_id[p3.point_id].job_ids) == ("pending", ("77_1",))
    assert by_id[p4.point_id].state == "not started"


def test_profile_is_written_where_snakemake_looks_and_refuses_a_foreign_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    site = Site(partition="gpu's", account="a b")  # quoting: values never reach YAML raw
    config = write_profile(site, ProfileOptions(jobs=7, status_wait_s=3))
    assert config == tmp_path / "snakemake" / "slurm" / "config.yaml"
    profile = yaml.safe_load(config.read_text())
    assert profile["executor"] == "slurm"
    assert profile["jobs"] == 7
    assert profile["slurm-init-seconds-before-status-checks"] == 3
    assert profile["default-resources"] == {"slurm_partition": "gpu's", "slurm_account": "a b", "mem_mb": 1000,
                                            "runtime": 30}  # fmt: skip
    site_file = config.parent / "ddlbench-site.yaml"
    assert profile["config"] == [f"slurm_site={site_file}"]
    assert site_from_mapping(yaml.safe_load(site_file.read_text())) == site
    config.write_text("executor: slurm\n")  # someone else's profile
    with pytest.raises(DdlbenchError, match="was not written by ddlbench"):
        write_profile(site, ProfileOptions())
    assert MARKER in write_profile(site, ProfileOptions(), force=True).read_text()


def test_faults_can_target_points_and_first_runs_only():
    env = {"DDLBENCH_INJECT_FAULT": "raise@-n1x1-,hang~first@-n2x1-"}
    assert planned_fault("m-d-s-n1x1-b8", env) == "raise"
    assert planned_fault("m-d-s-n2x1-b8", env) == "hang"
    assert planned_fault("m-d-s-n2x1-b8", env | {"SLURM_RESTART_COUNT": "1"}) is None
    assert planned_fault("m-d-s-n4x1-b8", env) is None
    with pytest.raises(ValueError, match="unknown fault 'hang~later'"):
        planned_fault("x", {"DDLBENCH_INJECT_FAULT": "hang~later"})


@pytest.mark.parametrize("bad", ["slower:", "slower:-0.3", "slower:nan", "slower:x", "slow:0"])
def test_a_slowdown_in_proportion_is_planned_as_its_fraction_and_a_bad_one_is_refused(bad):
    planned = planned_fault("m-d-s-n1x1-b8", {"DDLBENCH_INJECT_FAULT": "slower:0.3@n1x1"})
    assert planned == "slower:0.3" and stretch(planned) == 0.3 and delay_s(planned) == 0.0
    assert stretch("slow:0.3") == 0.0 and stretch(None) == 0.0
    with pytest.raises(ValueError, match=f"unknown fault '{bad}'.*slower:<fraction>"):
        planned_fault("x", {"DDLBENCH_INJECT_FAULT": bad})


def test_the_lost_fault_exits_the_job_once_and_leaves_a_marker(tmp_path):
    import os
    import subprocess
    import sys

    code = "import sys; from pathlib import Path; from ddlbench.train.faults import lose_job_once; " \
        "lose_job_once(sys.argv[1], Path(sys.argv[2])); print('ran')"  # fmt: skip
    env = {**os.environ, "DDLBENCH_INJECT_FAULT": "lost@-r1-"}
    folder = tmp_path / "points" / "p-r1-x"

    def job(point_id: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", code, point_id, str(folder)], env=env, capture_output=True, text=True
        )

    other = job("p-r0-x")  # not targeted
    assert (other.returncode, other.stdout.strip()) == (0, "ran")
    first, second = job("p-r1-x"), job("p-r1-x")
    assert (first.returncode, first.stdout) == (1, "") and "lost before the point ran" in first.stderr
    assert (folder / "lost.struck").exists()
    assert (second.returncode, second.stdout.strip()) == (0, "ran")


def test_the_default_profile_leaves_memory_to_the_partition_and_asks_for_whole_nodes(tmp_path):
    from conftest import run_cli

    from ddlbench.launch.resources import load_site

    # no SLURM on PATH: the profile is written without reading limits, whatever state a cluster here is in
    # (a stopped controller would keep scontrol retrying for a minute a call)
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent)}
    assert run_cli("profile", "slurm", "--partition", "cpu", env=env).returncode == 0
    site = load_site(tmp_path / "snakemake" / "slurm" / "ddlbench-site.yaml")
    assert (site.mem_per_rank_mb, site.exclusive) == (None, True)
    shared = run_cli("profile", "slurm", "--partition", "cpu", "--no-exclusive", "--mem-per-rank-mb", "2000", env=env)
    assert shared.returncode == 0, shared.stderr
    site = load_site(tmp_path / "snakemake" / "slurm" / "ddlbench-site.yaml")
    assert (site.mem_per_rank_mb, site.exclusive) == (2000, False)
    resources = resources_for(make_point(), site)
    assert snakemake_resources(resources)["slurm_extra"] == ""
    assert "slurm_exclusive" not in submitit_parameters(resources)
